"""The tier's data path: each chunk crosses the hub link once for the whole tier, a loader
gets exact bytes through any spoke, and only owners keep chunks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from protocol.placement import chunk_key, owner
from tests.conftest import CHUNK
from tests.support.http import fetch, metric
from tests.support.servers import GatedBackend, RunningServer
from tests.support.waits import settled_stats, wait_for_stats, wait_warm
from tests.tier.conftest import TierMaker

Dataset = tuple[Path, dict[str, bytes]]
WAIT_S = 60


async def test_concurrent_misses_on_three_spokes_cost_one_hub_fetch_per_chunk(
    hub: RunningServer, make_tier: TierMaker, gated: GatedBackend, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    # The owners wait on the held hub: their peers must wait for them, not time out.
    tier = await make_tier(3, peer_timeout_s=WAIT_S)
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    for url in tier.urls:  # the hub hashes through the gate too: manifests first
        async with http.head(f"{url}/objects/{path}") as resp:
            assert resp.status == 200
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    gated.drain()
    gated.gate.clear()  # the hub holds its reads until every loader is waiting
    try:
        tasks = [asyncio.create_task(fetch(http, f"{url}/objects/{path}"))
                 for url in tier.urls for _ in range(4)]
        assert await asyncio.to_thread(gated.waiting.acquire, True, WAIT_S)
        for url in tier.urls:  # each spoke's 4 loaders wait on chunk 0
            await wait_for_stats(http, url, lambda d: d["misses"] >= 4, WAIT_S)
        assert not any(t.done() for t in tasks)
    finally:
        gated.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    for status, _, body in results:
        assert status == 200
        assert body == data
    # 12 loaders on 3 spokes read 41 chunks: the hub sent each once.
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == len(data)
    docs = [await settled_stats(http, url) for url in tier.urls]
    assert sum(d["hub_bytes"] for d in docs) == len(data)
    assert sum(d["hub_fetches"] for d in docs) == len(data) // CHUNK + 1
    assert sum(d["peer_bytes"] for d in docs) == 2 * len(data)
    assert all(d["peer_errors"] == 0 for d in docs)


async def test_bytes_through_a_non_owner_are_exact_and_only_the_owner_keeps_the_chunk(
    make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(3)
    path, data = "ds/partial.bin", dataset[1]["ds/partial.bin"]
    etag = None
    for url in tier.urls:  # every spoke in turn, ranges across chunk edges
        for start, stop in ((0, len(data)), (CHUNK - 10, 3 * CHUNK + 10), (len(data) - 5, None)):
            end = "" if stop is None else stop - 1
            status, headers, body = await fetch(http, f"{url}/objects/{path}",
                                                {"Range": f"bytes={start}-{end}"})
            assert status == 206
            assert body == data[start:stop]
            etag = headers["ETag"]
    assert etag is not None
    docs = [await settled_stats(http, url) for url in tier.urls]
    weights = {url: 1.0 for url in tier.urls}
    chunks = len(data) // CHUNK + 1
    owned = [sum(owner(weights, chunk_key(path, etag, i)) == url for i in range(chunks))
             for url in tier.urls]
    # Each chunk is stored once in the tier, by its owner.
    assert [d["cached_chunks"] for d in docs] == owned
    assert sum(d["hub_bytes"] for d in docs) == len(data)
    assert sum(d["peer_fetches"] for d in docs) > 0
    assert sum(d["peer_requests_served"] for d in docs) == sum(d["peer_fetches"] for d in docs)


async def test_stats_and_metrics_show_the_peers_and_their_shares(
    make_tier: TierMaker, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(3)
    doc = await settled_stats(http, tier.urls[0])
    peers = {p["url"]: p for p in doc["peers"]}
    assert set(peers) == set(tier.urls)
    assert peers[tier.urls[0]]["state"] == "self"
    assert {peers[u]["state"] for u in tier.urls[1:]} == {"up"}
    assert abs(sum(p["share"] for p in peers.values()) - 1.0) < 1e-9
    assert all(0.25 < p["share"] < 0.42 for p in peers.values())
    for key in ("peer_fetches", "peer_bytes", "peer_errors", "hub_bytes_saved"):
        assert doc[key] == 0
    status, _, body = await fetch(http, f"{tier.urls[0]}/metrics")
    text = body.decode()
    assert status == 200
    for name in ("spoke_peer_fetches_total", "spoke_peer_bytes_total", "spoke_peer_errors_total",
                 "spoke_tier_members 3.0", f'spoke_peer_share{{peer="{tier.urls[1]}"}}',
                 f'spoke_peer_down{{peer="{tier.urls[2]}"}} 0.0'):
        assert name in text


async def test_a_warm_job_on_one_spoke_fills_each_owner_with_its_own_share_once(
    hub: RunningServer, make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(3)
    files = {p: d for p, d in dataset[1].items() if p.startswith("ds/") and d}
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    async with http.post(f"{tier.urls[0]}/warm", json={"prefix": "ds/"}) as resp:
        assert resp.status == 202
        job = await resp.json()
    done = await wait_warm(http, tier.urls[0], job["id"])
    assert done["state"] == "done", done
    docs = [await settled_stats(http, url) for url in tier.urls]
    total = sum(len(d) for d in files.values())
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == total
    weights = {url: 1.0 for url in tier.urls}
    etags = {}
    for path in files:
        async with http.head(f"{tier.urls[1]}/objects/{path}") as resp:
            etags[path] = resp.headers["ETag"]
    owned = [sum(owner(weights, chunk_key(p, etags[p], i)) == url
                 for p, d in files.items() for i in range((len(d) + CHUNK - 1) // CHUNK))
             for url in tier.urls]
    assert [d["cached_chunks"] for d in docs] == owned  # each owner holds its share
    assert all(n > 0 for n in owned)
    # Each owner fetched its own share; none of it came through the spoke that warmed.
    assert [d["hub_bytes"] > 0 for d in docs] == [True, True, True]
    assert docs[0]["peer_bytes"] == 0
    assert docs[0]["peer_prefetches"] == sum(owned[1:])
    assert [d["peer_prefetches_served"] for d in docs[1:]] == owned[1:]
    # Every loader, on any spoke, now reads without the hub.
    for url in tier.urls:
        for path, data in files.items():
            status, _, body = await fetch(http, f"{url}/objects/{path}")
            assert (status, body) == (200, data)
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == total
