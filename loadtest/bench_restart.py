"""How long a spoke takes to reopen a cache of N chunks: ``python -m loadtest.bench_restart``.

Builds a cache directory holding N chunk files (small ones: start-up cost is per
chunk, not per byte) with their index rows, as a spoke would have left it, then
times ``ChunkCache.open`` — index load, reconciliation with the files on disk,
and rebuilding the eviction policy — the way ``python -m spoke serve`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time

from protocol.digests import digest
from spoke.cache.clock import SYSTEM_CLOCK
from spoke.cache.engine import ChunkCache
from spoke.cache.index import ChunkIndex, ChunkRow
from spoke.cache.keys import ChunkKey
from spoke.cache.store import ChunkStore
from spoke.policy import DEFAULT_ADMISSION, make_policy
from spoke.upstream.hub import HubClient

CHUNK_BYTES = 4096


def build(cache_dir: str, chunks: int) -> None:
    store, index = ChunkStore(cache_dir), ChunkIndex(cache_dir)
    data = os.urandom(CHUNK_BYTES)
    mark = digest("xxh3-128", data)
    rows = []
    for i in range(chunks):
        key = ChunkKey(f"dataset/shard-{i // 1000:05d}.bin", '"v1"', 4 << 20, i % 1000)
        path = store.path_of(key.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        rows.append(ChunkRow(key.name, key.path, key.etag, CHUNK_BYTES, "xxh3-128", mark, i, i))
    index.add_many(rows)
    index.close()


async def reopen(cache_dir: str, policy: str) -> tuple[float, int]:
    hub = HubClient("http://127.0.0.1:9", connect_timeout_s=1, read_timeout_s=1,
                    max_connections=1)
    cache = ChunkCache(store=ChunkStore(cache_dir), index=ChunkIndex(cache_dir),
                       policy=make_policy(policy, 1 << 40, DEFAULT_ADMISSION), hub=hub,
                       clock=SYSTEM_CLOCK, capacity_bytes=1 << 40, meta_ttl_s=5,
                       fetch_concurrency=1)
    started = time.perf_counter()
    await cache.open()
    took = time.perf_counter() - started
    count = len(cache.policy)
    await cache.close()
    return took, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--policy", default="arc")
    args = parser.parse_args()
    cache_dir = tempfile.mkdtemp(prefix="hubspoke-restart-")
    try:
        t0 = time.perf_counter()
        build(cache_dir, args.chunks)
        print(f"built {args.chunks:,} chunks in {time.perf_counter() - t0:.1f} s")
        for attempt in range(3):
            took, count = asyncio.run(reopen(cache_dir, args.policy))
            print(f"reopen {attempt + 1}: {count:,} chunks in {took:.2f} s "
                  f"({took / max(count, 1) * 1e6:.1f} µs per chunk)")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
