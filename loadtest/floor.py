"""What one Python event loop can serve on this machine, whatever the server does.

    python -m loadtest.floor [--seconds 5] [--spins 0,20,50,100] [--file-mib 256]

A minimal uvloop server answers each ``Range`` request with one ``pread`` of the
file and one ``writev`` (the spoke's warm hit, minus everything a cache decides),
after busy-spinning ``--spin-us`` of Python work. It is measured with the bench's
wrk script, 64 KiB × 64 connections, once per spin, and the table shows what each
microsecond of Python per request costs in requests/s and in p99: the ceiling and
the latency a single-process spoke can reach, measured instead of guessed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys
import tempfile
import time

from loadtest.bench import run_wrk
from loadtest.procs import start_process

RANGE = re.compile(rb"\r\nRange: bytes=(\d+)-(\d+)", re.IGNORECASE)
CONNS = 64
RANGE_BYTES = 64 << 10


class FloorProtocol(asyncio.Protocol):
    """One connection: answer each request's single range from the file, in order."""

    def __init__(self, fd: int, size: int, spin_s: float) -> None:
        self.fd, self.size, self.spin_s = fd, size, spin_s
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            if self.spin_s:
                _busy(self.spin_s)
            self._answer(head)

    def _answer(self, head: bytes) -> None:
        assert self.transport is not None
        match = RANGE.search(head)
        if match is None or int(match[1]) >= self.size:
            self.transport.write(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n")
            return
        start, stop = int(match[1]), min(int(match[2]) + 1, self.size)
        body = os.pread(self.fd, stop - start, start)
        self.transport.writelines([
            f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{stop - 1}/"
            f"{self.size}\r\nContent-Length: {len(body)}\r\n\r\n".encode(), body,
        ])


def _busy(seconds: float) -> None:
    """Hold the CPU for ``seconds``, as a request's Python work would."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        continue


async def serve(host: str, port: int, path: str, spin_s: float) -> None:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorProtocol(fd, size, spin_s), host, port)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://{host}:{bound}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def measure(path: str, size: int, spins_us: list[int], seconds: float) -> list[dict[str, float]]:
    rows = []
    for spin in spins_us:
        server = start_process("loadtest.floor", ["--file", path, "--spin-us", str(spin)])
        try:
            run = run_wrk("floor", "64KiB", f"{server.url}/floor", "random_range.lua",
                          [str(size), str(RANGE_BYTES), str(RANGE_BYTES), "1"], CONNS, seconds,
                          1, server.pid)
        finally:
            server.stop()
        rows.append({"spin_us": spin, "req_s": run.req_s, "p50_ms": run.p50_ms,
                     "p99_ms": run.p99_ms, "server_cores": run.server_cores,
                     "wrk_cores": run.wrk_cores, "errors": run.errors})
    return rows


def render(rows: list[dict[str, float]]) -> str:
    lines = ["| Python per request | req/s | p50 ms | p99 ms | server cores | wrk cores |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['spin_us']:.0f} µs | {r['req_s']:,.0f} | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['server_cores']:.2f} | {r['wrk_cores']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        p = argparse.ArgumentParser(prog="python -m loadtest.floor serve")
        p.add_argument("--file", required=True)
        p.add_argument("--spin-us", type=int, default=0)
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=0)
        o = p.parse_args(args[1:])
        import uvloop

        uvloop.run(serve(o.host, o.port, o.file, o.spin_us / 1e6))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="wrk seconds per spin")
    parser.add_argument("--spins", default="0,20,50,100",
                        help="µs of Python work per request, comma-separated")
    parser.add_argument("--file-mib", type=int, default=256, help="size of the file read")
    o = parser.parse_args(args)
    size = o.file_mib << 20
    with tempfile.NamedTemporaryFile(prefix="hubspoke-floor-") as f:
        for _ in range(o.file_mib):
            f.write(os.urandom(1 << 20))
        f.flush()
        rows = measure(f.name, size, [int(s) for s in o.spins.split(",")], o.seconds)
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
