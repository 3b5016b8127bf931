"""Spoke memory: index bytes per cached chunk, RSS per connection.

    python -m loadtest.bench_memory [--quick] [--out report.json]

Two measurements, all on 127.0.0.1, bounded in time:

1. **The index, per cached chunk.** For each size (default 20,000 and 100,000 chunks)
   :func:`loadtest.bench_restart.build` makes a cache directory of that many chunk files
   with their index rows; a fresh child process then opens a :class:`spoke.cache.engine.ChunkCache`
   on it the way :func:`loadtest.bench_restart.reopen` does and reports

   * the Python heap the open cache holds (``tracemalloc``, before and after
     ``await cache.open()``, after ``gc.collect()``), in one child;
   * the RSS it adds (``VmRSS``, read with psutil), in another child without
     ``tracemalloc`` (whose own book-keeping would inflate RSS), also after
     ``malloc_trim(0)`` hands freed heap back to the kernel;
   * the bytes of the SQLite index on disk (``index.sqlite3`` and its ``-wal``/``-shm``).

   Two sizes show the cost per chunk is a constant: memory grows with the number of
   chunks cached, not with the bytes cached (a chunk is 4 MiB in production, 4 KiB here).

2. **RSS against connections.** A real hub and spoke (``python -m hub|spoke serve``) over
   a small generated dataset, warmed; then 0 / 250 / 500 / 1000 kept-alive connections,
   each having read one 64 KiB range (206) and then idle, with the spoke's ``VmRSS``
   (psutil) at each step; then all closed, and 1 GiB of cached 4 MiB range
   reads over 16 connections, twice, with the spoke's RSS before, during (peak) and after.

It prints Markdown tables and, with ``--out FILE``, writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import itertools
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from loadtest.bench_restart import CHUNK_BYTES, build
from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.meter import memory, open_sockets
from loadtest.procs import REPO
from protocol.headers import CACHE_HEADER

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
INDEX_FILE = "index.sqlite3"  # spoke/cache/index.py's file name
CHILD_TIMEOUT_S = 300


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    mode: str
    index_sizes: tuple[int, ...]
    connection_steps: tuple[int, ...]
    shards: int
    shard_bytes: int
    read_requests: int  # per pass
    read_conns: int
    read_passes: int
    small_range: int = 64 * KiB
    big_range: int = 4 * MiB
    settle_s: float = 0.5
    policy: str = "arc"

    @property
    def read_bytes(self) -> int:
        return self.read_requests * self.big_range


FULL = Settings(
    mode="full", index_sizes=(20_000, 100_000), connection_steps=(0, 250, 500, 1000),
    shards=4, shard_bytes=64 * MiB, read_requests=256, read_conns=16, read_passes=2,
)
QUICK = Settings(
    mode="quick", index_sizes=(1_000, 2_000), connection_steps=(0, 25, 50),
    shards=2, shard_bytes=8 * MiB, read_requests=16, read_conns=4, read_passes=2,
    settle_s=0.2,
)


# --------------------------------------------------------------------------- memory


def malloc_trim() -> bool:
    """Give glibc's free heap back to the kernel (False where there is no glibc)."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def raise_nofile(needed: int) -> int:
    """Raise our soft RLIMIT_NOFILE towards ``needed`` (children inherit it); the result."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


# --------------------------------------------------------------------------- 1. the index


async def _open_and_measure(cache_dir: str, policy: str, heap: bool) -> dict[str, Any]:
    """In a fresh process: what opening the cache of ``cache_dir`` adds to memory.

    The cache is built like :func:`loadtest.bench_restart.reopen` builds it, but kept
    open while it is measured.
    """
    from spoke.cache.clock import SYSTEM_CLOCK
    from spoke.cache.engine import ChunkCache
    from spoke.cache.index import ChunkIndex
    from spoke.cache.store import ChunkStore
    from spoke.policy import DEFAULT_ADMISSION, make_policy
    from spoke.upstream.hub import HubClient

    hub = HubClient("http://127.0.0.1:9", connect_timeout_s=1, read_timeout_s=1,
                    max_connections=1)
    cache = ChunkCache(store=ChunkStore(cache_dir), index=ChunkIndex(cache_dir),
                       policy=make_policy(policy, 1 << 40, DEFAULT_ADMISSION), hub=hub,
                       clock=SYSTEM_CLOCK, capacity_bytes=1 << 40, meta_ttl_s=5,
                       fetch_concurrency=1)
    # Warm the thread the index lives on, so its stack is not counted as the index's.
    await asyncio.get_running_loop().run_in_executor(cache.db.executor, lambda: None)
    if heap:
        tracemalloc.start()
    gc.collect()
    before_rss = memory().rss
    before = tracemalloc.take_snapshot() if heap else None
    before_heap = tracemalloc.get_traced_memory()[0] if heap else 0
    took = await cache.open()
    gc.collect()
    result: dict[str, Any] = {"chunks": len(cache.policy), "open_s": took}
    if heap:
        result["heap_bytes"] = tracemalloc.get_traced_memory()[0] - before_heap
        assert before is not None
        diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
        result["heap_top"] = [
            {"where": str(stat.traceback[0]), "bytes": stat.size_diff, "blocks": stat.count_diff}
            for stat in sorted(diff, key=lambda s: -s.size_diff)[:8]
        ]
        tracemalloc.stop()
    else:
        result["rss_bytes"] = memory().rss - before_rss
        result["rss_trimmed_bytes"] = (
            memory().rss - before_rss if malloc_trim() else None
        )
    await cache.close()
    return result


def _child(cache_dir: str, policy: str, heap: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "loadtest.bench_memory", "--measure-index", cache_dir,
            "--policy", policy]
    if heap:
        argv.append("--heap")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"index measurement failed:\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def sqlite_files(cache_dir: str) -> dict[str, int]:
    return {name: os.path.getsize(os.path.join(cache_dir, name))
            for name in sorted(os.listdir(cache_dir))
            if name in (INDEX_FILE, f"{INDEX_FILE}-wal", f"{INDEX_FILE}-shm")}


def measure_index(settings: Settings, work: str) -> dict[str, Any]:
    sizes = []
    for chunks in settings.index_sizes:
        cache_dir = os.path.join(work, f"cache-{chunks}")
        os.makedirs(cache_dir)
        t0 = time.perf_counter()
        build(cache_dir, chunks)
        built_s = time.perf_counter() - t0
        rss = _child(cache_dir, settings.policy, heap=False)
        heap = _child(cache_dir, settings.policy, heap=True)
        files = sqlite_files(cache_dir)
        for got in (rss["chunks"], heap["chunks"]):
            if got != chunks:
                raise RuntimeError(f"the cache opened {got} chunks, not {chunks}")
        disk = sum(files.values())
        sizes.append({
            "chunks": chunks,
            "built_s": round(built_s, 2),
            "open_s": round(rss["open_s"], 3),
            "heap_bytes": heap["heap_bytes"],
            "heap_bytes_per_chunk": heap["heap_bytes"] / chunks,
            "rss_bytes": rss["rss_bytes"],
            "rss_bytes_per_chunk": rss["rss_bytes"] / chunks,
            "rss_trimmed_bytes": rss["rss_trimmed_bytes"],
            "rss_trimmed_bytes_per_chunk": (None if rss["rss_trimmed_bytes"] is None
                                            else rss["rss_trimmed_bytes"] / chunks),
            "sqlite_bytes": disk,
            "sqlite_bytes_per_chunk": disk / chunks,
            "sqlite_files": files,
            "heap_top": heap["heap_top"],
        })
        shutil.rmtree(cache_dir, ignore_errors=True)
    out: dict[str, Any] = {"chunk_file_bytes": CHUNK_BYTES, "policy": settings.policy,
                           "sizes": sizes}
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        n = hi["chunks"] - lo["chunks"]
        # The cost of each chunk added between the two sizes: constants cancel out.
        out["marginal"] = {
            key: None if hi[key] is None or lo[key] is None else (hi[key] - lo[key]) / n
            for key in ("heap_bytes", "rss_bytes", "rss_trimmed_bytes", "sqlite_bytes")
        }
        out["heap_per_chunk_ratio"] = hi["heap_bytes_per_chunk"] / lo["heap_bytes_per_chunk"]
    return out


# --------------------------------------------------------------------------- 2. connections


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def get(self, path: str, start: int, length: int) -> tuple[int, int, str]:
        """One ranged GET on this kept-alive connection: (status, body bytes, X-Cache)."""
        self.writer.write(
            f"GET /objects/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Range: bytes={start}-{start + length - 1}\r\n\r\n".encode()
        )
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"no Content-Length in the answer: {lines[0]} {headers}")
        remaining = int(headers["content-length"])
        got = 0
        while remaining:
            block = await self.reader.read(min(remaining, MiB))
            if not block:
                raise ConnectionError("the spoke closed the connection mid-body")
            got += len(block)
            remaining -= len(block)
        return status, got, headers.get(CACHE_HEADER.lower(), "")

    def close(self) -> None:
        self.writer.close()


async def connect(host: str, port: int) -> Conn:
    reader, writer = await asyncio.open_connection(host, port)
    return Conn(reader, writer)


async def close_all(conns: list[Conn]) -> None:
    for conn in conns:
        conn.close()
    for conn in conns:
        with contextlib.suppress(OSError, ConnectionError):
            await conn.writer.wait_closed()
    conns.clear()


@dataclass
class Served:
    root: str
    objects: list[tuple[str, int]]  # (path, size)
    host: str
    port: int
    pid: int


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as reply:
        data: dict[str, Any] = json.loads(reply.read())
        return data


async def warm(served: Served, settings: Settings) -> None:
    """Read every object once through the spoke, so every later read is a hit."""
    conn = await connect(served.host, served.port)
    try:
        for path, size in served.objects:
            for start in range(0, size, settings.big_range):
                length = min(settings.big_range, size - start)
                status, got, _ = await conn.get(path, start, length)
                if status != 206 or got != length:
                    raise RuntimeError(f"warming {path}@{start}: {status}, {got} bytes")
    finally:
        await close_all([conn])


async def open_idle(served: Served, settings: Settings, count: int, conns: list[Conn],
                    statuses: Counter[int], rng: random.Random) -> None:
    """Open ``count`` more connections; each reads one small range and then stays idle."""
    gate = asyncio.Semaphore(64)

    async def one() -> None:
        async with gate:
            conn = await connect(served.host, served.port)
            conns.append(conn)
            path, size = rng.choice(served.objects)
            start = rng.randrange(0, size - settings.small_range + 1)
            status, got, _ = await conn.get(path, start, settings.small_range)
            statuses[status] += 1
            if got != settings.small_range:
                raise RuntimeError(f"{path}@{start}: {got} bytes, not {settings.small_range}")

    async with asyncio.TaskGroup() as group:
        for _ in range(count):
            group.create_task(one())


async def stream_reads(served: Served, settings: Settings, rng: random.Random
                       ) -> dict[str, Any]:
    """``read_requests`` cached reads of ``big_range`` over ``read_conns`` connections."""
    todo = []
    for _ in range(settings.read_requests):
        path, size = rng.choice(served.objects)
        start = rng.randrange(0, (size - settings.big_range) // 4096 + 1) * 4096
        todo.append((path, start))
    statuses: Counter[int] = Counter()
    x_cache: Counter[str] = Counter()
    total = 0
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, memory(served.pid).rss)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.02)

    async def worker() -> None:
        nonlocal total
        conn = await connect(served.host, served.port)
        try:
            while todo:
                path, start = todo.pop()
                status, got, hit = await conn.get(path, start, settings.big_range)
                statuses[status] += 1
                x_cache[hit] += 1
                total += got
        finally:
            await close_all([conn])

    sampler = asyncio.create_task(sample())
    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(settings.read_conns):
                group.create_task(worker())
    finally:
        done.set()
        await sampler
    seconds = time.perf_counter() - t0
    return {"requests": sum(statuses.values()), "bytes": total, "seconds": round(seconds, 3),
            "gb_s": total / seconds / 1e9, "statuses": dict(statuses),
            "x_cache": dict(x_cache), "rss_peak": peak}


async def measure_connections(served: Served, settings: Settings) -> dict[str, Any]:
    rng = random.Random(42)
    await warm(served, settings)
    conns: list[Conn] = []
    statuses: Counter[int] = Counter()
    steps: list[dict[str, Any]] = []
    try:
        for target in settings.connection_steps:
            await open_idle(served, settings, target - len(conns), conns, statuses, rng)
            await asyncio.sleep(settings.settle_s)
            mem = memory(served.pid)
            steps.append({"connections": len(conns), "spoke_sockets": open_sockets(served.pid),
                          "vmrss": mem.rss, "rssanon": mem.anon, "rssfile": mem.file})
    finally:
        await close_all(conns)
    base = steps[0]["vmrss"]
    for prev, step in itertools.pairwise(steps):
        added = step["connections"] - prev["connections"]
        step["kib_per_added_connection"] = (
            (step["vmrss"] - prev["vmrss"]) / added / KiB if added else None
        )
    most = steps[-1]
    per_conn = ((most["vmrss"] - base) / most["connections"] / KiB
                if most["connections"] else None)
    await asyncio.sleep(settings.settle_s)
    after_close = memory(served.pid).rss

    hub_before = _stats_hub_bytes(served)
    passes = []
    rss_before_reads = memory(served.pid).rss
    for _ in range(settings.read_passes):
        run = await stream_reads(served, settings, rng)
        await asyncio.sleep(settings.settle_s)
        run["rss_after"] = memory(served.pid).rss
        passes.append(run)
    hub_fetched = _stats_hub_bytes(served) - hub_before
    return {
        "steps": steps,
        "statuses": {str(k): v for k, v in statuses.items()},
        "all_206": statuses.get(206, 0) == settings.connection_steps[-1]
        and sum(statuses.values()) == settings.connection_steps[-1],
        "kib_per_connection": per_conn,
        "rss_after_closing": after_close,
        "reads": {
            "range_bytes": settings.big_range, "connections": settings.read_conns,
            "rss_before": rss_before_reads, "passes": passes,
            "hub_bytes_during_reads": hub_fetched,
        },
    }


def _stats_hub_bytes(served: Served) -> int:
    """Object bytes the spoke received from the hub so far (its /stats)."""
    return int(_stats(f"http://{served.host}:{served.port}")["hub_bytes"])


@contextlib.contextmanager
def servers(settings: Settings, work: str) -> Iterator[Served]:
    root = os.path.join(work, "hub-root")
    cache_dir = os.path.join(work, "spoke-cache")
    logs = os.path.join(work, "logs")
    for d in (root, cache_dir, logs):
        os.makedirs(d)
    shards = generate(root, settings.shards, settings.shard_bytes)
    data_bytes = sum(s.size for s in shards)
    with Lab(log_dir=logs) as lab:
        hub = lab.hub(root, "--access-log", "off", "--log-level", "warning")
        spoke = lab.spoke(hub.url, cache_dir, "--capacity", str(2 * data_bytes),
                          "--max-connections-per-client", "0", "--access-log", "off",
                          "--log-level", "warning")
        address = spoke.url.split("://", 1)[1].rstrip("/")
        host, _, port = address.rpartition(":")
        yield Served(root, [(s.path, s.size) for s in shards], host, int(port), spoke.pid)


# --------------------------------------------------------------------------- report


def _mib(n: int | float | None) -> str:
    return "–" if n is None else f"{n / MiB:,.1f} MiB"


def _num(n: int | float | None, digits: int = 0) -> str:
    return "–" if n is None else f"{n:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    idx, con = report["index"], report["connections"]
    out = [f"# Spoke memory ({report['settings']['mode']})", "",
           f"## Index, per cached chunk (policy {idx['policy']}; "
           f"chunk files of {idx['chunk_file_bytes']:,} bytes)", "",
           "| chunks | heap bytes/chunk | RSS bytes/chunk | RSS bytes/chunk (trimmed) "
           "| SQLite bytes/chunk | heap total | RSS total | SQLite total | open |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in idx["sizes"]:
        out.append(
            f"| {s['chunks']:,} | {_num(s['heap_bytes_per_chunk'])} "
            f"| {_num(s['rss_bytes_per_chunk'])} | {_num(s['rss_trimmed_bytes_per_chunk'])} "
            f"| {_num(s['sqlite_bytes_per_chunk'])} | {_mib(s['heap_bytes'])} "
            f"| {_mib(s['rss_bytes'])} | {_mib(s['sqlite_bytes'])} | {s['open_s']:.2f} s |")
    if "marginal" in idx:
        m = idx["marginal"]
        out.append(f"| marginal | {_num(m['heap_bytes'])} | {_num(m['rss_bytes'])} "
                   f"| {_num(m['rss_trimmed_bytes'])} | {_num(m['sqlite_bytes'])} | | | | |")
    biggest = idx["sizes"][-1]
    out += ["", f"Where the heap goes at {biggest['chunks']:,} chunks (tracemalloc, by line):", ""]
    for top in biggest["heap_top"][:5]:
        where = os.path.relpath(top["where"], REPO) if top["where"].startswith(REPO) else (
            top["where"])
        out.append(f"* `{where}`: {top['bytes'] / biggest['chunks']:,.0f} bytes/chunk "
                   f"({top['blocks'] / biggest['chunks']:.2f} blocks/chunk)")
    out += ["", "## Spoke RSS against open connections", "",
            "| idle connections | spoke sockets | VmRSS | RssAnon | KiB per added connection |",
            "|---:|---:|---:|---:|---:|"]
    for step in con["steps"]:
        out.append(f"| {step['connections']:,} | {step['spoke_sockets']:,} "
                   f"| {_mib(step['vmrss'])} | {_mib(step.get('rssanon'))} "
                   f"| {_num(step.get('kib_per_added_connection'), 1)} |")
    out += ["", f"KiB per connection overall: **{_num(con['kib_per_connection'], 1)}**; "
            f"every connection's 64 KiB read answered 206: **{con['all_206']}**; "
            f"VmRSS after closing them: {_mib(con['rss_after_closing'])}.", "",
            f"## Spoke RSS around cached reads ({con['reads']['connections']} connections, "
            f"{con['reads']['range_bytes'] // MiB} MiB ranges)", "",
            "| pass | bytes read | GB/s | peak VmRSS | VmRSS after |", "|---:|---:|---:|---:|---:|",
            f"| before | | | | {_mib(con['reads']['rss_before'])} |"]
    for i, run in enumerate(con["reads"]["passes"], 1):
        out.append(f"| {i} | {_mib(run['bytes'])} | {run['gb_s']:.2f} "
                   f"| {_mib(run['rss_peak'])} | {_mib(run['rss_after'])} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def run(settings: Settings) -> dict[str, Any]:
    raise_nofile(2 * max(settings.connection_steps) + 512)
    work = tempfile.mkdtemp(prefix="hubspoke-memory-")
    try:
        index = measure_index(settings, work)

        async def connections() -> dict[str, Any]:
            with servers(settings, work) as served:
                async with asyncio.timeout(300):
                    return await measure_connections(served, settings)

        con = asyncio.run(connections())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"settings": asdict(settings), "index": index, "connections": con}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for the tests")
    parser.add_argument("--out", metavar="FILE", help="write the figures as JSON here")
    parser.add_argument("--chunks", type=int, nargs="+",
                        help="index sizes in chunks (default: 20000 100000)")
    parser.add_argument("--connections", type=int, nargs="+",
                        help="idle connection steps (default: 0 250 500 1000)")
    parser.add_argument("--policy", default="arc")
    parser.add_argument("--measure-index", help=argparse.SUPPRESS)
    parser.add_argument("--heap", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_index:  # the child process of measure_index
        result = asyncio.run(_open_and_measure(args.measure_index, args.policy, args.heap))
        print(json.dumps(result))
        return
    # Stop the servers and remove the temp directory on SIGTERM too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = QUICK if args.quick else FULL
    changes: dict[str, Any] = {"policy": args.policy}
    if args.chunks:
        changes["index_sizes"] = tuple(args.chunks)
    if args.connections:
        changes["connection_steps"] = tuple(sorted({0, *args.connections}))
    settings = Settings(**{**asdict(settings), **changes})
    report = run(settings)
    print(render(report))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
