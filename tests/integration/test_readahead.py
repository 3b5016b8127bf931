"""Sequential read-ahead: a reader streaming range after range finds the chunks there."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import CHUNK, SpokeFactory
from tests.support.http import stats
from tests.support.waits import settled_stats


async def test_a_streaming_reader_is_read_ahead_of(
    make_spoke: SpokeFactory, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    spoke = await make_spoke(sequential_readahead_chunks=4)
    hits = []
    for i in range(12):  # chunk-sized ranges, one after the other
        headers = {"Range": f"bytes={i * CHUNK}-{(i + 1) * CHUNK - 1}"}
        async with http.get(f"{spoke.url}/objects/ds/big.bin", headers=headers) as resp:
            assert await resp.read() == files["ds/big.bin"][i * CHUNK:(i + 1) * CHUNK]
            hits.append(resp.headers["X-Cache"])
        # Let the read-ahead land (fetched and stored: only then is it counted).
        s = await settled_stats(http, spoke.url)
    # Three reads establish the stream; after that every chunk is waiting.
    assert hits[:3] == ["MISS"] * 3 and set(hits[3:]) == {"HIT"}
    assert s["prefetched_chunks"] >= 9 and s["hub_fetches"] == s["prefetched_chunks"] + 3
    assert s["prefetch_used"] == 9


async def test_random_reads_are_not_read_ahead(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(sequential_readahead_chunks=4)
    for i in (7, 2, 30, 11):
        headers = {"Range": f"bytes={i * CHUNK}-{i * CHUNK + 99}"}
        async with http.get(f"{spoke.url}/objects/ds/big.bin", headers=headers) as resp:
            await resp.read()
    assert (await stats(http, spoke.url))["prefetched_chunks"] == 0
