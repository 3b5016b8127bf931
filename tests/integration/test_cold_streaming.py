"""A cold read streams: a loader gets a chunk's bytes as they arrive from the hub.

The hub's backend here holds (or breaks, or corrupts) its reads of the second half
of a chunk, so the test decides what the spoke has received when. A loader must get
the first half while the hub still holds the second; a chunk that then fails its
digest, or whose hub connection breaks, must cut the loader's connection (a short
body, never wrong bytes passed off as whole) and leave nothing cached.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hub.backend import OpenObject
from hub.config import HubConfig
from protocol.ranges import ByteRange
from spoke.cache.keys import ChunkKey
from spoke.config import SpokeConfig
from spoke.serve.handlers import CACHE
from spoke.serve.reader import RangeReader
from spoke.upstream.errors import ChunkCorrupt
from tests.support.cache_dir import chunk_files
from tests.support.servers import (
    GatedBackend,
    RunningServer,
    start_hub,
    start_spoke,
    write_dataset,
)
from tests.support.waits import settled_stats

CHUNK = 2 << 20  # the hub reads 1 MiB at a time: two reads per chunk
HALF = CHUNK // 2
PATH = "ds/two-chunks.bin"
SIZE = 2 * CHUNK
# Only a guard against a hang (the bug this file tests for): never a timing assertion.
HANG_S = 30.0


class HalfGate(GatedBackend):
    """The real filesystem backend; reads of the second half of a chunk are held at
    ``gate`` until it opens, and can be made to fail or to come back corrupted."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.holding = threading.Event()  # a second-half read waits at the gate
        self.fail = False

    def open(self, path: str) -> OpenObject:
        return _HalfGated(self, self.inner.open(path))


class _HalfGated:
    """No ``fileno``: the hub reads it block by block (no sendfile), through the gate."""

    def __init__(self, backend: HalfGate, inner: OpenObject) -> None:
        self._backend = backend
        self._inner = inner
        self.info = inner.info

    def read(self, offset: int, length: int) -> bytes:
        backend = self._backend
        if offset % CHUNK >= HALF:
            backend.holding.set()
            if not backend.gate.wait(timeout=HANG_S):
                raise TimeoutError("test gate never opened")
            if backend.fail:
                raise OSError("injected read failure")
        data = self._inner.read(offset, length)
        if backend.corrupt and offset % CHUNK >= HALF and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def close(self) -> None:
        self._inner.close()


@dataclass
class Lab:
    hub: RunningServer
    spoke: RunningServer
    backend: HalfGate
    data: bytes
    cache_dir: Path

    @property
    def url(self) -> str:
        return f"{self.spoke.url}/objects/{PATH}"

    def close_gate(self) -> None:
        self.backend.holding.clear()
        self.backend.gate.clear()


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    root = tmp_path / "hub-root"
    root.mkdir()
    data = write_dataset(str(root), {PATH: SIZE})[PATH]
    backend = HalfGate(str(root))
    hub = await start_hub(HubConfig(root=str(root), chunk_size=CHUNK), backend)
    cache_dir = tmp_path / "cache"
    spoke = await start_spoke(SpokeConfig(
        hub_url=hub.url, cache_dir=str(cache_dir), capacity_bytes=64 << 20,
        sequential_readahead_chunks=0, readahead_chunks=0, fetch_attempts=3,
        # The gate stalls the hub on purpose, for as long as the test takes on a loaded
        # machine: the spoke must not take that for a hub that stopped answering.
        read_timeout_s=HANG_S,
    ))
    try:
        yield Lab(hub, spoke, backend, data, cache_dir)
    finally:
        backend.gate.set()
        await spoke.stop()
        await hub.stop()


async def wait_until_quiet(http: aiohttp.ClientSession, lab: Lab) -> dict[str, Any]:
    """/stats once no chunk is being fetched or stored (a failed flight ends just after
    the cut; a served chunk lands on disk just after its answer)."""
    return await settled_stats(http, lab.spoke.url, timeout_s=HANG_S)


async def first_half_while_held(resp: aiohttp.ClientResponse, lab: Lab) -> bytes:
    """The first half of chunk 0, read while the hub still holds the second half."""
    head = await asyncio.wait_for(resp.content.readexactly(HALF), HANG_S)
    assert not lab.backend.gate.is_set()  # closed before the read: no second half yet
    return head


async def test_a_cold_reader_gets_the_first_half_while_the_hub_holds_the_second(
    lab: Lab, http: aiohttp.ClientSession
) -> None:
    lab.close_gate()
    async with http.get(lab.url, headers={"Range": f"bytes=0-{CHUNK - 1}"}) as resp:
        assert (resp.status, resp.headers["X-Cache"]) == (206, "MISS")
        assert await first_half_while_held(resp, lab) == lab.data[:HALF]
        lab.backend.gate.set()
        assert await resp.content.read() == lab.data[HALF:CHUNK]
    doc = await wait_until_quiet(http, lab)
    assert (doc["hub_fetches"], doc["cached_chunks"], doc["used_bytes"]) == (1, 1, CHUNK)
    assert doc["bytes_served_miss"] == CHUNK
    async with http.get(lab.url, headers={"Range": f"bytes=0-{CHUNK - 1}"}) as resp:
        assert (resp.status, resp.headers["X-Cache"]) == (206, "HIT")
        assert await resp.read() == lab.data[:CHUNK]


async def test_a_reader_joining_the_flight_streams_from_the_same_fetch(
    lab: Lab, http: aiohttp.ClientSession
) -> None:
    lab.close_gate()
    headers = {"Range": f"bytes=0-{CHUNK - 1}"}
    async with http.get(lab.url, headers=headers) as first:
        assert await first_half_while_held(first, lab) == lab.data[:HALF]
        # The second reader arrives mid-chunk: it joins the fetch under way and gets
        # what has arrived at once, the rest as it comes.
        async with http.get(lab.url, headers=headers) as second:
            assert await first_half_while_held(second, lab) == lab.data[:HALF]
            lab.backend.gate.set()
            assert await second.content.read() == lab.data[HALF:CHUNK]
        assert await first.content.read() == lab.data[HALF:CHUNK]
    doc = await wait_until_quiet(http, lab)
    assert (doc["hub_fetches"], doc["singleflight_joins"], doc["misses"]) == (1, 1, 2)
    assert doc["cached_chunks"] == 1


@pytest.mark.parametrize("failure", ["corrupt", "hub_breaks"])
async def test_a_chunk_failing_after_partial_streaming_cuts_the_reader_and_caches_nothing(
    lab: Lab, http: aiohttp.ClientSession, failure: str
) -> None:
    lab.close_gate()
    if failure == "corrupt":
        lab.backend.corrupt = True  # the second half comes back with a flipped byte
    else:
        lab.backend.fail = True  # the hub cannot read it and cuts its own response
    async with http.get(lab.url) as resp:  # the whole object: both chunks
        assert (resp.status, int(resp.headers["Content-Length"])) == (200, SIZE)
        assert await first_half_while_held(resp, lab) == lab.data[:HALF]
        lab.backend.gate.set()
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(resp.content.read(), HANG_S)
    doc = await wait_until_quiet(http, lab)
    # The loader had bytes of that fetch, so it was not tried again: it failed, whole.
    assert (doc["hub_fetches"], doc["fill_failures"]) == (1, 1)
    assert doc["verify_failures"] == (1 if failure == "corrupt" else 0)
    assert (doc["cached_chunks"], doc["used_bytes"]) == (0, 0)
    assert chunk_files(lab.cache_dir) == [] and os.listdir(lab.cache_dir / "tmp") == []

    lab.backend.corrupt = lab.backend.fail = False
    for expected in ("MISS", "HIT"):
        async with http.get(lab.url) as resp:
            assert (resp.status, resp.headers["X-Cache"]) == (200, expected)
            assert await resp.read() == lab.data
    await wait_until_quiet(http, lab)  # the chunks answered land on disk just after
    assert len(chunk_files(lab.cache_dir)) == 2


async def test_a_small_read_inside_a_failing_chunk_is_never_served_whole(
    lab: Lab, http: aiohttp.ClientSession
) -> None:
    """A part no longer than the verdict hold goes out only once its chunk is verified."""
    lab.backend.corrupt = True
    start = HALF + 10
    async with http.get(lab.url, headers={"Range": f"bytes={start}-{start + 99}"}) as resp:
        try:
            body: bytes | None = await resp.read()
        except aiohttp.ClientPayloadError:
            body = None  # cut: the headers had gone before the verdict
        status = resp.status
    assert status == 502 or (status == 206 and body is None), (status, body)
    doc = await wait_until_quiet(http, lab)
    assert doc["verify_failures"] == doc["hub_fetches"] >= 2  # retried: nothing was sent
    assert (doc["cached_chunks"], doc["used_bytes"]) == (0, 0)


async def test_priming_with_the_first_range_turns_a_failing_small_read_into_a_status(
    lab: Lab, http: aiohttp.ClientSession
) -> None:
    """Told the answer's first range, ``prime`` waits for the verdict of a small part,
    so the error can still become a status (with the index alone it cannot know)."""
    lab.backend.corrupt = True
    cache = lab.spoke.app[CACHE]
    manifest, _ = await cache.manifest(PATH)
    reader = RangeReader(cache, manifest, readahead=0)
    with pytest.raises(ChunkCorrupt):
        await asyncio.wait_for(reader.prime(0, ByteRange(HALF + 10, HALF + 110)), HANG_S)
    assert cache.stats.verify_failures == cache.stats.hub_fetches >= 2
    assert not cache.is_cached(manifest, 0)
    # A large first part starts streaming as soon as the hub answers.
    lab.backend.corrupt = False
    lab.close_gate()
    streaming = RangeReader(cache, manifest, readahead=0)
    await asyncio.wait_for(streaming.prime(1, ByteRange(CHUNK, SIZE)), HANG_S)
    assert await asyncio.to_thread(lab.backend.holding.wait, HANG_S)
    assert not cache.is_cached(manifest, 1)
    lab.backend.gate.set()
    got: list[bytes] = []

    async def collect(data: bytes) -> None:
        got.append(data)

    await asyncio.wait_for(streaming.write(ByteRange(CHUNK, SIZE), collect), HANG_S)
    assert b"".join(got) == lab.data[CHUNK:]
    # An answer ends once its chunks are verified: local from then on, in memory
    # while they are being stored, then on disk.
    assert cache.is_local(ChunkKey.of(manifest, 1).name)
    await wait_until_quiet(http, lab)
    assert cache.is_cached(manifest, 1)
