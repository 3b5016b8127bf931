"""The simulator's ARC and W-TinyLFU against libCacheSim's, on the simulator's traces.

libCacheSim (PyPI ``libcachesim``, a test dependency) is the reference the policy issue
measured against. ARC is compared with unit sizes (every chunk one unit, the capacity in
chunks): that is the paper's setting, where the adaptation step ``delta`` is a ratio of
ghost-list lengths, and where rounding it to an integer shows::

    python -m loadtest.sim_crosscheck            # ARC and W-TinyLFU, quick traces
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import libcachesim  # type: ignore[import-not-found, unused-ignore]

from loadtest.crosscheck_s3fifo import libcachesim_hits
from loadtest.simulate import Req, Scenario, build, loop_trace, scenarios, simulate
from spoke.policy import ARCPolicy, EvictionPolicy, WTinyLFUPolicy

__all__ = ["arc_difference", "main", "unit_sized"]


def unit_sized(trace: Sequence[Req]) -> list[Req]:
    """``trace`` with every request one unit in size."""
    return [Req(r.key, 1, r.job) for r in trace]


def arc_difference(
    scenario: Scenario, fraction: float,
    factory: Callable[[int], EvictionPolicy[Any]] = ARCPolicy,
) -> tuple[float, float]:
    """(ours, libCacheSim's) ARC hit ratio on ``scenario`` in unit sizes, the cache
    ``fraction`` of the distinct keys read by planned (non-scan) jobs."""
    built = build(scenario)
    trace = unit_sized(built.trace)
    keys = len({r.key for r in trace if not r.job.startswith("scan")})
    capacity = int(keys * fraction)
    counted = len(trace) - built.warmup
    ours = simulate(factory, trace, capacity, warmup=built.warmup).hit_ratio
    theirs = libcachesim_hits(libcachesim.ARC, trace, capacity, built.warmup) / counted
    return ours, theirs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.sim_crosscheck")
    parser.add_argument("--full", action="store_true", help="the full simulator traces")
    args = parser.parse_args(argv)
    print("| trace | cache | ARC % | libCacheSim ARC % | diff pp |")
    print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for scenario in scenarios(quick=not args.full):
        if scenario.kind not in ("epochs", "scan", "jobs", "zipf"):
            continue
        for fraction in scenario.capacities:
            ours, theirs = arc_difference(scenario, fraction)
            worst = max(worst, abs(ours - theirs))
            print(f"| {scenario.label} | {100 * fraction:.0f} % | {100 * ours:.2f} "
                  f"| {100 * theirs:.2f} | {100 * (ours - theirs):+.2f} |")
    print(f"largest |ARC - libCacheSim ARC|: {100 * worst:.2f} pp")
    print()
    print("| loop | cache | W-TinyLFU % | libCacheSim WTinyLFU % |")
    print("|---|---:|---:|---:|")
    for n in (2_000,):
        trace = loop_trace(n, 5)
        for fraction in (0.05, 0.1):
            capacity = int(n * fraction)
            ours = simulate(WTinyLFUPolicy, unit_sized(trace), capacity, warmup=n).hit_ratio
            theirs = libcachesim_hits(libcachesim.WTinyLFU, unit_sized(trace), capacity, n)
            print(f"| {n} x 5 | {100 * fraction:.0f} % | {100 * ours:.2f} "
                  f"| {100 * theirs / (len(trace) - n):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
