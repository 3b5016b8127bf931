"""Peer requests need the tier's secret and nothing else opens them; a peer's bytes reach
a loader only verified, whether the peer's disk went bad or the peer lies outright."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from protocol.auth import issue
from protocol.placement import chunk_key, owner
from service.runner import start_site
from spoke.cache.keys import ChunkKey
from spoke.config import SpokeConfig
from spoke.serve.handlers import CACHE
from spoke.tier.peers_arg import PeerSource
from tests.conftest import CHUNK, SpokeFactory
from tests.support.http import assert_problem, fetch, stats
from tests.support.servers import RunningServer, start_spoke
from tests.support.waits import settled_stats, wait_for_stats
from tests.tier.conftest import PEER_HEADERS, SECRET, TierMaker, free_ports, wait_all_up

Dataset = tuple[Path, dict[str, bytes]]
AUTH_SECRET = b"loader-auth-secret-for-tier-tests-0123456789"


@pytest.fixture
def auth_secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth-secret"
    path.write_bytes(AUTH_SECRET)
    path.chmod(0o600)
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_peer_endpoints_need_the_tier_secret_and_a_loader_token_opens_none(
    make_tier: TierMaker, auth_secret_file: Path, dataset: Dataset,
    http: aiohttp.ClientSession,
) -> None:
    admin = issue(AUTH_SECRET, "ops", [""], admin=True, ttl_s=600, now=time.time())
    tier = await make_tier(2, wait=False, auth_secret_file=str(auth_secret_file))
    await wait_all_up(http, tier.urls, headers=bearer(admin))
    url = tier.urls[0]
    path, data = "ds/exact.bin", dataset[1]["ds/exact.bin"]
    status, headers, _ = await fetch(http, f"{url}/objects/{path}", bearer(admin))
    assert status == 200
    etag = headers["ETag"]
    chunk = {"Range": f"bytes=0-{CHUNK - 1}", "If-Match": etag}
    for method, target in (("GET", f"/peer/objects/{path}"), ("GET", "/peer/info"),
                           ("POST", f"/peer/prefetch/{path}")):
        # No token, a loader's token (even an admin's), a wrong secret: 401 problem+json.
        for auth in ({}, bearer(admin), bearer(SECRET + "x"), {"Authorization": SECRET}):
            answer = await fetch(http, url + target, {**chunk, **auth}, method)
            assert SECRET not in str(assert_problem(answer, 401))
    doc = await stats(http, url, bearer(admin))
    assert doc["peer_refused"] == 3 * 4
    # The tier's secret is no loader token: it opens no loader route.
    assert_problem(await fetch(http, f"{url}/objects/{path}", PEER_HEADERS), 401)
    assert_problem(await fetch(http, f"{url}/stats", PEER_HEADERS), 401)
    # With it, one chunk of one version.
    status, headers, body = await fetch(http, f"{url}/peer/objects/{path}",
                                        {**chunk, **PEER_HEADERS})
    assert (status, body) == (206, data[:CHUNK])
    assert headers["ETag"] == etag
    status, _, body = await fetch(http, f"{url}/peer/prefetch/{path}",
                                  {**chunk, **PEER_HEADERS}, "POST")
    assert (status, json.loads(body)) == (200, {"fetched": False})  # cached already


async def test_a_peer_request_that_is_not_one_chunk_of_a_known_version_gets_a_4xx(
    make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(2)
    url, path = tier.urls[0], "ds/exact.bin"
    status, headers, _ = await fetch(http, f"{url}/objects/{path}")
    assert status == 200
    etag = headers["ETag"]
    cases = [
        ({"Range": f"bytes=0-{CHUNK - 1}"}, 400),  # no version
        ({"Range": f"bytes=0-{CHUNK - 1}", "If-Match": '"not-it"'}, 412),
        ({"Range": "bytes=10-99", "If-Match": etag}, 416),  # not a whole chunk
        ({"Range": f"bytes=0-9,20-{CHUNK - 1}", "If-Match": etag}, 400),
        ({"If-Match": etag}, 400),  # no range
    ]
    for headers_, code in cases:
        assert_problem(await fetch(http, f"{url}/peer/objects/{path}",
                                   {**headers_, **PEER_HEADERS}), code)
    assert_problem(await fetch(http, f"{url}/peer/objects/ds/none.bin",
                               {"Range": "bytes=0-9", "If-Match": etag, **PEER_HEADERS}), 404)


async def test_a_spoke_outside_a_tier_has_no_peer_endpoints(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_spoke()
    assert_problem(await fetch(http, f"{spoke.url}/peer/info", PEER_HEADERS), 404)


async def test_a_chunk_gone_bad_on_its_owners_disk_never_reaches_a_loader(
    make_tier: TierMaker, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    tier = await make_tier(2)
    path, data = "ds/big.bin", dataset[1]["ds/big.bin"]
    status, headers, body = await fetch(http, f"{tier.urls[0]}/objects/{path}")
    assert (status, body) == (200, data)
    await settled_stats(http, tier.urls[0])
    await settled_stats(http, tier.urls[1])
    weights = {u: 1.0 for u in tier.urls}
    etag = headers["ETag"]
    # A chunk spoke 1 owns, flipped in place on its disk (same size).
    index = next(i for i in range(len(data) // CHUNK)
                 if owner(weights, chunk_key(path, etag, i)) == tier.urls[1])
    cache = tier.spokes[1].app[CACHE]
    manifest, _ = await cache.manifest(path)
    name = ChunkKey.of(manifest, index).name
    chunk_file = cache.store.path_of(name)
    flip_first_byte(chunk_file)
    # Read through the non-owner: exact bytes, the owner caught its own bad file.
    start = index * CHUNK
    status, _, body = await fetch(http, f"{tier.urls[0]}/objects/{path}",
                                  {"Range": f"bytes={start}-{start + CHUNK - 1}"})
    assert (status, body) == (206, data[start:start + CHUNK])
    owner_stats = await settled_stats(http, tier.urls[1])
    assert sum(owner_stats["corrupt_chunks"].values()) >= 1


def flip_first_byte(path: str) -> None:
    with open(path, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))


class LyingPeer:
    """A stand-in peer that says it is a spoke of the tier and sends every chunk with its
    first byte flipped (right length, right headers): only a digest check catches it."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self.asked = 0

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"capacity_bytes": 64 << 20})

    async def chunk(self, request: web.Request) -> web.Response:
        self.asked += 1
        data = self.data[request.match_info["path"]]
        first, last = request.headers["Range"].removeprefix("bytes=").split("-")
        start, stop = int(first), int(last) + 1
        body = bytearray(data[start:stop])
        body[0] ^= 0xFF
        return web.Response(status=206, body=bytes(body), headers={
            "ETag": request.headers["If-Match"],
            "Content-Range": f"bytes {start}-{stop - 1}/{len(data)}",
        })


@pytest.fixture
async def liar(dataset: Dataset) -> AsyncIterator[tuple[LyingPeer, str]]:
    peer = LyingPeer(dataset[1])
    app = web.Application()
    app.router.add_get("/peer/info", peer.info)
    app.router.add_get("/peer/objects/{path:.+}", peer.chunk)
    port = free_ports(1)[0]
    runner, _ = await start_site(app, "127.0.0.1", port)
    yield peer, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_a_lying_peers_bytes_are_refused_and_the_loader_gets_the_hubs(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession,
    liar: tuple[LyingPeer, str],
) -> None:
    peer, liar_url = liar
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    config = SpokeConfig(hub_url=hub.url, cache_dir=str(tmp_path / "c"), capacity_bytes=64 << 20,
                         peers=(PeerSource(liar_url),), advertise="http://127.0.0.1:1",
                         peer_secret_file=str(secret), peer_refresh_s=0.2)
    spoke = await start_spoke(config)
    try:
        await wait_for_stats(http, spoke.url, lambda d: d["peers"][1]["state"] == "up")
        for path, data in dataset[1].items():
            status, _, body = await fetch(http, f"{spoke.url}/objects/{path}")
            assert (status, body) == (200, data)
        doc = await stats(http, spoke.url)
        assert peer.asked > 0
        assert doc["peer_errors"] == peer.asked  # each lie refused, none passed on
        assert doc["peer_fetches"] == 0 and doc["fill_failures"] == 0
        assert doc["peers"][1]["state"] in ("down", "probing")  # its breaker opened
    finally:
        await spoke.stop()
