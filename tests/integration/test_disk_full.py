"""A disk that refuses writes costs caching, never an answer (issue 25, items 1 and 2).

Real refusals where they can be had without root: SQLite's own "database or disk is
full" (``PRAGMA max_page_count`` on the spoke's index connection), and the kernel's
EFBIG for every file write of a spoke process whose ``RLIMIT_FSIZE`` is lowered
while it runs (``prlimit``), then raised again. A fake at the SQLite boundary only
where a real failure cannot be timed: the access-time flush.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spoke.cache import engine as cache_module
from spoke.cache.engine import ChunkCache
from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK, SpokeFactory
from tests.support.http import metric_samples
from tests.support.servers import RunningServer, start_process, write_dataset
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
# A manifest of this many chunks does not fit in one SQLite page: saving it needs a
# page more, which a database at its max_page_count cannot have.
MANY_CHUNKS = 300
WAIT_S = 20.0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that shows a cut connection as the error it is: aiohttp's own sends an
    idempotent request again once when the server hangs up (as aiohttp's test client
    turns off too), and the retry, finding the manifest known, hid the cut."""
    async with aiohttp.ClientSession() as session:
        session._retry_connection = False
        yield session


@pytest.fixture
def many(dataset: Dataset) -> bytes:
    """``ds/many.bin``, written beside the shared dataset."""
    return write_dataset(str(dataset[0]), {"ds/many.bin": MANY_CHUNKS * CHUNK + 11})[
        "ds/many.bin"
    ]


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str | None, bytes]:
    async with http.get(url) as resp:
        return resp.status, resp.headers.get("X-Cache"), await resp.read()


async def assert_consistent(cache: ChunkCache) -> None:
    """What the spoke serves as cached is exactly what the index and the disk hold,
    and no half-written file is left."""
    rows = await cache.db.run(cache.index.rows)  # the index's own thread
    on_disk, stray = cache.store.scan()
    resident = set(cache.snapshot()[1])
    assert {r.name for r in rows} == on_disk == resident
    assert (stray, cache.store.temp_files()) == ([], 0)
    assert cache.used_bytes == sum(r.size for r in rows)


async def test_a_full_index_costs_caching_not_the_answer(
    make_spoke: SpokeFactory, dataset: Dataset, many: bytes, http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(capacity_bytes=64 << 20)
    cache = spoke.app[CACHE]
    # No page more than it has now: SQLite answers "database or disk is full" itself.
    await cache.db.run(cache.index._db.execute, "PRAGMA max_page_count = 1")

    assert await get(http, f"{spoke.url}/objects/ds/many.bin") == (200, "MISS", many)
    stats = await settled_stats(http, spoke.url)
    assert stats["disk_write_errors"]["manifest"] == 1
    assert stats["uncached_fills"] > 0  # the index refused their rows
    assert stats["uncached_fills"] + stats["cached_chunks"] == MANY_CHUNKS + 1
    await assert_consistent(cache)
    samples = await metric_samples(http, spoke.url)
    assert samples['spoke_disk_write_errors_total{write="manifest"}'] == 1
    assert samples['spoke_disk_write_errors_total{write="chunk"}'] == stats["uncached_fills"]

    # Room again: caching resumes by itself, the refused manifest saved this time.
    await cache.db.run(cache.index._db.execute, "PRAGMA max_page_count = 1073741823")
    uncached = stats["uncached_fills"]
    cache.invalidate("ds/many.bin")  # its next read asks the hub, as after the TTL
    assert await get(http, f"{spoke.url}/objects/ds/many.bin") == (200, "PARTIAL", many)
    small = dataset[1]["ds/partial.bin"]
    assert await get(http, f"{spoke.url}/objects/ds/partial.bin") == (200, "MISS", small)
    stats = await settled_stats(http, spoke.url)
    assert (stats["uncached_fills"], stats["cached_chunks"]) == (uncached, MANY_CHUNKS + 1 + 6)
    assert stats["used_bytes"] == len(many) + len(small)
    assert await cache.db.run(cache.index.load_manifest, "ds/many.bin") is not None
    await assert_consistent(cache)


async def test_a_process_that_may_not_write_still_answers_and_recovers(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """Every file write of the spoke fails with EFBIG (chunk files, SQLite's database
    and WAL) while its RLIMIT_FSIZE is 0, the way they fail with ENOSPC on a full
    disk; Python ignores SIGXFSZ, so the process lives on. Then the limit goes."""
    files = dataset[1]
    cache_dir = tmp_path / "cache"
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(cache_dir), "--capacity", "64MiB",
    ])
    try:
        limits = resource.prlimit(spoke.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(spoke.pid, resource.RLIMIT_FSIZE, (0, limits[1]))
        for path in ("ds/big.bin", "ds/small.bin"):
            assert await get(http, f"{spoke.url}/objects/{path}") == (200, "MISS", files[path])
        stats = await settled_stats(http, spoke.url)
        assert (stats["cached_chunks"], stats["used_bytes"], stats["uncached_fills"]) == (
            0, 0, 41 + 1)
        assert stats["disk_write_errors"]["manifest"] == 2
        assert os.listdir(cache_dir / "tmp") == []

        resource.prlimit(spoke.pid, resource.RLIMIT_FSIZE, limits)
        assert await get(http, f"{spoke.url}/objects/ds/partial.bin") == (
            200, "MISS", files["ds/partial.bin"])
        assert await get(http, f"{spoke.url}/objects/ds/big.bin") == (
            200, "MISS", files["ds/big.bin"])
        stats = await settled_stats(http, spoke.url)
        assert (stats["cached_chunks"], stats["uncached_fills"]) == (6 + 41, 41 + 1)
        assert stats["used_bytes"] == len(files["ds/partial.bin"]) + len(files["ds/big.bin"])
    finally:
        await asyncio.to_thread(spoke.stop)
    # What it stored while it could is all there after a restart, and nothing else.
    again = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(cache_dir), "--capacity", "64MiB",
    ])
    try:
        assert (await settled_stats(http, again.url))["cached_chunks"] == 6 + 41
        assert await get(http, f"{again.url}/objects/ds/big.bin") == (
            200, "HIT", files["ds/big.bin"])
    finally:
        await asyncio.to_thread(again.stop)


async def wait_for(what: str, check: Any) -> None:
    """Poll ``check()`` (a coroutine function) until it is true; fail after WAIT_S."""
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                if await check():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT_S} s: {what}") from None


async def test_background_tasks_outlive_a_full_disk(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(cache_module, "_ACCESS_FLUSH_INTERVAL_S", 0.02)
    monkeypatch.setattr(cache_module, "_EXPIRY_INTERVAL_S", 0.02, raising=False)
    spoke = await make_spoke(max_age_s=3600.0)
    cache = spoke.app[CACHE]
    data = dataset[1]["ds/small.bin"]
    assert (await get(http, f"{spoke.url}/objects/ds/small.bin"))[:2] == (200, "MISS")
    await settled_stats(http, spoke.url)
    (stored,) = await cache.db.run(cache.index.rows)

    refusals = 3
    touch = cache.index.touch

    def full_then_fine(accesses: dict[str, float]) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise sqlite3.OperationalError("database or disk is full")
        touch(accesses)

    monkeypatch.setattr(cache.index, "touch", full_then_fine)
    assert await get(http, f"{spoke.url}/objects/ds/small.bin") == (200, "HIT", data)

    async def access_saved() -> bool:
        (row,) = await cache.db.run(cache.index.rows)
        return row.last_access > stored.last_access

    await wait_for("the access time kept and saved once the disk took it", access_saved)
    samples = await metric_samples(http, spoke.url)
    assert samples['spoke_background_errors_total{task="access-times"}'] == 3
    assert samples['spoke_background_errors_total{task="expiry"}'] == 0
    logged = [r for r in caplog.records if "access-times" in r.getMessage()]
    assert len(logged) == 1  # once, not once per failure

    # Expiry still runs: what was stored is now past a max age lowered to nothing.
    cache.max_age_s = 1e-9

    async def expired() -> bool:
        return cache.stats.expired_chunks == 1

    await wait_for("expiry still running", expired)
    assert cache.chunk_count == 0


async def test_a_refused_chunk_write_gives_its_buffer_back_at_once(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused write must not keep the chunk's memory until the cyclic collector
    runs (issue 25, item 9): its exception, held by the frames it passed through,
    held their locals, the chunk's buffer among them. The kernel refuses the store's
    own write path here: ``/dev/full`` answers every write with ENOSPC."""
    spoke = await make_spoke(capacity_bytes=64 << 20)
    cache = spoke.app[CACHE]

    def write_to_a_full_disk(name: str, data: memoryview) -> os.stat_result:
        fd = os.open("/dev/full", os.O_WRONLY)
        try:
            cache.store._write_direct(fd, data)
        finally:
            os.close(fd)
        raise AssertionError("/dev/full took a write")

    monkeypatch.setattr(cache.store, "write", write_to_a_full_disk)
    big = dataset[1]["ds/big.bin"]
    gc.collect()
    gc.disable()  # nothing is collected behind the test's back
    try:
        assert await get(http, f"{spoke.url}/objects/ds/big.bin") == (200, "MISS", big)
        stats = await settled_stats(http, spoke.url)
        assert stats["disk_write_errors"]["chunk"] == stats["uncached_fills"] == 41
        # What only the cyclic collector would free, kept for a look instead.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        in_cycles = [o for o in gc.garbage if _live_chunk_view(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert in_cycles == []


def _live_chunk_view(o: object) -> bool:
    """Whether ``o`` is a view of a whole chunk's bytes (a released one views nothing)."""
    if not isinstance(o, memoryview):
        return False
    try:
        return o.nbytes == CHUNK
    except ValueError:  # released
        return False
