"""Pinned prefixes stay cached whatever else is read (up to --pin-fraction)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CHUNK, SpokeFactory
from tests.support.waits import settled_stats


async def test_a_pinned_prefix_survives_a_scan_that_evicts_everything_else(
    make_spoke: SpokeFactory, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    spoke = await make_spoke(capacity_bytes=10 * CHUNK, pinned_prefixes=("other/", "ds/small"),
                             pin_fraction=0.5, policy="lru")
    for path in ("other/notes.csv", "ds/small.bin", "ds/big.bin", "ds/partial.bin"):
        async with http.get(f"{spoke.url}/objects/{path}") as resp:
            assert await resp.read() == files[path]
    stats = await settled_stats(http, spoke.url)
    assert stats["pinned_bytes"] == 3000 + 1000
    # The scan's 47 chunks pass through room for ~8: each either evicted one or, finding
    # none free while others were in flight or being stored, was served uncached. How
    # they split depends on how far the disk lags the reads (a chunk being stored holds
    # its room and cannot be evicted); the sum does not.
    assert stats["evictions"] + stats["uncached_fills"] > 30
    assert stats["evictions"] > 0 and stats["used_bytes"] <= 10 * CHUNK
    for path in ("other/notes.csv", "ds/small.bin"):
        async with http.get(f"{spoke.url}/objects/{path}") as resp:
            assert resp.headers["X-Cache"] == "HIT"
            assert await resp.read() == files[path]
    async with http.get(f"{spoke.url}/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    info = families["spoke_policy_info"].samples[0]
    assert (info.labels, info.value) == ({"policy": "lru", "admission": "reuse"}, 1.0)
    assert families["spoke_pinned_bytes"].samples[0].value == 4000


async def test_pins_beyond_the_fraction_are_ordinary_chunks(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(capacity_bytes=10 * CHUNK, pinned_prefixes=("ds/",), pin_fraction=0.2)
    async with http.get(f"{spoke.url}/objects/ds/big.bin") as resp:
        await resp.read()
    stats = await settled_stats(http, spoke.url)
    assert stats["pinned_bytes"] == 2 * CHUNK  # 20 % of 10 chunks
    assert stats["used_bytes"] <= 10 * CHUNK and stats["cached_chunks"] == 10


def test_pin_flags_parse() -> None:
    import pytest

    from spoke.config import config_from_args, parse_args

    base = ["serve", "--hub", "http://h", "--cache-dir", "d", "--capacity", "1GiB"]
    config = config_from_args(parse_args([*base, "--pin", "a/, b/c", "--pin-fraction", "0.3"], {}))
    assert (config.pinned_prefixes, config.pin_fraction) == (("a/", "b/c"), 0.3)
    with pytest.raises(SystemExit):
        parse_args([*base, "--pin", "../x"], {})
    with pytest.raises(SystemExit):
        parse_args([*base, "--pin-fraction", "1.5"], {})
