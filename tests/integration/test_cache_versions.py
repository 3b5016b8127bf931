"""An object that changes at the hub: the spoke serves one whole version, never a mix.

Chunks are keyed by (path, etag), so a new version is new chunks; once the metadata
TTL runs out the spoke sees the new etag. A change in the middle of a response
must end that response (a cut connection) rather than splice the versions.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import GatedBackend, RunningServer

Dataset = tuple[Path, dict[str, bytes]]
Change = Callable[[Path, bytes], None]
TTL_S = 0.5
WAIT_S = 10.0


async def read(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.get(url, headers=headers or {}) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


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
    spoke = await make_spoke(meta_ttl_s=TTL_S)
    url = f"{spoke.url}/objects/ds/partial.bin"
    old = files["ds/partial.bin"]
    rng = random.Random(11)

    status, headers, body = await read(http, url)
    assert (status, headers["X-Cache"], body) == (200, "MISS", old)
    etags = [headers["ETag"]]
    status, headers, body = await read(http, url)
    assert (status, headers["X-Cache"], body) == (200, "HIT", old)

    for new in (rng.randbytes(len(old)), rng.randbytes(len(old) + 5000)):
        change(root / "ds/partial.bin", new)
        await asyncio.sleep(TTL_S + 0.2)
        status, headers, body = await read(http, url)
        assert (status, headers["X-Cache"]) == (200, "MISS")
        assert body == new
        assert headers["Content-Length"] == str(len(new))
        assert headers["ETag"] not in etags
        etags.append(headers["ETag"])
        # A range straddling two chunks comes from the new version too.
        start, stop = CHUNK - 10, 2 * CHUNK + 10
        status, headers, body = await read(http, url, {"Range": f"bytes={start}-{stop - 1}"})
        assert (status, headers["ETag"], body) == (206, etags[-1], new[start:stop])
        assert headers["X-Cache"] == "HIT"


async def test_within_the_ttl_the_spoke_keeps_serving_the_version_it_knows(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    root, files = dataset
    spoke = await make_spoke(meta_ttl_s=30.0)
    url = f"{spoke.url}/objects/ds/exact.bin"
    old = files["ds/exact.bin"]
    assert (await read(http, url))[2] == old
    replace_by_rename(root / "ds/exact.bin", random.Random(3).randbytes(len(old)))
    status, headers, body = await read(http, url)
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
    status, headers, body = await read(http, url)
    assert (status, body) == (200, new)
    assert headers["ETag"] != old_etag
