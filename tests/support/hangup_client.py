"""A loader that hangs up the moment it has its answer, in a process of its own.

``python -m tests.support.hangup_client URL TARGET RANGE ROUNDS CLOSED [KEEP]``: each
round opens a connection, sends one ``GET TARGET`` with ``Range: RANGE`` and
``Connection: close``, reads the head and exactly ``Content-Length`` bytes (or only the
first ``KEEP``), and closes at once, before the server's own close; then counts the
round in the file ``CLOSED``. Prints each round's status and body bytes, a line each.

A process of its own: its reading never waits for the test process's interpreter,
which a test may keep busy on purpose (tests/integration/test_hangups.py).
"""

from __future__ import annotations

import mmap
import socket
import struct
import sys

TIMEOUT_S = 30.0
# The file the rounds closed so far are counted in (a little-endian u64), mapped: the
# test reads it without a system call.
CLOSED_BYTES = 8


def one_round(
    host: str, port: int, target: str, byte_range: str, keep: int | None
) -> tuple[int, int]:
    """(status, body bytes) of one answer read whole (or its first ``keep`` bytes), the
    connection then closed."""
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: {host}\r\nRange: {byte_range}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        data = bytearray()
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                raise ConnectionError("closed before the head was whole")
            data += got
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:])}
        length = int(fields.get("content-length", "0"))
        if keep is not None:
            length = min(length, keep)
        received = len(body)
        while received < length:
            got = sock.recv(min(1 << 20, length - received))
            if not got:
                break
            received += len(got)
        return int(lines[0].split()[1]), received


def main(argv: list[str]) -> None:
    url, target, byte_range, rounds, closed_path, *cut = argv
    host, port = url.removeprefix("http://").split(":")
    keep = int(cut[0]) if cut else None
    with open(closed_path, "r+b") as f, mmap.mmap(f.fileno(), CLOSED_BYTES) as closed:
        for done in range(1, int(rounds) + 1):
            status, received = one_round(host, int(port), target, byte_range, keep)
            closed[:CLOSED_BYTES] = struct.pack("<Q", done)
            print(status, received, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
