"""One-off: cross-check spoke.policy.S3FIFOPolicy against libCacheSim's S3FIFO.

Replays the simulator's traces (same keys as object ids, same sizes, same capacity in
bytes, same warm-up) through

* the project's ``S3FIFOPolicy``, driven by :func:`loadtest.simulate.simulate`;
* ``libcachesim.S3FIFO`` (PyPI ``libcachesim``, the Python bindings of libCacheSim, with
  its defaults: small queue 10 %, ghost 90 %, move-to-main threshold 2);
* ``LibCacheSimS3FIFO`` below: the project's class with libCacheSim's three documented
  departures from the paper's Algorithm 1 put back in (see its docstring);
* LRU in both, as a control: the two harnesses must agree exactly there.

and prints a Markdown table of hit ratios (by requests) and the differences in
percentage points. libcachesim is not a project dependency and must stay out of
pyproject.toml. It depends on boto3, whose botocore pins python-dateutil < 3, so
installing it into the project's venv would downgrade python-dateutil; use a
throwaway venv instead::

    python3.11 -m venv /tmp/lcs && /tmp/lcs/bin/pip install libcachesim
    PYTHONPATH=. /tmp/lcs/bin/python -m loadtest.crosscheck_s3fifo [--full]

(``--full`` uses the traces of ``python -m loadtest.simulate``, the default those of
``--quick``.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Hashable, Sequence
from typing import Any

import libcachesim  # type: ignore[import-not-found, unused-ignore]

from loadtest.simulate import Req, build, scenarios, simulate
from spoke.policy import LRUPolicy, S3FIFOPolicy


class LibCacheSimS3FIFO(S3FIFOPolicy[Hashable]):
    """S3-FIFO as libCacheSim's ``S3FIFO.c`` (2024 version) has it, on the project's class.

    Its departures from the paper's Algorithm 1, which ``S3FIFOPolicy`` follows:

    1. until the first eviction, a new key goes to M once S is at its target (the paper
       and ``S3FIFOPolicy``: always to S) -- the difference that matters, see the report;
    2. a key moved from S to M starts M with frequency 0 (the paper keeps its count);
    3. evict from M when M is over its target or S is empty, else from S (the paper:
       from S when S is at its target); a promotion does not evict from M at once.

    Reaches into ``S3FIFOPolicy``'s private queues: a one-off, not an API.
    """

    name = "s3fifo-libcachesim"

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self._has_evicted = False

    def evict(self, incoming: Hashable | None = None) -> Hashable | None:
        self._has_evicted = True
        if self._main.bytes > self.main_target_bytes or not self._small:
            return self._evict_main()
        while self._small:
            key, size = self._small.pop_oldest()
            if self._freq[key] >= 2:
                self._freq[key] = 0
                self._main.push(key, size)
            else:
                del self._freq[key]
                self._remember(key, size)
                return key
        return self._evict_main()

    def insert(self, key: Hashable, size: int) -> None:
        if key in self._freq:
            super().insert(key, size)
            return
        from_ghost = self._ghost.pop(key) is not None
        small_full = self._small.bytes >= self.small_target_bytes
        if from_ghost or (not self._has_evicted and small_full):
            self._main.push(key, size)
        else:
            self._small.push(key, size)
        self._freq[key] = 0


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
    args = parser.parse_args(argv)
    print(
        "| trace | cache | requests | S3FIFOPolicy % | libCacheSim S3FIFO % | diff pp "
        "| emulated % | emulated diff pp | LRU diff pp |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for scenario in scenarios(quick=not args.full):
        built = build(scenario)
        counted = len(built.trace) - built.warmup
        for fraction in scenario.capacities:
            capacity = int(built.dataset_bytes * fraction)
            ours = simulate(S3FIFOPolicy, built.trace, capacity, warmup=built.warmup).hits
            emulated = simulate(LibCacheSimS3FIFO, built.trace, capacity, warmup=built.warmup)
            theirs = libcachesim_hits(libcachesim.S3FIFO, built.trace, capacity, built.warmup)
            lru_ours = simulate(LRUPolicy, built.trace, capacity, warmup=built.warmup).hits
            lru_theirs = libcachesim_hits(libcachesim.LRU, built.trace, capacity, built.warmup)
            diff = 100 * (ours - theirs) / counted
            worst = max(worst, abs(diff))
            print(
                f"| {scenario.label} | {100 * fraction:.0f} % | {counted} "
                f"| {100 * ours / counted:.2f} | {100 * theirs / counted:.2f} | {diff:+.2f} "
                f"| {100 * emulated.hits / counted:.2f} "
                f"| {100 * (emulated.hits - theirs) / counted:+.2f} "
                f"| {100 * (lru_ours - lru_theirs) / counted:+.2f} |"
            )
    print()
    print(f"largest |S3FIFOPolicy - libCacheSim S3FIFO|: {worst:.2f} pp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
