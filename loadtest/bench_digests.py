"""Compare chunk digest algorithms on this machine: ``python -m loadtest.bench_digests``.

Hashes the same 4 MiB chunks with each algorithm, interleaved round by round so
machine noise hits all of them alike, and prints GB/s and the ratio to sha256.
"""

from __future__ import annotations

import argparse
import os
import time

from protocol.digests import digest

ALGORITHMS = ("xxh3-128", "blake3", "sha256")


def measure(chunk_bytes: int, rounds: int) -> dict[str, float]:
    data = os.urandom(chunk_bytes)
    best = dict.fromkeys(ALGORITHMS, float("inf"))
    for _ in range(rounds):
        for alg in ALGORITHMS:
            started = time.perf_counter()
            for _ in range(8):
                digest(alg, data)
            best[alg] = min(best[alg], (time.perf_counter() - started) / 8)
    return {alg: chunk_bytes / seconds / 1e9 for alg, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    rates = measure(args.chunk_mib << 20, args.rounds)
    print(f"| algorithm | GB/s ({args.chunk_mib} MiB chunks, best of {args.rounds}) | × sha256 |")
    print("|---|---|---|")
    for alg, rate in sorted(rates.items(), key=lambda kv: -kv[1]):
        print(f"| {alg} | {rate:.2f} | {rate / rates['sha256']:.1f} |")


if __name__ == "__main__":
    main()
