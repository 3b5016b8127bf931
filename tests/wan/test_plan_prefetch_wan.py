"""A plan's prefetch over a slow link: how many of its chunks it has on the wire at once.

Real hub → Toxiproxy → real spoke on 127.0.0.1. A bandwidth toxic slows every
connection so much that fetches stay in flight until the test lifts it; the spoke's
``/stats`` then shows how wide the prefetch runs before any loader reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
import requests
from toxiproxy.exceptions import NotFound

from loadtest.wan import WanProxy, add_bandwidth, create_hub_proxy, start_toxiproxy
from tests.conftest import SpokeFactory
from tests.integration.test_plans import epoch, post_plan, read_all
from tests.support.servers import RunningServer, write_dataset
from tests.support.waits import settled_stats, wait_for_stats

pytestmark = pytest.mark.timeout(90)

SHARDS = {f"plan/shard-{i}.bin": 8 * 64 * 1024 for i in range(4)}  # as test_plans'


@pytest.fixture
def shards(dataset: tuple[Path, dict[str, bytes]]) -> dict[str, bytes]:
    return write_dataset(str(dataset[0]), SHARDS, seed=11)


@pytest.fixture
def link(hub: RunningServer) -> Iterator[WanProxy]:
    parts = urlsplit(hub.url)
    assert parts.hostname is not None and parts.port is not None
    with start_toxiproxy() as api:
        wan = create_hub_proxy(api, (parts.hostname, parts.port), name="plan_prefetch_wan")
        try:
            yield wan
        finally:
            with contextlib.suppress(NotFound, requests.RequestException):
                wan.proxy.destroy()


async def test_a_plans_next_chunks_go_out_as_demand_beside_its_background_ones(
    make_spoke: SpokeFactory, link: WanProxy, shards: dict[str, bytes],
    http: aiohttp.ClientSession,
) -> None:
    # fetch_concurrency=4: background work may hold 2 fetch slots; the plan's next 2
    # chunks go out as a loader's would, so 4 are on the wire before anyone reads.
    # Background-only, the prefetch stopped at 2 and a cold job's first reads waited.
    spoke = await make_spoke(hub_url=f"http://{link.listen}", capacity_bytes=64 * 64 * 1024,
                             fetch_concurrency=4, meta_ttl_s=60.0, read_timeout_s=30.0)
    order = epoch(seed=5)
    toxic = add_bandwidth(link.proxy, 1)  # KB/s: a chunk takes a minute
    try:
        plan = await post_plan(http, spoke.url, [order])
        doc = await wait_for_stats(http, spoke.url, lambda d: d["hub_fetches_in_flight"] == 4,
                                   timeout_s=30)
        assert doc["prefetched_chunks"] == 0
    finally:
        link.proxy.destroy_toxic(toxic)
    await wait_for_stats(http, spoke.url, lambda d: d["prefetched_chunks"] == 32, timeout_s=60)
    hits = await read_all(http, spoke.url, order, shards, plan)
    doc = await settled_stats(http, spoke.url)
    assert hits == len(order)
    assert (doc["hub_fetches"], doc["cached_chunks"], doc["misses"]) == (32, 32, 0)
