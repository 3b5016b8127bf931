"""A restarted spoke serves what it had cached without asking the hub for those chunks.

Hub and spoke run as ``python -m hub|spoke serve`` child processes so the spoke can be
stopped with SIGTERM (clean shutdown) or SIGKILL (a crash) and started again on the
same ``--cache-dir``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spoke.config import SpokeConfig
from tests.conftest import CHUNK, FILES
from tests.support.http import metric
from tests.support.servers import (
    Process,
    RunningServer,
    start_process,
    start_spoke,
    write_dataset,
)
from tests.support.waits import settled_stats

Hub = tuple[Process, dict[str, bytes]]
READS = ("ds/big.bin", "ds/partial.bin", "ds/small.bin", "other/notes.csv")
CACHED_CHUNKS = 41 + 6 + 1 + 1
CACHED_BYTES = sum(FILES[p] for p in READS)


@pytest.fixture(scope="module")
def hub_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("restart-hub-root")
    files = write_dataset(str(root), FILES)
    hub = start_process("hub", ["--root", str(root), "--chunk-size", "64KiB"])
    try:
        yield hub, files
    finally:
        hub.stop()


class Spokes:
    """``python -m spoke serve`` processes; every one is stopped by the fixture."""

    def __init__(self, hub_url: str) -> None:
        self.hub_url = hub_url
        self.started: list[Process] = []

    async def start(self, cache_dir: Path, *extra: str) -> Process:
        args = ["--hub", self.hub_url, "--cache-dir", str(cache_dir), "--capacity", "64MiB",
                *extra]
        spoke = await asyncio.to_thread(start_process, "spoke", args)
        self.started.append(spoke)
        return spoke

    async def stop(self, spoke: Process, sig: int) -> int:
        return await asyncio.to_thread(spoke.stop, sig)


@pytest.fixture
async def spokes(hub_process: Hub) -> AsyncIterator[Spokes]:
    spokes = Spokes(hub_process[0].url)
    try:
        yield spokes
    finally:
        for spoke in spokes.started:
            await asyncio.to_thread(spoke.stop, signal.SIGKILL)


async def read_all(
    http: aiohttp.ClientSession, spoke_url: str, files: dict[str, bytes], expected: str
) -> None:
    """GET every object of READS; each must be whole, right and ``X-Cache: expected``."""
    for path in READS:
        async with http.get(f"{spoke_url}/objects/{path}") as resp:
            assert (resp.status, resp.headers["X-Cache"]) == (200, expected), path
            assert await resp.read() == files[path], path
    await settled_stats(http, spoke_url)  # what was read is on disk


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


async def test_sigterm_exits_0_and_a_restart_serves_every_chunk_from_disk(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    hub, files = hub_process
    cache_dir = tmp_path / "cache"
    first = await spokes.start(cache_dir)
    await read_all(http, first.url, files, "MISS")
    chunk_files = files_under(cache_dir / "chunks")
    assert len(chunk_files) == CACHED_CHUNKS

    assert await spokes.stop(first, signal.SIGTERM) == 0
    assert files_under(cache_dir / "tmp") == []
    assert files_under(cache_dir / "chunks") == chunk_files

    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    second = await spokes.start(cache_dir)
    await read_all(http, second.url, files, "HIT")
    assert await metric(http, hub.url, "hub_bytes_sent_total") == sent_before
    stats = await settled_stats(http, second.url)
    assert (stats["hits"], stats["misses"], stats["hub_fetches"]) == (CACHED_CHUNKS, 0, 0)
    assert (stats["used_bytes"], stats["cached_chunks"]) == (CACHED_BYTES, CACHED_CHUNKS)
    assert await spokes.stop(second, signal.SIGTERM) == 0


async def test_after_sigkill_a_restart_serves_from_disk_and_cleans_up_debris(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    hub, files = hub_process
    cache_dir = tmp_path / "cache"
    first = await spokes.start(cache_dir)
    await read_all(http, first.url, files, "MISS")
    chunk_files = files_under(cache_dir / "chunks")
    assert await spokes.stop(first, signal.SIGKILL) == -signal.SIGKILL

    # What a crash leaves behind: a half-written temp file, and a chunk file renamed
    # into place whose index row was never written.
    (cache_dir / "tmp" / "deadbeef-3.1234.abcd").write_bytes(b"half a chunk")
    some_bucket = next((cache_dir / "chunks").iterdir())
    (some_bucket / f"{some_bucket.name}{'0' * 30}-0").write_bytes(b"y" * CHUNK)

    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    second = await spokes.start(cache_dir)
    assert files_under(cache_dir / "tmp") == []
    assert files_under(cache_dir / "chunks") == chunk_files
    stats = await settled_stats(http, second.url)
    assert (stats["used_bytes"], stats["cached_chunks"]) == (CACHED_BYTES, CACHED_CHUNKS)
    await read_all(http, second.url, files, "HIT")
    assert await metric(http, hub.url, "hub_bytes_sent_total") == sent_before
    stats = await settled_stats(http, second.url)
    assert (stats["hits"], stats["misses"], stats["hub_fetches"]) == (CACHED_CHUNKS, 0, 0)


async def test_a_torn_chunk_file_is_refetched_alone_and_then_served_from_disk(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    hub, files = hub_process
    cache_dir = tmp_path / "cache"
    first = await spokes.start(cache_dir)
    await read_all(http, first.url, files, "MISS")
    assert await spokes.stop(first, signal.SIGKILL) == -signal.SIGKILL
    # A torn chunk of ds/partial.bin (its only 123-byte chunk is the last one).
    torn = next(p for p in (cache_dir / "chunks").glob("*/*") if p.stat().st_size == 123)
    os.truncate(torn, 100)

    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    second = await spokes.start(cache_dir)
    async with http.get(f"{second.url}/objects/ds/partial.bin") as resp:
        assert resp.status == 200
        assert await resp.read() == files["ds/partial.bin"]
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == 123
    stats = await settled_stats(http, second.url)
    assert (stats["misses"], stats["hub_fetches"]) == (1, 1)
    assert torn.stat().st_size == 123  # replaced by the refetched chunk

    await read_all(http, second.url, files, "HIT")
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == 123
    assert (await settled_stats(http, second.url))["hub_fetches"] == 1


@pytest.fixture
async def hub_in_process(tmp_path: Path) -> AsyncIterator[tuple[RunningServer, dict[str, bytes]]]:
    from hub.config import HubConfig
    from tests.support.servers import start_hub

    root = tmp_path / "hub-root"
    root.mkdir()
    files = write_dataset(str(root), FILES)
    hub = await start_hub(HubConfig(root=str(root), chunk_size=CHUNK))
    try:
        yield hub, files
    finally:
        await hub.stop()


async def test_a_garbage_file_in_a_chunk_bucket_is_removed_at_start(
    hub_in_process: tuple[RunningServer, dict[str, bytes]], http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    hub, files = hub_in_process
    cache_dir = tmp_path / "cache"
    config = SpokeConfig(hub_url=hub.url, cache_dir=str(cache_dir), capacity_bytes=64 << 20)
    first = await start_spoke(config)
    try:
        async with http.get(f"{first.url}/objects/ds/small.bin") as resp:
            assert await resp.read() == files["ds/small.bin"]
    finally:
        await first.stop()
    chunk_files = files_under(cache_dir / "chunks")
    bucket = cache_dir / "chunks" / "zz"
    bucket.mkdir()
    (bucket / "garbage").write_bytes(b"x" * 5000)

    second = await start_spoke(config)
    try:
        async with http.get(f"{second.url}/objects/ds/small.bin") as resp:
            assert resp.headers["X-Cache"] == "HIT"
            assert await resp.read() == files["ds/small.bin"]
        assert files_under(cache_dir / "chunks") == chunk_files
    finally:
        await second.stop()


async def test_a_restart_with_less_capacity_keeps_the_most_recently_used_chunks(
    hub_in_process: tuple[RunningServer, dict[str, bytes]], http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    hub, files = hub_in_process
    config = SpokeConfig(hub_url=hub.url, cache_dir=str(tmp_path / "cache"),
                         capacity_bytes=64 << 20)
    first = await start_spoke(config)
    try:
        for path in ("ds/exact.bin", "ds/partial.bin"):  # exact.bin is the older one
            async with http.get(f"{first.url}/objects/{path}") as resp:
                assert await resp.read() == files[path]
            await asyncio.sleep(0.01)
    finally:
        await first.stop()

    # Room for 6 chunks now: ds/partial.bin (6 chunks, read last) fits exactly.
    second = await start_spoke(replace(config, capacity_bytes=6 * CHUNK))
    try:
        stats = await settled_stats(http, second.url)
        assert stats["used_bytes"] <= 6 * CHUNK
        async with http.get(f"{second.url}/objects/ds/partial.bin") as resp:
            assert await resp.read() == files["ds/partial.bin"]
            assert resp.headers["X-Cache"] == "HIT"
    finally:
        await second.stop()


def damage_header(index: Path) -> None:
    """"file is not a database": SQLite's magic string and page size overwritten."""
    with open(index, "r+b") as f:
        f.write(b"this is not SQLite" * 8)


def truncate_to_two_pages(index: Path) -> None:
    """A torn write: the file ends long before the pages its header counts."""
    os.truncate(index, 2 * 4096)


async def read_every_object(
    http: aiohttp.ClientSession, spoke_url: str, files: dict[str, bytes]
) -> dict[str, str]:
    """GET every object of READS, each whole and right; their X-Cache by path."""
    seen = {}
    for path in READS:
        async with http.get(f"{spoke_url}/objects/{path}") as resp:
            assert resp.status == 200, path
            assert await resp.read() == files[path], path
            seen[path] = resp.headers["X-Cache"]
    return seen


def set_aside(cache_dir: Path) -> list[Path]:
    """Damaged indexes set aside (without their -wal and -shm companions)."""
    found = cache_dir.glob("index.sqlite3.damaged-*")
    return sorted(p for p in found if not p.name.endswith(("-wal", "-shm")))


async def assert_indexed_as_on_disk(
    http: aiohttp.ClientSession, spoke: Process, cache_dir: Path
) -> None:
    """Every chunk file on disk is one the spoke counts as cached, and no other."""
    stats = await settled_stats(http, spoke.url)
    assert len(files_under(cache_dir / "chunks")) == stats["cached_chunks"]


async def cache_then_stop(
    spokes: Spokes, http: aiohttp.ClientSession, cache_dir: Path, files: dict[str, bytes],
    sig: int,
) -> None:
    """A spoke on ``cache_dir`` caches every object of READS, then is stopped by ``sig``."""
    first = await spokes.start(cache_dir)
    await read_all(http, first.url, files, "MISS")
    assert await spokes.stop(first, sig) == (0 if sig == signal.SIGTERM else -sig)


@pytest.mark.parametrize("damage", [damage_header, truncate_to_two_pages])
async def test_a_damaged_index_is_set_aside_and_the_spoke_serves(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path,
    damage: Any,
) -> None:
    _, files = hub_process
    cache_dir = tmp_path / "cache"
    await cache_then_stop(spokes, http, cache_dir, files, signal.SIGTERM)
    damage(cache_dir / "index.sqlite3")
    damaged = (cache_dir / "index.sqlite3").read_bytes()

    second = await spokes.start(cache_dir)
    (aside,) = set_aside(cache_dir)
    assert aside.read_bytes() == damaged  # kept as it was, for a post-mortem
    assert sum("is damaged" in line for line in second.log) == 1
    # Whatever could be salvaged is on disk and indexed; the rest of the files went.
    await assert_indexed_as_on_disk(http, second, cache_dir)
    if damage is damage_header:  # nothing readable: a cold start
        assert files_under(cache_dir / "chunks") == []
    await read_every_object(http, second.url, files)
    stats = await settled_stats(http, second.url)
    assert (stats["cached_chunks"], stats["used_bytes"]) == (CACHED_CHUNKS, CACHED_BYTES)
    assert await spokes.stop(second, signal.SIGTERM) == 0

    third = await spokes.start(cache_dir)  # the new index is sound: nothing set aside
    assert len(set_aside(cache_dir)) == 1
    await read_all(http, third.url, files, "HIT")


def damage_the_by_path_index(index: Path) -> None:
    """Garbage over the page of the index by path: the quick check fails, the chunk
    rows themselves stay readable."""
    db = sqlite3.connect(index)
    (root,) = db.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'chunks_by_path'").fetchone()
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    with open(index, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(os.urandom(page_size))


async def test_chunk_rows_readable_in_a_damaged_index_are_kept_when_their_files_agree(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    hub, files = hub_process
    cache_dir = tmp_path / "cache"
    await cache_then_stop(spokes, http, cache_dir, files, signal.SIGTERM)
    damage_the_by_path_index(cache_dir / "index.sqlite3")
    # And bit rot in one chunk file (ds/partial.bin's 123-byte last chunk).
    rotten = next(p for p in (cache_dir / "chunks").glob("*/*") if p.stat().st_size == 123)
    rotten.write_bytes(b"\xff" + rotten.read_bytes()[1:])

    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    second = await spokes.start(cache_dir)
    assert len(set_aside(cache_dir)) == 1
    stats = await settled_stats(http, second.url)
    assert stats["cached_chunks"] == CACHED_CHUNKS - 1  # all but the rotten one
    assert not rotten.exists()
    seen = await read_every_object(http, second.url, files)
    assert seen == {**dict.fromkeys(READS, "HIT"), "ds/partial.bin": "PARTIAL"}
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == 123


async def test_a_garbage_wal_leaves_a_consistent_cache(
    hub_process: Hub, spokes: Spokes, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    _, files = hub_process
    cache_dir = tmp_path / "cache"
    # A crash: the latest rows are in the WAL, which is then overwritten with garbage.
    await cache_then_stop(spokes, http, cache_dir, files, signal.SIGKILL)
    wal = cache_dir / "index.sqlite3-wal"
    wal.write_bytes(os.urandom(max(wal.stat().st_size, 64 << 10)))

    second = await spokes.start(cache_dir)
    await assert_indexed_as_on_disk(http, second, cache_dir)
    await read_every_object(http, second.url, files)
    stats = await settled_stats(http, second.url)
    assert (stats["cached_chunks"], stats["used_bytes"]) == (CACHED_CHUNKS, CACHED_BYTES)
