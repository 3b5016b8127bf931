"""One spoke process against several on the same warm cache: ``python -m loadtest.bench_workers``.

    python -m loadtest.bench_workers [--workers auto] [--rounds 3] [--seconds 5] [--file-mib 1024]

A hub over a generated file (no WAN: only warm reads are measured), a spoke cache
directory warmed once, then the spoke restarted on it alternately with ``--workers 1``
and ``--workers N``, rounds interleaved, each measured with the bench's wrk scripts:
64 KiB × 64 connections and 32 × 64 KiB batches × 16 connections. Prints a Markdown
table of medians and the ratio: what the reader workers (:mod:`spoke.workers.pool`) add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import urllib.request

from loadtest.bench import run_wrk, wrk_binary
from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.procs import Process

MiB = 1 << 20
SAMPLE = 64 << 10
CELLS = {  # name: (script, extra args, connections, samples per request)
    "64 KiB x 64 conns": ("random_range.lua", [str(SAMPLE)], 64, 1),
    "32 x 64 KiB batches x 16 conns": ("multi_range.lua", [str(SAMPLE), "32"], 16, 32),
}


def start_spoke(lab: Lab, hub: Process, cache_dir: str, size: int, workers: str) -> Process:
    return lab.spoke(hub.url, cache_dir, "--capacity", str(2 * size),
                     "--access-log", "off", "--log-level", "warning", "--workers", workers)


def warm(spoke: Process, path: str, size: int) -> None:
    step = 64 * MiB
    for offset in range(0, size, step):
        stop = min(size, offset + step)
        request = urllib.request.Request(
            f"{spoke.url}/objects/{path}", headers={"Range": f"bytes={offset}-{stop - 1}"})
        received = 0
        with urllib.request.urlopen(request, timeout=120) as reply:
            while block := reply.read(MiB):
                received += len(block)
        if received != stop - offset:
            raise RuntimeError(f"warming {path}: {received} bytes at {offset}, not {stop - offset}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="auto", help="the multi-process side's --workers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--file-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    if wrk_binary() is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    size = args.file_mib * MiB
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with Lab() as lab:
        work = lab.temp_dir("hubspoke-workers-")
        big = generate(os.path.join(work, "data"), 1, size, prefix="big")[0]
        cache_dir = os.path.join(work, "cache")
        hub = lab.hub(os.path.join(work, "data"), "--access-log", "off", "--log-level", "warning")
        spoke = start_spoke(lab, hub, cache_dir, size, "1")
        try:
            warm(spoke, big.path, size)
        finally:
            lab.stop(spoke)
        for rnd in range(args.rounds):
            sides = ["1", args.workers] if rnd % 2 == 0 else [args.workers, "1"]
            for workers in sides:
                spoke = start_spoke(lab, hub, cache_dir, size, workers)
                try:
                    for cell, (script, extra, conns, per) in CELLS.items():
                        run = run_wrk(f"workers {workers}", cell, f"{spoke.url}/objects/"
                                      f"{big.path}", script, [str(size), *extra, str(rnd + 1)],
                                      conns, args.seconds, per, spoke.pid)
                        results.setdefault((cell, workers), []).append(
                            (run.samples_s, run.p99_ms))
                        print(f"round {rnd + 1} --workers {workers:>4} {cell}: "
                              f"{run.samples_s:,.0f} samples/s, p99 {run.p99_ms:.1f} ms, "
                              f"errors {run.errors}", file=sys.stderr, flush=True)
                finally:
                    lab.stop(spoke)
    print(render(results, args.workers))
    return 0


def render(results: dict[tuple[str, str], list[tuple[float, float]]], workers: str) -> str:
    lines = [f"| test | --workers 1 samples/s | p99 ms | --workers {workers} samples/s | p99 ms "
             "| ratio |", "|---|---|---|---|---|---|"]
    for cell in CELLS:
        one, many = results[(cell, "1")], results[(cell, workers)]
        a, b = statistics.median(r[0] for r in one), statistics.median(r[0] for r in many)
        lines.append(f"| {cell} | {a:,.0f} | {statistics.median(r[1] for r in one):.1f} | "
                     f"{b:,.0f} | {statistics.median(r[1] for r in many):.1f} | {b / a:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
