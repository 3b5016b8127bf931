"""Purging cached objects (``DELETE /cache/...``) and objects missing at the hub."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import FILES, SpokeFactory
from tests.support.cache_dir import chunk_files
from tests.support.clock import FakeClock
from tests.support.servers import RunningServer
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
PROBLEM = "application/problem+json"


async def read(http: aiohttp.ClientSession, spoke_url: str, path: str) -> tuple[str, bytes]:
    """GET a whole object; returns its X-Cache and body (asserting a 200)."""
    async with http.get(f"{spoke_url}/objects/{path}") as resp:
        assert resp.status == 200, path
        return resp.headers["X-Cache"], await resp.read()


async def purge(http: aiohttp.ClientSession, spoke_url: str, target: str) -> int:
    async with http.delete(f"{spoke_url}/cache/{target}") as resp:
        assert resp.status == 200
        body = await resp.json()
    purged: int = body["purged_chunks"]
    return purged


async def test_purging_an_object_removes_its_chunks_and_the_next_read_misses(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    files = dataset[1]
    cache_dir = tmp_path / "cache"
    for path in ("ds/big.bin", "ds/small.bin"):
        assert await read(http, spoke.url, path) == ("MISS", files[path])
    await settled_stats(http, spoke.url)
    assert len(chunk_files(cache_dir)) == 41 + 1

    assert await purge(http, spoke.url, "ds/big.bin") == 41
    stats = await settled_stats(http, spoke.url)
    assert (stats["used_bytes"], stats["cached_chunks"]) == (FILES["ds/small.bin"], 1)
    assert stats["purged_chunks"] == 41
    assert len(chunk_files(cache_dir)) == 1
    assert await purge(http, spoke.url, "ds/big.bin") == 0  # nothing left to purge

    assert await read(http, spoke.url, "ds/big.bin") == ("MISS", files["ds/big.bin"])
    assert await read(http, spoke.url, "ds/small.bin") == ("HIT", files["ds/small.bin"])
    stats = await settled_stats(http, spoke.url)
    assert stats["hub_fetches"] == 41 + 1 + 41


async def test_purging_a_prefix_removes_only_the_objects_under_it(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    files = dataset[1]
    for path in ("ds/partial.bin", "ds/small.bin", "ds/one-byte.bin", "other/notes.csv"):
        assert await read(http, spoke.url, path) == ("MISS", files[path])

    assert await purge(http, spoke.url, "ds/") == 6 + 1 + 1
    stats = await settled_stats(http, spoke.url)
    assert (stats["used_bytes"], stats["cached_chunks"]) == (FILES["other/notes.csv"], 1)
    assert len(chunk_files(tmp_path / "cache")) == 1

    assert await read(http, spoke.url, "other/notes.csv") == ("HIT", files["other/notes.csv"])
    assert await read(http, spoke.url, "ds/partial.bin") == ("MISS", files["ds/partial.bin"])
    assert await purge(http, spoke.url, "ds/") == 6
    assert await purge(http, spoke.url, "other/") == 1
    assert (await settled_stats(http, spoke.url))["used_bytes"] == 0


async def test_an_object_missing_at_the_hub_is_a_404_problem_and_the_spoke_carries_on(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    files = dataset[1]
    for headers in ({}, {"Range": "bytes=0-9"}):
        async with http.get(f"{spoke.url}/objects/ds/missing.bin", headers=headers) as resp:
            assert resp.status == 404
            assert resp.content_type == PROBLEM
            problem = await resp.json(content_type=PROBLEM)
        assert problem["status"] == 404
        assert problem["title"] and "ds/missing.bin" in problem["detail"]
    async with http.head(f"{spoke.url}/objects/ds/missing.bin") as resp:
        assert resp.status == 404

    # The misses may each have asked for a first chunk on a guess (spoke.cache.early), which
    # counts as a fetch; the spoke carries on with one fetch for the next object.
    before = await settled_stats(http, spoke.url)
    assert await read(http, spoke.url, "ds/small.bin") == ("MISS", files["ds/small.bin"])
    async with http.get(f"{spoke.url}/healthz") as resp:
        assert resp.status == 200
    stats = await settled_stats(http, spoke.url)
    assert stats["hub_fetches"] - before["hub_fetches"] == 1
    assert (stats["fill_failures"], stats["cached_chunks"]) == (0, 1)


async def test_an_object_deleted_at_the_hub_becomes_a_404_after_the_ttl(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    root, files = dataset
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), meta_ttl_s=0.3)
    assert await read(http, spoke.url, "ds/small.bin") == ("MISS", files["ds/small.bin"])
    (root / "ds/small.bin").unlink()
    clock.advance(0.301)  # past the metadata TTL
    async with http.get(f"{spoke.url}/objects/ds/small.bin") as resp:
        assert resp.status == 404
        assert resp.content_type == PROBLEM
    assert await read(http, spoke.url, "ds/exact.bin") == ("MISS", files["ds/exact.bin"])
