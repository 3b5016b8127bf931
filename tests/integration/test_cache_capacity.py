"""Capacity is a hard limit: bytes on the spoke's disk never exceed it, for every policy.

A spoke with room for 8 chunks reads three times that many distinct chunks (several
objects, random ranges and order, re-reads, some requests concurrent). After every
round ``used_bytes`` and the files under ``cache_dir/chunks`` stay within capacity,
and every byte served is right.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK, SpokeFactory
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
CAPACITY = 8 * CHUNK
OBJECTS = ("ds/big.bin", "ds/partial.bin", "ds/exact.bin")


def bytes_on_disk(cache_dir: Path) -> tuple[int, int]:
    """(bytes, files) under ``chunks/`` plus ``tmp/``."""
    total = files = 0
    for sub in ("chunks", "tmp"):
        for dirpath, _, names in os.walk(cache_dir / sub):
            for name in names:
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
    return total, files


def plan_reads(files: dict[str, bytes], seed: int) -> list[tuple[str, int, int]]:
    """Random (path, start, stop) reads touching >= 3x capacity worth of distinct chunks."""
    rng = random.Random(seed)
    reads: list[tuple[str, int, int]] = []
    touched: set[tuple[str, int]] = set()
    while len(touched) < 3 * (CAPACITY // CHUNK) or len(reads) < 40:
        if reads and rng.random() < 0.3:
            reads.append(rng.choice(reads))  # a re-read
            continue
        path = rng.choice(OBJECTS)
        size = len(files[path])
        start = rng.randrange(size)
        stop = min(size, start + rng.randint(1, 3 * CHUNK))
        reads.append((path, start, stop))
        touched.update((path, i) for i in range(start // CHUNK, (stop - 1) // CHUNK + 1))
    return reads


class DiskTally:
    """A lower bound of the bytes the store has on disk, instant by instant.

    Scanning the directory while fills run could add up files that never coexisted.
    The tally follows the store's own calls instead: a file counts from just after
    its rename until just before its unlink, so the tally never exceeds what is
    really there and a peak above capacity is a real overshoot.
    """

    def __init__(self, store: Any) -> None:
        self.sizes: dict[str, int] = {}
        self.peak = 0
        self._lock = threading.Lock()
        write: Callable[[str, bytes], os.stat_result] = store.write
        delete: Callable[[str], None] = store.delete

        def tallied_write(name: str, data: bytes) -> os.stat_result:
            written = write(name, data)
            with self._lock:
                self.sizes[name] = len(data)
                self.peak = max(self.peak, sum(self.sizes.values()))
            return written

        def tallied_delete(name: str) -> None:
            with self._lock:
                self.sizes.pop(name, None)
            delete(name)

        store.write = tallied_write
        store.delete = tallied_delete


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "wtinylfu"])
async def test_bytes_on_disk_never_exceed_capacity(
    policy: str, make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    files = dataset[1]
    cache_dir = tmp_path / f"cache-{policy}"
    spoke = await make_spoke(capacity_bytes=CAPACITY, policy=policy, cache_dir=str(cache_dir))
    tally = DiskTally(spoke.app[CACHE].store)
    reads = plan_reads(files, seed=sum(map(ord, policy)))
    rng = random.Random(1)

    async def check_read(path: str, start: int, stop: int) -> None:
        headers = {"Range": f"bytes={start}-{stop - 1}"}
        async with http.get(f"{spoke.url}/objects/{path}", headers=headers) as resp:
            assert resp.status == 206
            assert await resp.read() == files[path][start:stop]

    i = 0
    while i < len(reads):
        batch = reads[i : i + rng.choice((1, 1, 2, 3))]  # mostly one at a time, some together
        i += len(batch)
        await asyncio.gather(*(check_read(*r) for r in batch))
        stats = await settled_stats(http, spoke.url)
        on_disk, n_files = bytes_on_disk(cache_dir)
        assert stats["used_bytes"] <= CAPACITY
        assert on_disk <= CAPACITY
        # Quiescent: the accounting and the directory agree exactly.
        assert (on_disk, n_files) == (stats["used_bytes"], stats["cached_chunks"])

    stats = await settled_stats(http, spoke.url)
    assert (stats["policy"], stats["capacity_bytes"]) == (policy, CAPACITY)
    assert stats["evictions"] > 0
    assert stats["hits"] > 0
    assert 0 < tally.peak <= CAPACITY
    # Every chunk fetched is still on disk, was evicted, or was served without storing.
    assert stats["hub_fetches"] == (
        stats["cached_chunks"] + stats["evictions"] + stats["uncached_fills"]
    )
