"""ChunkCache built without HTTP: a fake upstream, a fake clock, a store in tmp_path.

The engine's promises, each checked where nothing else can blur them: a miss is
fetched once however many read it, a manifest lives exactly its TTL on the clock it
was given, a chunk that fails verification never reaches the disk, and the bytes on
disk stay within the capacity.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from protocol.digests import digest
from protocol.manifest import Manifest, encode_manifest
from protocol.ranges import ByteRange
from spoke.cache.engine import ChunkCache
from spoke.cache.index import ChunkIndex
from spoke.cache.store import ChunkStore
from spoke.policy import make_policy
from spoke.upstream.base import BodyTarget, HeadCheck
from spoke.upstream.errors import ChunkCorrupt, GoneAtHub, HubUnavailable
from spoke.upstream.resilience import RetryPolicy
from tests.support.clock import FakeClock

CHUNK = 4096
TTL_S = 30.0
WAIT_S = 10.0


class FakeUpstream:
    """Objects in memory, served as a hub would; counts what it is asked, can hold
    chunk fetches (``gate``), flip a byte of a chunk (``corrupt``) or be down."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.connections_opened = 0
        self.manifest_calls = 0
        self.chunk_calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked = asyncio.Event()  # a chunk fetch has been sent
        self.corrupt: set[tuple[str, int]] = set()
        self.down = False

    def manifest_of(self, path: str) -> Manifest:
        data = self.objects[path]
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        return Manifest(path=path, size=len(data), etag='"v1"', chunk_size=CHUNK,
                        digest_alg="sha256", digests=tuple(digest("sha256", c) for c in chunks))

    async def fetch_manifest(self, path: str) -> tuple[Manifest, bytes]:
        self.manifest_calls += 1
        if self.down:
            raise HubUnavailable("the fake hub is down")
        if path not in self.objects:
            raise GoneAtHub(path)
        manifest = self.manifest_of(path)
        return manifest, encode_manifest(manifest)

    async def fetch_into(
        self, path: str, etag: str | None, r: ByteRange, target: BodyTarget,
        on_head: HeadCheck | None = None,
    ) -> None:
        self.chunk_calls += 1
        self.asked.set()
        await self.gate.wait()
        data = bytearray(self.objects[path][r.start : r.stop])
        if (path, r.start // CHUNK) in self.corrupt:
            data[0] ^= 0xFF
        if on_head is not None:
            on_head('"v1"', r)
        target.space()[: len(data)] = data
        target.advance(len(data))

    async def chunk_size(self) -> int | None:
        return CHUNK

    async def list_objects(self, prefix: str) -> list[tuple[str, int]]:
        return [(p, len(d)) for p, d in self.objects.items() if p.startswith(prefix)]

    async def fetch_list(self, prefix: str, accept: str) -> tuple[bytes, str]:
        return repr(await self.list_objects(prefix)).encode(), "text/plain"

    async def close(self) -> None:
        return None


async def no_backoff(seconds: float) -> None:
    return None


Build = Callable[..., Awaitable[tuple[ChunkCache, FakeUpstream, FakeClock]]]


@pytest.fixture
async def build(tmp_path: Path) -> AsyncIterator[Build]:
    opened: list[ChunkCache] = []

    async def make(
        objects: dict[str, bytes], capacity_bytes: int = 1 << 20, max_age_s: float = 0.0,
    ) -> tuple[ChunkCache, FakeUpstream, FakeClock]:
        upstream, clock = FakeUpstream(objects), FakeClock()
        cache = ChunkCache(
            store=ChunkStore(str(tmp_path)), index=ChunkIndex(str(tmp_path)),
            policy=make_policy("lru", capacity_bytes), hub=upstream, clock=clock.clock(),
            capacity_bytes=capacity_bytes, meta_ttl_s=TTL_S, fetch_concurrency=4,
            max_age_s=max_age_s, retry=RetryPolicy(attempts=2), sleep=no_backoff,
        )
        await cache.open()
        opened.append(cache)
        return cache, upstream, clock

    yield make
    for cache in opened:
        await cache.close()


def data_of(n_chunks: int) -> bytes:
    return bytes(i % 251 for i in range(n_chunks * CHUNK))


async def test_a_miss_is_fetched_once_for_concurrent_readers(build: Build) -> None:
    data = data_of(2)
    cache, upstream, _ = await build({"ds/a": data})
    manifest, stale = await cache.manifest("ds/a")
    upstream.gate.clear()  # the fetch waits until every reader has asked
    readers = [asyncio.create_task(cache.get(manifest, 1)) for _ in range(5)]
    await asyncio.wait_for(upstream.asked.wait(), WAIT_S)
    await asyncio.sleep(0)  # the readers' own turns, queued before the fetch's
    assert (upstream.chunk_calls, cache.stats.misses) == (1, 5)
    upstream.gate.set()
    chunks = await asyncio.gather(*readers)
    assert [c.data for c in chunks] == [data[CHUNK:]] * 5
    assert (upstream.chunk_calls, cache.stats.hub_fetches, cache.stats.singleflight_joins) == (
        1, 1, 4)
    assert cache.is_cached(manifest, 1) and not cache.is_cached(manifest, 0)
    assert not stale and cache.fetches_in_flight == 0
    hit = await cache.get(manifest, 1)  # from disk now
    assert hit.hit and await cache.read(hit, 0, CHUNK) == data[CHUNK:]
    assert upstream.chunk_calls == 1


async def test_a_manifest_lives_its_ttl_on_the_clock_given(build: Build) -> None:
    cache, upstream, clock = await build({"ds/a": data_of(1)})
    first, _ = await cache.manifest("ds/a")
    clock.advance(TTL_S - 0.001)
    assert cache.fresh_manifest("ds/a") == first
    assert (await cache.manifest("ds/a"))[0] == first and upstream.manifest_calls == 1
    assert cache.manifest_time_left("ds/a") == pytest.approx(0.001)
    clock.advance(0.002)
    assert cache.fresh_manifest("ds/a") is None and cache.manifest_time_left("ds/a") == 0
    assert (await cache.manifest("ds/a")) == (first, False)
    assert upstream.manifest_calls == 2


async def test_a_known_manifest_stands_in_while_the_upstream_is_down(build: Build) -> None:
    cache, upstream, clock = await build({"ds/a": data_of(1)})
    first, _ = await cache.manifest("ds/a")
    upstream.down = True
    clock.advance(TTL_S + 1)
    assert await cache.manifest("ds/a") == (first, True)
    assert cache.stats.stale_manifests == 1 and upstream.manifest_calls == 3  # two attempts


async def test_a_corrupt_fetch_is_not_published(build: Build) -> None:
    data = data_of(2)
    cache, upstream, _ = await build({"ds/a": data})
    manifest, _ = await cache.manifest("ds/a")
    upstream.corrupt.add(("ds/a", 0))
    with pytest.raises(ChunkCorrupt):
        await cache.get(manifest, 0)
    assert upstream.chunk_calls == 2  # retried once, corrupt again
    assert cache.stats.verify_failures == 2 and cache.stats.fill_failures == 1
    assert not cache.is_cached(manifest, 0) and cache.used_bytes == 0
    assert cache.store.scan() == (set(), [])  # no file, not even a temporary one
    assert await cache.db.run(cache.index.rows) == []
    upstream.corrupt.clear()
    assert (await cache.get(manifest, 0)).data == data[:CHUNK]  # fetched anew, and kept
    assert cache.is_cached(manifest, 0)


async def test_the_bytes_on_disk_stay_within_the_capacity(build: Build) -> None:
    data = data_of(6)
    cache, _, _ = await build({"ds/a": data}, capacity_bytes=2 * CHUNK)
    manifest, _ = await cache.manifest("ds/a")
    for index in range(6):
        chunk = await cache.get(manifest, index)
        assert chunk.data == data[index * CHUNK : (index + 1) * CHUNK]
        assert cache.used_bytes <= 2 * CHUNK
    on_disk, _ = cache.store.scan()
    assert len(on_disk) == cache.chunk_count == 2 and cache.stats.evictions == 4
    assert [cache.is_cached(manifest, i) for i in range(6)] == [False] * 4 + [True] * 2
    assert sorted(r.name for r in await cache.db.run(cache.index.rows)) == sorted(on_disk)


async def test_chunks_past_their_max_age_expire_on_the_wall_clock(build: Build) -> None:
    cache, _, clock = await build({"ds/a": data_of(2)}, max_age_s=60.0)
    manifest, _ = await cache.manifest("ds/a")
    await cache.get(manifest, 0)
    clock.advance(59)
    await cache.get(manifest, 1)
    assert await cache.expire() == 0
    clock.advance(2)
    assert await cache.expire() == 1
    assert [cache.is_cached(manifest, i) for i in range(2)] == [False, True]
