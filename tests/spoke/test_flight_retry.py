"""A chunk flight's retry: a reader joining during the backoff waits for the next
attempt's bytes, and is never handed the failed attempt's (issue 25, item 4).

A real :class:`ChunkCache` (store and index in a temporary directory) with a fake
hub whose first attempt sends half the chunk and breaks, and a backoff the test
holds, so the join lands inside it every time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol.digests import digest
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache.clock import SYSTEM_CLOCK
from spoke.cache.engine import ChunkCache
from spoke.cache.flight import Filling
from spoke.cache.index import ChunkIndex
from spoke.cache.store import ChunkStore
from spoke.policy import make_policy
from spoke.upstream.errors import HubUnavailable
from spoke.upstream.resilience import RetryPolicy
from tests.support.backoff import HeldBackoff

CHUNK = 1 << 20
WAIT_S = 10.0


class FirstAttemptBreaks:
    """A hub whose first chunk fetch sends half the bytes and then breaks (once
    ``breaks`` is set: a test may hold the attempt between the two)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.attempts = 0
        self.breaks = asyncio.Event()
        self.breaks.set()

    async def chunk_size(self) -> int | None:
        return None

    async def fetch_into(
        self, path: str, etag: str | None, r: ByteRange, target: Filling, on_head: object = None,
    ) -> None:
        self.attempts += 1
        if self.attempts == 1:
            target.feed(self.data[r.start : r.start + r.length // 2])
            await self.breaks.wait()
            raise HubUnavailable("hub connection broke mid-body (injected)")
        target.feed(self.data[r.start : r.stop])


@pytest.fixture
def data() -> bytes:
    return random.Random(25).randbytes(CHUNK)


@pytest.fixture
def manifest(data: bytes) -> Manifest:
    return Manifest(path="ds/a.bin", size=len(data), etag='"v1"', chunk_size=CHUNK,
                    digest_alg="sha256", digests=(digest("sha256", data),))


@pytest.fixture
async def cache_with(
    tmp_path: Path, data: bytes
) -> AsyncIterator[tuple[ChunkCache, FirstAttemptBreaks, HeldBackoff]]:
    hub, backoff = FirstAttemptBreaks(data), HeldBackoff()
    cache = ChunkCache(
        store=ChunkStore(str(tmp_path)), index=ChunkIndex(str(tmp_path)),
        policy=make_policy("lru", 64 << 20), hub=hub, clock=SYSTEM_CLOCK,  # type: ignore[arg-type]
        capacity_bytes=64 << 20, meta_ttl_s=60.0, fetch_concurrency=4,
        retry=RetryPolicy(attempts=3), sleep=backoff.sleep,
    )
    await cache.open()
    yield cache, hub, backoff
    backoff.release.set()
    await cache.close()


async def test_a_reader_joining_during_the_backoff_waits_for_the_retry(
    cache_with: tuple[ChunkCache, FirstAttemptBreaks, HeldBackoff], manifest: Manifest,
    data: bytes,
) -> None:
    cache, hub, backoff = cache_with
    first = cache.stream(manifest, 0)  # starts the flight; waits for the verdict
    assert first.fill is not None
    await asyncio.wait_for(backoff.entered.wait(), WAIT_S)
    assert hub.attempts == 1

    joiner = cache.stream(manifest, 0)  # joins the flight in the backoff
    assert joiner.fill is first.fill
    handed = joiner.fill.take(0, CHUNK)  # what a streaming reader would send now
    backoff.release.set()
    await asyncio.wait_for(joiner.fill.wait_verified(), WAIT_S)  # the retry succeeded

    assert handed is None  # nothing of the failed attempt went to anyone
    assert hub.attempts == 2
    assert joiner.fill.data() == data
    assert cache.stats.singleflight_joins == 1 and cache.stats.fill_failures == 0


async def test_a_failed_attempt_whose_bytes_a_reader_has_is_final(
    cache_with: tuple[ChunkCache, FirstAttemptBreaks, HeldBackoff], manifest: Manifest,
) -> None:
    cache, hub, backoff = cache_with
    hub.breaks.clear()
    chunk = cache.stream(manifest, 0)
    assert chunk.fill is not None
    await asyncio.wait_for(chunk.fill.wait(1), WAIT_S)
    assert chunk.fill.take(0, 1) is not None  # a reader sent a byte of the first attempt
    hub.breaks.set()
    with pytest.raises(HubUnavailable):
        await asyncio.wait_for(chunk.fill.wait_verified(), WAIT_S)
    # Not retried: a retry's bytes could not be spliced onto those the reader sent.
    assert hub.attempts == 1 and not backoff.entered.is_set()


def test_only_an_attempt_nobody_has_bytes_of_is_taken_back() -> None:
    fill = Filling(100)
    fill.feed(b"x" * 40)
    assert fill.discard_attempt() and fill.received == 0
    assert fill.take(0, 40) is None
    fill.feed(b"y" * 40)
    assert fill.take(0, 10) is not None
    assert not fill.discard_attempt() and fill.received == 40
