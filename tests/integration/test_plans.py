"""Loader-ordered prefetch and plan-aware eviction through a real spoke."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp
import msgpack
import pytest

from spoke.serve.handlers import CACHE
from tests.conftest import CHUNK, SpokeFactory
from tests.integration.test_slow_disk import HeldDisk
from tests.support.http import stats
from tests.support.servers import write_dataset
from tests.support.waits import settled_stats, wait_for_stats

SAMPLE = 16 * 1024
SHARDS = {f"plan/shard-{i}.bin": 8 * CHUNK for i in range(4)}  # 32 chunks, 128 samples


@pytest.fixture
def shards(dataset: tuple[Path, dict[str, bytes]]) -> dict[str, bytes]:
    return write_dataset(str(dataset[0]), SHARDS, seed=11)


def epoch(seed: int) -> list[tuple[str, int]]:
    order = [(path, i * SAMPLE) for path, size in SHARDS.items() for i in range(size // SAMPLE)]
    random.Random(seed).shuffle(order)
    return order


async def read_all(http: aiohttp.ClientSession, spoke: str, order: list[tuple[str, int]],
                   shards: dict[str, bytes], plan: str | None = None,
                   settle: bool = False) -> int:
    """Read ``order`` one sample at a time; returns how many answers were X-Cache HIT.

    ``settle``: before each read, wait until the spoke has stored what the reads before
    brought in (a loader computing between samples): a chunk is answered before it is
    stored, and one still being stored holds its room in the cache without being the
    policy's to evict, so a reader outrunning the disk leaves the policy less to choose
    from, by as much as the disk is slow.
    """
    hits = 0
    for path, offset in order:
        if settle:
            await settled_stats(http, spoke)
        headers = {"Range": f"bytes={offset}-{offset + SAMPLE - 1}"}
        if plan is not None:
            headers["X-Hubspoke-Plan"] = plan
        async with http.get(f"{spoke}/objects/{path}", headers=headers) as resp:
            assert await resp.read() == shards[path][offset:offset + SAMPLE]
            hits += resp.headers["X-Cache"] == "HIT"
    return hits


async def post_plan(http: aiohttp.ClientSession, spoke: str,
                    orders: list[list[tuple[str, int]]], *, as_msgpack: bool = False) -> str:
    reads = [[path, offset, SAMPLE] for order in orders for path, offset in order]
    if as_msgpack:
        request = http.post(f"{spoke}/plans", data=msgpack.packb({"reads": reads}),
                            headers={"Content-Type": "application/msgpack"})
    else:
        request = http.post(f"{spoke}/plans", json={"reads": reads})
    async with request as resp:
        assert resp.status == 201, await resp.text()
        plan = await resp.json()
    assert plan["chunk_reads"] <= len(reads) and plan["distinct_chunks"] == 32
    plan_id: str = plan["id"]
    return plan_id


async def test_a_plan_prefetches_so_a_shuffled_epoch_is_all_hits(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(capacity_bytes=64 * CHUNK)
    order = epoch(seed=1)
    plan = await post_plan(http, spoke.url, [order], as_msgpack=True)
    for _ in range(200):  # the whole epoch fits in the prefetch window
        if (await stats(http, spoke.url))["prefetched_chunks"] == 32:
            break
        await asyncio.sleep(0.02)
    hits = await read_all(http, spoke.url, order, shards, plan)
    s = await stats(http, spoke.url)
    assert hits == len(order) == 128
    assert (s["misses"], s["hub_fetches"], s["prefetch_used"]) == (0, 32, 32)
    assert s["prefetch_accuracy"] == 1.0


async def test_without_a_plan_the_same_epoch_misses(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(capacity_bytes=64 * CHUNK)
    hits = await read_all(http, spoke.url, epoch(seed=1), shards)
    s = await stats(http, spoke.url)
    assert s["hub_fetches"] == 32 and s["misses"] >= 32
    assert hits <= 128 - 32


@pytest.mark.parametrize("policy", ["lru", "arc"])
async def test_plan_aware_eviction_halves_refetches_at_half_capacity(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession,
    policy: str, tmp_path: Path,
) -> None:
    orders = [epoch(seed=s) for s in (1, 2, 3)]
    fetched: dict[str, list[int]] = {}
    for mode in ("no plan", "plan"):
        spoke = await make_spoke(capacity_bytes=16 * CHUNK, policy=policy,
                                 plan_window_bytes=CHUNK, cache_dir=str(tmp_path / mode))
        plan = await post_plan(http, spoke.url, orders) if mode == "plan" else None
        # Settled reads: what is measured is the policy's choices, not the disk's pace.
        per_epoch = []
        counted = 0  # fetches since the spoke started, the plan's first prefetch too
        for order in orders:
            await read_all(http, spoke.url, order, shards, plan, settle=True)
            total: int = (await settled_stats(http, spoke.url))["hub_fetches"]
            per_epoch.append(total - counted)
            counted = total
        fetched[mode] = per_epoch
        assert (await stats(http, spoke.url))["used_bytes"] <= 16 * CHUNK
    chunk_trace = [(path, offset // CHUNK) for order in orders for path, offset in order]
    opt = opt_misses(chunk_trace, capacity=16)
    print(f"hub fetches per epoch ({policy}): {fetched}; Belady's optimum: {opt} in all")
    # With the plan the spoke fetches what Belady's optimum does (plus the odd
    # prefetch the policy then declines), far below the plan-less policy.
    assert sum(fetched["plan"]) <= opt + 4, (fetched, opt)
    assert sum(fetched["plan"]) < 0.75 * sum(fetched["no plan"]), (fetched, opt)


def opt_misses(trace: list[tuple[str, int]], capacity: int) -> int:
    """Belady's misses (with bypass) for unit-size items: the offline optimum."""
    next_use: list[float] = [0.0] * len(trace)
    seen: dict[tuple[str, int], int] = {}
    for i in range(len(trace) - 1, -1, -1):
        next_use[i] = seen.get(trace[i], float("inf"))
        seen[trace[i]] = i
    resident: dict[tuple[str, int], float] = {}
    misses = 0
    for i, key in enumerate(trace):
        if key in resident:
            resident[key] = next_use[i]
            continue
        misses += 1
        if len(resident) < capacity:
            resident[key] = next_use[i]
            continue
        furthest = max(resident, key=lambda k: resident[k])
        if resident[furthest] > next_use[i]:
            del resident[furthest]
            resident[key] = next_use[i]
    return misses


async def test_plan_endpoints(make_spoke: SpokeFactory, shards: dict[str, bytes],
                              http: aiohttp.ClientSession) -> None:
    spoke = await make_spoke()
    plan = await post_plan(http, spoke.url, [epoch(seed=4)])
    async with http.get(f"{spoke.url}/plans/{plan}") as resp:
        view = await resp.json()
        assert view["id"] == plan and view["cursor"] == 0
    async with http.get(f"{spoke.url}/plans") as resp:
        assert [p["id"] for p in (await resp.json())["plans"]] == [plan]
    async with http.delete(f"{spoke.url}/plans/{plan}") as resp:
        assert resp.status == 200
    async with http.get(f"{spoke.url}/plans/{plan}") as resp:
        assert resp.status == 404
        assert resp.content_type == "application/problem+json"


@pytest.mark.parametrize(
    "body",
    [{"reads": []}, {"reads": "x"}, {"reads": [["plan/shard-0.bin", -1, 5]]},
     {"reads": [["../x", 0, 5]]}, {"reads": [["plan/shard-0.bin", 0]]},
     {"reads": [["plan/shard-0.bin", 0, True]]}, {}],
)
async def test_bad_plans_are_400(make_spoke: SpokeFactory, http: aiohttp.ClientSession,
                                 body: dict[str, object]) -> None:
    spoke = await make_spoke()
    async with http.post(f"{spoke.url}/plans", json=body) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/problem+json"


async def test_a_plan_naming_a_missing_object_is_404(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke()
    async with http.post(f"{spoke.url}/plans", json={"reads": [["plan/none.bin", 0, 1]]}) as r:
        assert r.status == 404


async def read_concurrently(http: aiohttp.ClientSession, spoke: str,
                            order: list[tuple[str, int]], shards: dict[str, bytes],
                            plan: str | None, workers: int = 8) -> None:
    """Like a DataLoader: ``workers`` readers take the next sample of ``order`` in turn."""
    todo = iter(order)

    async def worker() -> None:
        for path, offset in todo:
            headers = {"Range": f"bytes={offset}-{offset + SAMPLE - 1}"}
            if plan is not None:
                headers["X-Hubspoke-Plan"] = plan
            async with http.get(f"{spoke}/objects/{path}", headers=headers) as resp:
                assert await resp.read() == shards[path][offset:offset + SAMPLE]

    await asyncio.gather(*(worker() for _ in range(workers)))


async def test_a_plan_keeps_up_with_concurrent_out_of_order_readers(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    orders = [epoch(seed=s) for s in (5, 6, 7)]
    fetched = {}
    for mode in ("no plan", "plan"):
        spoke = await make_spoke(capacity_bytes=16 * CHUNK, plan_window_bytes=CHUNK,
                                 cache_dir=str(tmp_path / mode))
        plan = await post_plan(http, spoke.url, orders) if mode == "plan" else None
        for order in orders:
            await read_concurrently(http, spoke.url, order, shards, plan)
        fetched[mode] = (await stats(http, spoke.url))["hub_fetches"]
    opt = opt_misses([(p, o // CHUNK) for order in orders for p, o in order], capacity=16)
    assert fetched["plan"] <= 1.15 * opt + 8, (fetched, opt)
    assert fetched["plan"] < 0.8 * fetched["no plan"], (fetched, opt)


async def test_a_plan_keeps_fetching_while_the_disk_is_slow(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession
) -> None:
    # fetch_concurrency=4: the plan prefetches four at a time, four verified chunks
    # may wait for the disk (one more may be on its way into that backlog as /stats is
    # read), and the prefetch goes on to the next chunks, which wait for room in that
    # backlog. A prefetch counted until stored stopped at the four on their way to disk.
    spoke = await make_spoke(capacity_bytes=64 * CHUNK, fetch_concurrency=4)
    disk = HeldDisk(spoke.app[CACHE].store)
    try:
        order = epoch(seed=3)
        plan = await post_plan(http, spoke.url, [order])
        doc = await wait_for_stats(http, spoke.url, lambda d: d["chunks_storing"] >= 4
                                   and d["hub_fetches_in_flight"] >= 1)
        assert doc["cached_chunks"] == 0
    finally:
        disk.release()
    await wait_for_stats(http, spoke.url, lambda d: d["prefetched_chunks"] == 32)
    hits = await read_all(http, spoke.url, order, shards, plan)
    doc = await settled_stats(http, spoke.url)
    assert hits == len(order)
    assert (doc["hub_fetches"], doc["cached_chunks"], doc["misses"]) == (32, 32, 0)
