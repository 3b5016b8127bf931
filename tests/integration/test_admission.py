"""The reuse gate through a real spoke: a dataset read in order, epoch after epoch, twice the
size of the cache. Admitting every miss keeps nothing of it; the default gate keeps a part."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import write_dataset
from tests.support.waits import settled_stats

SHARDS = {f"loop/shard-{i}.bin": 8 * CHUNK for i in range(4)}  # 32 chunks
CAPACITY_CHUNKS = 16


@pytest.fixture
def shards(dataset: tuple[Path, dict[str, bytes]]) -> dict[str, bytes]:
    return write_dataset(str(dataset[0]), SHARDS, seed=5)


async def read_in_order(http: aiohttp.ClientSession, spoke: str,
                        shards: dict[str, bytes]) -> int:
    """One epoch: every chunk of every shard in order, each once the one before is stored
    (a loader computing between reads); returns the hub fetches it cost."""
    before: int = (await settled_stats(http, spoke))["hub_fetches"]
    for path, data in shards.items():
        for offset in range(0, len(data), CHUNK):
            await settled_stats(http, spoke)
            headers = {"Range": f"bytes={offset}-{offset + CHUNK - 1}"}
            async with http.get(f"{spoke}/objects/{path}", headers=headers) as resp:
                assert resp.status == 206
                assert await resp.read() == data[offset:offset + CHUNK]
    after: int = (await settled_stats(http, spoke))["hub_fetches"]
    return after - before


@pytest.mark.parametrize("policy", ["lru", "arc"])
async def test_the_gate_keeps_part_of_a_loop_twice_the_cache(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession,
    policy: str, tmp_path: Path,
) -> None:
    fetches: dict[str, list[int]] = {}
    for admission in ("all", "reuse"):
        spoke = await make_spoke(capacity_bytes=CAPACITY_CHUNKS * CHUNK, policy=policy,
                                 admission=admission, cache_dir=str(tmp_path / admission))
        fetches[admission] = [await read_in_order(http, spoke.url, shards) for _ in range(3)]
        stats = await settled_stats(http, spoke.url)
        assert stats["used_bytes"] <= CAPACITY_CHUNKS * CHUNK
        if admission == "reuse":  # the gate at work, in /stats
            assert stats["admission"] == "reuse"
            assert stats["admission_window_bytes"] > 0
        else:
            assert stats["admission"] == "policy"
    print(f"hub fetches per epoch ({policy}): {fetches}")
    # The first epoch fetches everything either way. After it, every miss admitted pushes
    # out the chunk needed soonest: each epoch fetches the whole dataset again. The gate
    # keeps the cache's worth from one epoch to the next, less the read-ahead's fills in
    # flight (up to --seq-readahead, 8 chunks), which need room somewhere.
    assert fetches["all"] == [32, 32, 32]
    assert fetches["reuse"][0] == 32
    assert all(fetched <= 32 - (CAPACITY_CHUNKS - 8) for fetched in fetches["reuse"][1:]), \
        fetches
