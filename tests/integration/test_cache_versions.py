"""An object that changes at the hub: the spoke serves one whole version, never a mix.

Chunks are keyed by (path, etag), so a new version is new chunks; once the metadata
TTL runs out the spoke sees the new etag. A change in the middle of a response
must end that response (a cut connection) rather than splice the versions.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from hub.backend import FilesystemBackend, ObjectInfo
from hub.config import HubConfig
from hub.handlers import BACKEND
from spoke.client.clients import AsyncClient
from tests.conftest import CHUNK, SpokeFactory
from tests.support.clock import FakeClock
from tests.support.http import fetch
from tests.support.raw_http import raw_get
from tests.support.servers import GatedBackend, RunningServer, start_hub
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
Change = Callable[[Path, bytes], None]
TTL_S = 0.5
WAIT_S = 10.0


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Overwrite the file's bytes (same inode), as an editor or ``cp`` would."""
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(data)


def replace_by_rename(path: Path, data: bytes) -> None:
    """Publish a new version atomically (new inode), as a careful writer would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("change", [rewrite_in_place, replace_by_rename])
async def test_a_changed_object_is_served_whole_in_its_new_version_after_the_ttl(
    change: Change, make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    root, files = dataset
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), meta_ttl_s=TTL_S)
    url = f"{spoke.url}/objects/ds/partial.bin"
    old = files["ds/partial.bin"]
    rng = random.Random(11)

    status, headers, body = await fetch(http, url)
    assert (status, headers["X-Cache"], body) == (200, "MISS", old)
    etags = [headers["ETag"]]
    status, headers, body = await fetch(http, url)
    assert (status, headers["X-Cache"], body) == (200, "HIT", old)

    for new in (rng.randbytes(len(old)), rng.randbytes(len(old) + 5000)):
        change(root / "ds/partial.bin", new)
        clock.advance(TTL_S + 0.001)  # past the metadata TTL
        status, headers, body = await fetch(http, url)
        assert (status, headers["X-Cache"]) == (200, "MISS")
        assert body == new
        assert headers["Content-Length"] == str(len(new))
        assert headers["ETag"] not in etags
        etags.append(headers["ETag"])
        # A range straddling two chunks comes from the new version too.
        start, stop = CHUNK - 10, 2 * CHUNK + 10
        status, headers, body = await fetch(http, url, {"Range": f"bytes={start}-{stop - 1}"})
        assert (status, headers["ETag"], body) == (206, etags[-1], new[start:stop])
        assert headers["X-Cache"] == "HIT"


async def test_within_the_ttl_the_spoke_keeps_serving_the_version_it_knows(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    root, files = dataset
    spoke = await make_spoke(meta_ttl_s=30.0)
    url = f"{spoke.url}/objects/ds/exact.bin"
    old = files["ds/exact.bin"]
    assert (await fetch(http, url))[2] == old
    replace_by_rename(root / "ds/exact.bin", random.Random(3).randbytes(len(old)))
    status, headers, body = await fetch(http, url)
    assert (status, headers["X-Cache"], body) == (200, "HIT", old)


@pytest.mark.parametrize("change", [rewrite_in_place, replace_by_rename])
async def test_a_change_in_the_middle_of_a_response_never_splices_versions(
    change: Change, hub: RunningServer, spoke: RunningServer, gated: GatedBackend,
    dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    root, files = dataset
    old = files["ds/big.bin"]
    new = random.Random(5).randbytes(len(old))
    url = f"{spoke.url}/objects/ds/big.bin"
    async with http.head(url) as resp:  # hub hashes and spoke learns the old version
        assert resp.status == 200
        old_etag = resp.headers["ETag"]
    gated.drain()

    async def get_whole() -> tuple[int, str, bytes, bool]:
        """(status, content type, body received, whether the body was cut short)."""
        async with http.get(url) as resp:
            chunks: list[bytes] = []
            try:
                async for block in resp.content.iter_any():
                    chunks.append(block)
            except aiohttp.ClientPayloadError:
                return resp.status, resp.content_type, b"".join(chunks), True
            return resp.status, resp.content_type, b"".join(chunks), False

    gated.gate.clear()
    try:
        task = asyncio.create_task(get_whole())
        # The hub is now holding the read of chunk 0, the only one fetched before headers.
        assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
        change(root / "ds/big.bin", new)
    finally:
        gated.gate.set()
    status, content_type, body, cut = await asyncio.wait_for(task, WAIT_S)

    if status == 200 and not cut:
        assert body in (old, new)  # one whole version
    elif status == 200:
        assert len(body) < len(old)
        assert body == old[: len(body)]  # the old version's prefix, then a cut
    else:
        assert status in (502, 503)  # failed before headers: clean problem+json
        assert content_type == "application/problem+json"
        assert not cut

    # Afterwards the new version is served, whole.
    status, headers, body = await fetch(http, url)
    assert (status, body) == (200, new)
    assert headers["ETag"] != old_etag


# -- the hub's 409 "changed while hashed; retry": retried, then a 503 to retry -------


class ChangesWhileHashed(FilesystemBackend):
    """The filesystem, but the next ``rewrites`` manifests the hub hashes find the
    object changed by the time they are done (the hub answers 409 for each)."""

    def __init__(self, root: str, rewrites: int) -> None:
        super().__init__(root)
        self.rewrites = rewrites
        self.hashed = 0

    def still_current(self, info: ObjectInfo) -> bool:
        self.hashed += 1
        if self.rewrites:
            self.rewrites -= 1
            return False
        return super().still_current(info)


@pytest.fixture
async def hub_of(dataset: Dataset) -> AsyncIterator[Callable[[int], Awaitable[RunningServer]]]:
    """Starts a hub whose next ``rewrites`` manifests are of an object being rewritten."""
    started: list[RunningServer] = []

    async def start(rewrites: int) -> RunningServer:
        backend = ChangesWhileHashed(str(dataset[0]), rewrites)
        server = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK), backend)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


def hashed(hub: RunningServer) -> int:
    backend = hub.app[BACKEND]
    assert isinstance(backend, ChangesWhileHashed)
    return backend.hashed


async def test_a_manifest_the_hub_hashed_while_it_changed_is_asked_for_again(
    hub_of: Callable[[int], Awaitable[RunningServer]], make_spoke: SpokeFactory,
    dataset: Dataset,
) -> None:
    hub = await hub_of(1)
    spoke = await make_spoke(hub_url=hub.url)
    answer = await raw_get(spoke.url, "/objects/ds/small.bin")
    assert (answer.status, answer.complete) == (200, True), answer.describe()
    assert answer.body == dataset[1]["ds/small.bin"]
    assert hashed(hub) == 2  # the 409, then the version current now


async def test_an_object_that_keeps_changing_gets_503_with_retry_after(
    hub_of: Callable[[int], Awaitable[RunningServer]], make_spoke: SpokeFactory,
    http: aiohttp.ClientSession,
) -> None:
    hub = await hub_of(1_000_000)
    spoke = await make_spoke(hub_url=hub.url, fetch_attempts=3, breaker_threshold=1)
    for through_aiohttp in (False, True):
        answer = await raw_get(spoke.url, "/objects/ds/small.bin", through_aiohttp=through_aiohttp)
        assert (answer.status, answer.complete) == (503, True), answer.describe()
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert json.loads(answer.body)["status"] == 503
    assert hashed(hub) == 2 * 3  # the spoke's own retries, bounded
    # The hub answered every time: the link is fine, the breaker stays closed.
    assert (await settled_stats(http, spoke.url))["breaker_state"] == "closed"


async def test_the_client_reads_an_object_through_its_rewrite(
    hub_of: Callable[[int], Awaitable[RunningServer]], make_spoke: SpokeFactory,
    dataset: Dataset,
) -> None:
    # More 409s than the spoke retries: its 503 and Retry-After have the project's
    # client ask again, and the read succeeds.
    hub = await hub_of(2)
    spoke = await make_spoke(hub_url=hub.url, fetch_attempts=2)
    async with AsyncClient(spoke.url, max_retries=2) as client:
        assert await client.read("ds/small.bin") == dataset[1]["ds/small.bin"]
    assert hashed(hub) == 3
