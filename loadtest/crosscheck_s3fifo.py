"""Cross-check spoke.policy.S3FIFOPolicy against libCacheSim's S3FIFO, the reference.

libCacheSim is the S3-FIFO paper's authors' simulator, so its ``S3FIFO`` is the published
behaviour. This replays the simulator's traces (same keys as object ids, same sizes, same
capacity in bytes, same warm-up) through

* the project's ``S3FIFOPolicy``, driven by :func:`loadtest.simulate.simulate`;
* ``libcachesim.S3FIFO`` (PyPI ``libcachesim``, the Python bindings of libCacheSim, with
  its defaults: small queue 10 %, ghost 90 %, move-to-main threshold 2);
* LRU in both, as a control: the two harnesses must agree exactly there, or the
  comparison itself is broken;

prints a Markdown table of hit ratios (by requests) and the differences in percentage
points, and with ``--max-diff PP`` exits 1 when any S3-FIFO difference exceeds PP or the
LRU control differs at all (tests/loadtest/test_crosscheck_s3fifo.py runs it so).

libcachesim is one of the project's test dependencies::

    python -m loadtest.crosscheck_s3fifo [--full] [--max-diff 1]

(``--full`` uses the traces of ``python -m loadtest.simulate``, the default those of
``--quick``.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import libcachesim  # type: ignore[import-not-found, unused-ignore]

from loadtest.simulate import Req, build, scenarios, simulate
from spoke.policy import LRUPolicy, S3FIFOPolicy


def libcachesim_hits(cls: Any, trace: Sequence[Req], capacity: int, warmup: int) -> int:
    """Hits after ``warmup`` of a libCacheSim cache ``cls(capacity)`` over ``trace``."""
    cache = cls(capacity, hashpower=20)
    hits = 0
    for index, (key, size, _) in enumerate(trace):
        request = libcachesim.Request()
        request.obj_id = key
        request.obj_size = size
        request.clock_time = index
        hit = cache.get(request)
        if index >= warmup:
            hits += bool(hit)
    return hits


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.crosscheck_s3fifo")
    parser.add_argument("--full", action="store_true", help="the full simulator traces")
    parser.add_argument(
        "--max-diff",
        type=float,
        default=None,
        metavar="PP",
        help="exit 1 if S3-FIFO differs by more than PP points, or LRU differs at all",
    )
    args = parser.parse_args(argv)
    print(
        "| trace | cache | requests | S3FIFOPolicy % | libCacheSim S3FIFO % | diff pp "
        "| LRU diff pp |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    lru_worst = 0.0
    for scenario in scenarios(quick=not args.full):
        built = build(scenario)
        counted = len(built.trace) - built.warmup
        for fraction in scenario.capacities:
            capacity = int(built.dataset_bytes * fraction)
            ours = simulate(S3FIFOPolicy, built.trace, capacity, warmup=built.warmup).hits
            theirs = libcachesim_hits(libcachesim.S3FIFO, built.trace, capacity, built.warmup)
            lru_ours = simulate(LRUPolicy, built.trace, capacity, warmup=built.warmup).hits
            lru_theirs = libcachesim_hits(libcachesim.LRU, built.trace, capacity, built.warmup)
            diff = 100 * (ours - theirs) / counted
            lru_diff = 100 * (lru_ours - lru_theirs) / counted
            worst = max(worst, abs(diff))
            lru_worst = max(lru_worst, abs(lru_diff))
            print(
                f"| {scenario.label} | {100 * fraction:.0f} % | {counted} "
                f"| {100 * ours / counted:.2f} | {100 * theirs / counted:.2f} | {diff:+.2f} "
                f"| {lru_diff:+.2f} |"
            )
    print()
    print(f"largest |S3FIFOPolicy - libCacheSim S3FIFO|: {worst:.2f} pp")
    print(f"largest |LRUPolicy - libCacheSim LRU|: {lru_worst:.2f} pp")
    if args.max_diff is not None and (worst > args.max_diff or lru_worst > 0):
        print(f"FAIL: over {args.max_diff} pp, or the LRU control disagrees")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
