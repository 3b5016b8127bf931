"""A tier losing a spoke: loaders' reads never fail, the dead spoke's chunks go to their next
choice, and a spoke that comes back gets its share back. Spokes run as real processes here,
so that one can be SIGKILLed."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from loadtest.procs import Process, start_process
from service.runner import start_site
from spoke.config import SpokeConfig
from spoke.tier.peers_arg import PeerSource
from tests.conftest import CHUNK
from tests.support.http import fetch, metric, stats
from tests.support.servers import GatedBackend, RunningServer, start_spoke
from tests.support.waits import settled_stats, wait_for_stats
from tests.tier.conftest import SECRET, TierMaker, free_ports, wait_all_up

Dataset = tuple[Path, dict[str, bytes]]
WAIT_S = 60


def start_tier_spoke(
    hub: RunningServer, tmp_path: Path, i: int, ports: list[int], *flags: str,
) -> Process:
    secret = tmp_path / "tier-secret"
    if not secret.exists():
        secret.write_text(SECRET)
        secret.chmod(0o600)
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    return start_process("spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / f"cache-{i}"), "--capacity", "64MiB",
        "--peers", peers, "--advertise", f"http://127.0.0.1:{ports[i]}",
        "--peer-secret-file", str(secret), "--peer-refresh", "0.2", "--peer-timeout", "5",
        "--log-level", "warning", *flags,
    ], log_dir=str(tmp_path), port=ports[i])


async def read_all(http: aiohttp.ClientSession, url: str, contents: dict[str, bytes]) -> int:
    """Read every object through the spoke at ``url``; the number of reads that failed."""
    failed = 0
    for path, data in contents.items():
        status, _, body = await fetch(http, f"{url}/objects/{path}")
        if status != 200 or body != data:
            failed += 1
    return failed


async def test_a_spoke_killed_mid_run_fails_no_read_and_its_share_returns_when_it_does(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    contents = {p: d for p, d in dataset[1].items() if d}
    ports = free_ports(3)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [await asyncio.to_thread(start_tier_spoke, hub, tmp_path, i, ports)
             for i in range(3)]
    try:
        await wait_all_up(http, urls, WAIT_S)
        assert await read_all(http, urls[0], contents) == 0  # the tier is warm

        # Loaders on the two survivors read on while the third dies under them.
        stop = asyncio.Event()
        reading = [asyncio.Event(), asyncio.Event()]

        async def loader(i: int) -> tuple[int, int]:
            reads = failed = 0
            while not stop.is_set() or reads < 2 * len(contents):
                for path, data in contents.items():
                    status, _, body = await fetch(http, f"{urls[i]}/objects/{path}")
                    failed += status != 200 or body != data
                    reads += 1
                    reading[i].set()
            return reads, failed

        loaders = [asyncio.create_task(loader(i)) for i in range(2)]
        for started in reading:  # both loaders are mid-pass when the third spoke dies
            await asyncio.wait_for(started.wait(), WAIT_S)
        await asyncio.to_thread(procs[2].stop, signal.SIGKILL)
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*loaders), WAIT_S)
        assert all(failed == 0 for _, failed in results), results
        assert all(reads > 0 for reads, _ in results)
        # After the kill every chunk the dead spoke owned went elsewhere: read again, all
        # of it, through both survivors, with the dead one marked down.
        for url in urls[:2]:
            assert await read_all(http, url, contents) == 0
        doc = await stats(http, urls[0])
        dead = next(p for p in doc["peers"] if p["url"] == urls[2])
        assert dead["state"] in ("down", "probing")
        assert dead["share"] < 0.05
        assert sum(p["share"] for p in doc["peers"]) > 0.99

        # It comes back (same port, same cache): the others see it up and send it its keys.
        procs[2] = await asyncio.to_thread(start_tier_spoke, hub, tmp_path, 2, ports)
        await wait_all_up(http, urls, WAIT_S)
        before = await stats(http, urls[2])
        for url in urls[:2]:
            assert await read_all(http, url, contents) == 0
        after = await stats(http, urls[2])
        assert after["peer_requests_served"] > before["peer_requests_served"]
        back = next(p for p in (await stats(http, urls[0]))["peers"] if p["url"] == urls[2])
        assert back["state"] == "up" and back["share"] > 0.2
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.stop)


def cut_off(gone: set[str]) -> Callable[[dict[str, Any]], bool]:
    """Whether a /stats shows every member in ``gone`` not up."""
    return lambda doc: all(p["state"] != "up" for p in doc["peers"] if p["url"] in gone)


async def test_a_tier_split_in_two_still_serves_exact_bytes_each_half_fetching_once(
    hub: RunningServer, make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    # Four spokes that all list all four; across the split each half sees the other's
    # addresses answer nothing (ports nobody listens on stand for the cut link).
    real, ghosts = free_ports(4), free_ports(4)
    left = [f"http://127.0.0.1:{p}" for p in (real[0], real[1], ghosts[2], ghosts[3])]
    right = [f"http://127.0.0.1:{p}" for p in (ghosts[0], ghosts[1], real[2], real[3])]
    spokes = [await make_tier.member(real[0], left), await make_tier.member(real[1], left),
              await make_tier.member(real[2], right), await make_tier.member(real[3], right)]
    urls = [s.url for s in spokes]
    await wait_all_up(http, urls[:2], among=urls[:2])
    await wait_all_up(http, urls[2:], among=urls[2:])
    for url, view in zip(urls, (left, left, right, right), strict=True):
        await wait_for_stats(http, url, cut_off(set(view) - set(urls)), WAIT_S)
    contents = {p: d for p, d in dataset[1].items() if d}
    sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
    for url in urls:
        assert await read_all(http, url, contents) == 0
    # Each half fetched the dataset once: twice the egress of a whole tier, not four times.
    total = sum(len(d) for d in contents.values())
    assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == 2 * total


async def test_a_peer_that_stops_answering_costs_a_bounded_wait_never_a_read(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    # A stand-in peer that is alive (its probe answers) but never answers a chunk.
    released = asyncio.Event()
    asked = 0

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"capacity_bytes": 64 << 20})

    async def chunk(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        await released.wait()
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/peer/info", info)
    app.router.add_get("/peer/objects/{path:.+}", chunk)
    port = free_ports(1)[0]
    runner, _ = await start_site(app, "127.0.0.1", port)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    spoke = await start_spoke(SpokeConfig(
        hub_url=hub.url, cache_dir=str(tmp_path / "c"), capacity_bytes=64 << 20,
        peers=(PeerSource(f"http://127.0.0.1:{port}"),), advertise="http://127.0.0.1:1",
        peer_secret_file=str(secret), peer_refresh_s=0.2, peer_timeout_s=0.5))
    try:
        await wait_for_stats(http, spoke.url, lambda d: d["peers"][1]["state"] == "up")
        contents = {p: d for p, d in dataset[1].items() if d}
        assert await read_all(http, spoke.url, contents) == 0
        doc = await stats(http, spoke.url)
        assert asked > 0 and doc["peer_errors"] == asked and doc["peer_fetches"] == 0
    finally:
        released.set()
        await spoke.stop()
        await runner.cleanup()


async def test_a_hub_failing_behind_a_peer_counts_nothing_against_the_peer(
    make_tier: TierMaker, gated: GatedBackend, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(2, fetch_attempts=1)
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    for url in tier.urls:  # manifests known before the hub's reads start failing
        async with http.head(f"{url}/objects/{path}") as resp:
            assert resp.status == 200
    gated.fail_reads = True
    for url in tier.urls:
        status, _, _ = await fetch(http, f"{url}/objects/{path}",
                                   {"Range": f"bytes=0-{10 * CHUNK - 1}"})
        assert status >= 500  # nobody has these chunks, and the hub cannot send them
    for url in tier.urls:
        doc = await stats(http, url)
        assert doc["peer_errors"] == 0
        assert {p["state"] for p in doc["peers"]} == {"self", "up"}
    gated.fail_reads = False
    for url in tier.urls:
        status, _, body = await fetch(http, f"{url}/objects/{path}")
        assert (status, body) == (200, data)


async def test_with_the_hub_down_and_its_breaker_open_a_spoke_still_reads_from_owners(
    hub: RunningServer, make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(2, fetch_attempts=1, breaker_threshold=1, breaker_reset_s=600.0,
                           meta_ttl_s=600.0)
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    status, _, body = await fetch(http, f"{tier.urls[0]}/objects/{path}")
    assert (status, body) == (200, data)  # each owner holds its share now
    async with http.head(f"{tier.urls[0]}/objects/ds/partial.bin") as resp:
        assert resp.status == 200  # a manifest known, none of its chunks
    await settled_stats(http, tier.urls[1])
    await hub.stop()  # the hub is gone: connections refused
    status, _, _ = await fetch(http, f"{tier.urls[0]}/objects/ds/partial.bin")
    assert status >= 500
    doc = await wait_for_stats(http, tier.urls[0], lambda d: d["breaker_state"] == "open")
    assert doc["cached_chunks"] < len(data) // CHUNK + 1  # spoke 0 holds only its share
    # Spoke 0's way to the hub is shut, yet every byte of the object still comes: its own
    # chunks from its disk, the others' from them.
    status, _, body = await fetch(http, f"{tier.urls[0]}/objects/{path}")
    assert (status, body) == (200, data)
    assert (await stats(http, tier.urls[0]))["breaker_state"] == "open"


async def test_spokes_with_reader_workers_form_a_tier_like_any_other(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    """``--workers 2`` (reader processes answer hits, the owner process the rest): every
    read is exact through either spoke, and the tier pulls each chunk from the hub once."""
    contents = {p: d for p, d in dataset[1].items() if d}
    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [await asyncio.to_thread(start_tier_spoke, hub, tmp_path, i, ports, "--workers", "2")
             for i in range(2)]
    try:
        await wait_all_up(http, urls, WAIT_S)
        sent_before = await metric(http, hub.url, "hub_bytes_sent_total")
        for _ in range(2):  # the second round: hits, in the readers too
            for url in urls:
                assert await read_all(http, url, contents) == 0
        docs = [await settled_stats(http, url) for url in urls]
        assert await metric(http, hub.url, "hub_bytes_sent_total") - sent_before == sum(
            len(d) for d in contents.values())
        assert all(doc["peer_fetches"] > 0 for doc in docs)
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.stop)
