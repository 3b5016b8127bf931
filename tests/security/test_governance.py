"""Governance of cached bytes: per-tenant accounting and quota, max age, hub deletions."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import CHUNK, SpokeFactory
from tests.security.conftest import AuthSpokeFactory, Dataset, Mint, call
from tests.support.cache_dir import chunk_files
from tests.support.clock import FakeClock
from tests.support.waits import settled_stats


async def test_tenant_bytes_and_quota(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession,
    dataset: Dataset,
) -> None:
    _, files = dataset
    spoke = await make_auth_spoke(tenant_quota_bytes=4 * CHUNK)
    a, b = mint("team-a", ["ds/"]), mint("team-b", ["ds/", "other/"])
    admin = mint("ops", [""], admin=True)
    # team-b caches one small object; team-a then reads 10 chunks under a 4-chunk quota.
    assert (await call(http, f"{spoke.url}/objects/other/notes.csv", b))[0] == 200
    status, _, body = await call(http, f"{spoke.url}/objects/ds/big.bin", a,
                                 headers={"Range": f"bytes=0-{10 * CHUNK - 1}"})
    assert status == 206 and body == files["ds/big.bin"][:10 * CHUNK]
    stats = await settled_stats(http, spoke.url, headers={"Authorization": f"Bearer {admin}"})
    # Read-ahead fills run concurrently: some are served without being kept, the
    # rest evict team-a's own older chunks. Never anyone else's.
    assert stats["tenant_bytes"]["team-b"] == 3000
    assert 0 < stats["tenant_bytes"]["team-a"] <= 4 * CHUNK
    assert stats["quota_evictions"] + stats["uncached_fills"] >= 6
    assert stats["evictions"] == 0
    # team-b's object survived team-a's scan.
    _, headers, _ = await call(http, f"{spoke.url}/objects/other/notes.csv", b)
    assert headers["X-Cache"] == "HIT"


async def test_stats_with_tenants_needs_admin(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession
) -> None:
    spoke = await make_auth_spoke()
    assert (await call(http, f"{spoke.url}/stats", mint("team-a", ["ds/"])))[0] == 403


async def test_max_age_drops_old_chunks_even_with_room_left(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), max_age_s=60)
    async with http.get(f"{spoke.url}/objects/ds/partial.bin") as resp:
        await resp.read()
    await settled_stats(http, spoke.url)
    from spoke.serve.handlers import CACHE

    cache = spoke.app[CACHE]
    clock.advance(59)
    assert await cache.expire() == 0  # young chunks stay
    clock.advance(2)
    assert await cache.expire() == 6
    assert cache.used_bytes == 0 and len(chunk_files(tmp_path / "cache")) == 0
    async with http.get(f"{spoke.url}/stats") as resp:
        assert (await resp.json())["expired_chunks"] == 6
    async with http.get(f"{spoke.url}/objects/ds/partial.bin") as resp:
        assert resp.headers["X-Cache"] == "MISS"


async def test_max_age_flag_parses_durations() -> None:
    from spoke.config import config_from_args, parse_args

    base = ["serve", "--hub", "http://h", "--cache-dir", "d", "--capacity", "1GiB"]
    for text, seconds in (("0", 0), ("90", 90), ("30m", 1800), ("7d", 604800)):
        args = parse_args([*base, "--max-age", text], {})
        assert config_from_args(args).max_age_s == seconds
    assert config_from_args(parse_args(base, {"HUBSPOKE_MAX_AGE": "2h"})).max_age_s == 7200


async def test_an_object_deleted_at_the_hub_is_dropped_after_the_ttl(
    make_spoke: SpokeFactory, dataset: Dataset, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    root, _ = dataset
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), meta_ttl_s=0.2)
    async with http.get(f"{spoke.url}/objects/ds/exact.bin") as resp:
        await resp.read()
    await settled_stats(http, spoke.url)
    assert len(chunk_files(tmp_path / "cache")) == 4
    (root / "ds" / "exact.bin").unlink()
    async with http.get(f"{spoke.url}/objects/ds/exact.bin") as resp:
        assert resp.status == 200  # still within the TTL
    clock.advance(0.201)  # past it
    async with http.get(f"{spoke.url}/objects/ds/exact.bin") as resp:
        assert resp.status == 404
    assert len(chunk_files(tmp_path / "cache")) == 0
    async with http.get(f"{spoke.url}/stats") as resp:
        stats = await resp.json()
    assert (stats["used_bytes"], stats["purged_chunks"]) == (0, 4)
