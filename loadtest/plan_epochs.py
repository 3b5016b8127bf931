"""Shuffled epochs through a real spoke, with and without a read plan.

    python -m loadtest.plan_epochs [--shards 8 --shard-size 16MiB --cache-fraction 0.5]

A hub, a 60 ms Toxiproxy link and two spokes with empty caches holding a
fraction of the dataset. Loaders read several shuffled epochs of 16 KiB samples
through each; the second spoke was told each epoch's order first (``POST
/plans``). Prints, per epoch, hub bytes, the chunk hit ratio and samples/s, and
the prefetch accuracy: what the plan saves on a dataset larger than the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import aiohttp

from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.loader import epoch_order, register_plan, run_pass
from protocol.sizes import parse_size


async def epochs(spoke: str, orders: list[list[tuple[str, int]]], workers: int,
                 with_plan: bool) -> list[dict[str, float]]:
    rows = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=workers + 2)) as http:
        plan = None
        if with_plan:
            everything = [read for order in orders for read in order]
            plan = await register_plan(spoke, everything, http)
        for order in orders:
            before = await _stats(http, spoke)
            result = await run_pass(spoke, order, workers, http, plan)
            after = await _stats(http, spoke)
            lookups = (after["hits"] - before["hits"]) + (after["misses"] - before["misses"])
            rows.append({
                "hub_mb": (after["hub_bytes"] - before["hub_bytes"]) / 1e6,
                "chunk_hit_ratio": (after["hits"] - before["hits"]) / max(1, lookups),
                "samples_per_s": result.samples_per_s,
                "errors": result.errors,
                "prefetch_accuracy": after["prefetch_used"] / max(1, after["prefetched_chunks"]),
            })
    return rows


async def _stats(http: aiohttp.ClientSession, spoke: str) -> dict[str, float]:
    async with http.get(f"{spoke}/stats") as resp:
        stats: dict[str, float] = await resp.json()
        return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="demo-data")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-size", type=parse_size, default=16 << 20)
    parser.add_argument("--chunk-size", default="1MiB")
    parser.add_argument("--cache-fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--latency-ms", type=int, default=60)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    root = os.path.join(args.data_dir, "plan-epochs")
    shards = generate(root, args.shards, args.shard_size)
    capacity = int(sum(s.size for s in shards) * args.cache_fraction)
    orders = [epoch_order(shards, seed) for seed in range(1, args.epochs + 1)]
    results: dict[str, list[dict[str, float]]] = {}
    with Lab() as lab:
        work = lab.temp_dir("hubspoke-plan-epochs-")
        hub = lab.hub(root, "--chunk-size", args.chunk_size, "--access-log", "off")
        link = lab.link(hub.url, latency_ms=args.latency_ms)
        for mode in ("no plan", "plan"):
            spoke = lab.spoke(link.url, os.path.join(work, mode.replace(" ", "-")),
                              "--capacity", str(capacity), "--policy", "arc",
                              "--access-log", "off")
            results[mode] = asyncio.run(epochs(spoke.url, orders, args.workers, mode == "plan"))
    print(f"{args.shards} shards x {args.shard_size >> 20} MiB, {args.chunk_size} chunks, cache "
          f"{args.cache_fraction:.0%} of the data, {args.latency_ms} ms link, ARC\n")
    print("| epoch | hub MB, no plan | hub MB, plan | chunk hits, no plan | chunk hits, plan "
          "| samples/s, no plan | samples/s, plan |")
    print("|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(results["no plan"], results["plan"], strict=True), 1):
        print(f"| {i} | {a['hub_mb']:,.0f} | {b['hub_mb']:,.0f} | {a['chunk_hit_ratio']:.1%} "
              f"| {b['chunk_hit_ratio']:.1%} | {a['samples_per_s']:,.0f} "
              f"| {b['samples_per_s']:,.0f} |")
    print(f"\nprefetch accuracy with the plan: {results['plan'][-1]['prefetch_accuracy']:.1%}")
    errors = sum(r["errors"] for rows in results.values() for r in rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
