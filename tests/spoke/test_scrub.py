"""BackgroundScrub on a real ChunkStore: bad chunks dropped, errors survived and counted."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.digests import digest
from service.background import ErrorCounts
from spoke.cache import scrub
from spoke.cache.counters import SpokeStats
from spoke.cache.integrity import Expected
from spoke.cache.scrub import BackgroundScrub
from spoke.cache.store import ChunkStore

CHUNK = 64 << 10
WAIT_S = 10.0


class FailingStore(ChunkStore):
    """A store whose disk fails (EIO) for the chunks in ``failing``."""

    def __init__(self, root: str) -> None:
        super().__init__(root, direct=False)
        self.failing: set[str] = set()

    def open(self, name: str) -> int:
        if name in self.failing:
            raise OSError(errno.EIO, "I/O error")
        return super().open(name)


class Chunks:
    """The part of a ChunkCache the scrub uses: resident chunks, stats, drops."""

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self.stats = SpokeStats()
        self.background_errors = ErrorCounts("background task", ["scrub"], logging.getLogger())
        self.resident: dict[str, Expected] = {}
        self.dropped: list[tuple[str, str]] = []
        self.listing_fails = False

    def add(self, name: str, data: bytes) -> None:
        self.store.write(name, data)
        self.resident[name] = Expected(len(data), "xxh3-128", digest("xxh3-128", data))

    def expectations(self) -> list[tuple[str, Expected]]:
        if self.listing_fails:
            self.listing_fails = False
            raise RuntimeError("listing failed")
        return list(self.resident.items())

    def expected(self, name: str) -> Expected | None:
        return self.resident.get(name)

    def drop_bad(self, name: str, cause: str) -> None:
        self.dropped.append((name, cause))
        self.resident.pop(name)

    def forget(self, name: str) -> None:
        self.resident.pop(name)


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrub, "ERROR_PAUSE_S", 0.0)
    monkeypatch.setattr(scrub, "PASS_PAUSE_S", 0.01)


async def scrub_until(chunks: Chunks, done: Callable[[], object]) -> None:
    """Run the scrub until ``done()`` holds (at most WAIT_S)."""
    task = asyncio.create_task(
        BackgroundScrub(chunks, rate_bytes_s=1 << 30).run_forever())  # type: ignore[arg-type]
    try:
        for _ in range(int(WAIT_S / 0.01)):
            if done():
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_scrub_drops_a_chunk_whose_bytes_changed_under_the_same_identity(
    tmp_path: Path,
) -> None:
    store = FailingStore(str(tmp_path / "cache"))
    chunks = Chunks(store)
    for i in range(3):
        chunks.add(f"c{i}", os.urandom(CHUNK))
    path = store.path_of("c1")
    before = os.stat(path)
    fd = os.open(path, os.O_WRONLY)  # rewritten, its mtime set back: reads would not look
    os.pwrite(fd, b"\0" * 16, 0)
    os.close(fd)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    # Until the pass is over, not just until c1 is dropped: the test's poll may come
    # between the scrub's steps on a loaded machine, before it reached c2.
    await scrub_until(chunks, lambda: chunks.dropped and chunks.stats.scrubbed_chunks >= 3)
    assert chunks.dropped == [("c1", "digest")]
    assert chunks.stats.scrubbed_chunks >= 3
    assert chunks.stats.scrubbed_bytes == chunks.stats.scrubbed_chunks * CHUNK


async def test_the_scrub_counts_its_errors_and_goes_on(tmp_path: Path) -> None:
    store = FailingStore(str(tmp_path / "cache"))
    chunks = Chunks(store)
    chunks.add("c0", os.urandom(CHUNK))
    chunks.add("c1", os.urandom(CHUNK))
    os.truncate(store.path_of("c1"), 10)
    store.failing.add("c0")  # the disk fails: not a bad chunk, an error
    chunks.listing_fails = True
    await scrub_until(chunks, lambda: chunks.dropped and chunks.stats.scrub_errors >= 3)
    assert chunks.dropped == [("c1", "size")]  # found past the errors
    assert chunks.stats.scrub_errors >= 3  # the listing once, then c0 at every pass
    assert "c0" in chunks.resident
    assert chunks.background_errors.counts["scrub"] == chunks.stats.scrub_errors
