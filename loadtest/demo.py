"""The demo: a hub, a 60 ms WAN link, a spoke, and a loader pass cold then warm.

    python -m loadtest.demo [--shards 16 --shard-size 16MiB --workers 16 --latency-ms 60]

It generates a sample dataset (4096-token samples packed in shards), starts a
hub over it, Toxiproxy (real or the project's stand-in) with a latency toxic in
front of the hub, and a spoke with an empty cache behind the link. Then it reads
one shuffled epoch from the hub directly (the "data is local" baseline), one
cold epoch through the spoke and one warm epoch, prints what it measured, and
stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import aiohttp

from loadtest.dataset import SAMPLE_BYTES, generate
from loadtest.lab import Lab
from loadtest.loader import PassResult, epoch_order, run_pass
from protocol.sizes import parse_size


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="demo-data", help="where the dataset is generated")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-size", type=parse_size, default=16 << 20)
    parser.add_argument("--workers", type=int, default=16, help="concurrent sample readers")
    parser.add_argument("--latency-ms", type=int, default=60, help="hub-spoke round trip")
    parser.add_argument("--chunk-size", default="4MiB")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def row(name: str, r: PassResult, hit_ratio: str, egress: str) -> str:
    return (f"| {name} | {r.samples_per_s:,.0f} | {r.mb_per_s:,.0f} | {r.median_ms:.1f} | "
            f"{r.latency_ms(0.99):.1f} | {hit_ratio} | {egress} | {r.errors} |")


async def measure(hub: str, spoke: str, order_seeds: tuple[int, int, int], shards: list,
                  workers: int) -> dict[str, object]:
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=workers)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        local = await run_pass(hub, epoch_order(shards, order_seeds[0]), workers, session)
        cold = await run_pass(spoke, epoch_order(shards, order_seeds[1]), workers, session)
        after_cold = await _stats(session, spoke)
        warm = await run_pass(spoke, epoch_order(shards, order_seeds[2]), workers, session)
        after_warm = await _stats(session, spoke)
    return {"local": local, "cold": cold, "warm": warm,
            "after_cold": after_cold, "after_warm": after_warm}


async def _stats(session: aiohttp.ClientSession, spoke: str) -> dict[str, int]:
    async with session.get(f"{spoke}/stats") as resp:
        stats: dict[str, int] = await resp.json()
        return stats


def report(figures: dict[str, object], dataset_bytes: int) -> dict[str, float]:
    local, cold, warm = (figures[k] for k in ("local", "cold", "warm"))
    s1, s2 = figures["after_cold"], figures["after_warm"]
    assert isinstance(local, PassResult) and isinstance(cold, PassResult)
    assert isinstance(warm, PassResult) and isinstance(s1, dict) and isinstance(s2, dict)
    cold_hits = s1["hits"] / max(1, s1["hits"] + s1["misses"])
    warm_lookups = (s2["hits"] - s1["hits"]) + (s2["misses"] - s1["misses"])
    warm_hits = (s2["hits"] - s1["hits"]) / max(1, warm_lookups)
    print("| pass | samples/s | MB/s | p50 ms | p99 ms | chunk hit ratio | hub egress | errors |")
    print("|---|---|---|---|---|---|---|---|")
    print(row("hub direct (data local)", local, "-", "-"))
    print(row("spoke, cold cache", cold, f"{cold_hits:.1%}", f"{s1['hub_bytes'] / 1e6:,.0f} MB"))
    print(row("spoke, warm cache", warm, f"{warm_hits:.1%}",
              f"{(s2['hub_bytes'] - s1['hub_bytes']) / 1e6:,.0f} MB"))
    summary = {
        "dataset_mb": dataset_bytes / 1e6,
        "local_samples_per_s": local.samples_per_s,
        "cold_samples_per_s": cold.samples_per_s,
        "warm_samples_per_s": warm.samples_per_s,
        "warm_over_local": warm.samples_per_s / max(local.samples_per_s, 1e-9),
        "cold_over_local": cold.samples_per_s / max(local.samples_per_s, 1e-9),
        "warm_chunk_hit_ratio": warm_hits,
        "warm_request_hit_ratio": warm.hits / max(1, warm.samples),
        "cold_hub_egress_mb": s1["hub_bytes"] / 1e6,
        "warm_hub_egress_mb": (s2["hub_bytes"] - s1["hub_bytes"]) / 1e6,
        "errors": local.errors + cold.errors + warm.errors,
    }
    print(f"\nwarm ÷ local samples/s: {summary['warm_over_local']:.2f}   "
          f"cold ÷ local: {summary['cold_over_local']:.2f}   "
          f"warm requests answered HIT: {summary['warm_request_hit_ratio']:.1%}")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hub_root = os.path.join(args.data_dir, "hub")
    print(f"generating {args.shards} shards of {args.shard_size >> 20} MiB in {hub_root} ...")
    shards = generate(hub_root, args.shards, args.shard_size)
    dataset_bytes = sum(s.size for s in shards)
    samples = dataset_bytes // SAMPLE_BYTES
    with Lab() as lab:
        cache_dir = lab.temp_dir("hubspoke-demo-cache-")
        hub = lab.hub(hub_root, "--chunk-size", args.chunk_size)
        link = lab.link(hub.url, latency_ms=args.latency_ms)
        spoke = lab.spoke(link.url, cache_dir, "--capacity", str(2 * dataset_bytes))
        print(f"hub {hub.url} -> toxiproxy {link.url} ({args.latency_ms} ms) -> spoke "
              f"{spoke.url}; {samples:,} samples of {SAMPLE_BYTES // 1024} KiB, "
              f"{args.workers} workers\n")
        started = time.perf_counter()
        figures = asyncio.run(measure(hub.url, spoke.url, (1, 2, 3), shards, args.workers))
        summary = report(figures, dataset_bytes)
        print(f"(measured in {time.perf_counter() - started:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
