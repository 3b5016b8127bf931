"""A tier over TLS: spokes that serve https talk https to each other, verifying the peers'
certificates with --peer-ca; an untrusted peer's chunks go to the hub instead."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import trustme

from service.runner import start_site
from service.tls import client_context, server_context
from spoke.app import make_app
from spoke.config import SpokeConfig
from spoke.tier.peers_arg import PeerSource
from tests.security.test_tls import Pki, issue
from tests.support.http import fetch, stats
from tests.support.servers import RunningServer
from tests.tier.conftest import SECRET, free_ports, wait_all_up

Dataset = tuple[Path, dict[str, bytes]]


async def start_tls_tier(
    hub: RunningServer, tmp_path: Path, pki: Pki, peer_ca: Path,
) -> list[RunningServer]:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    ports = free_ports(2)
    urls = [f"https://127.0.0.1:{p}" for p in ports]
    spokes = []
    for i, port in enumerate(ports):
        app = make_app(SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / f"cache-{i}"), capacity_bytes=64 << 20,
            port=port, peers=tuple(PeerSource(u) for u in urls), advertise=urls[i],
            peer_secret_file=str(secret), peer_refresh_s=0.2, peer_ca=str(peer_ca),
            tls_cert=str(pki.cert_file), tls_key=str(pki.key_file)))
        runner, _ = await start_site(app, "127.0.0.1", port,
                                     server_context(str(pki.cert_file), str(pki.key_file)))
        spokes.append(RunningServer(urls[i], runner, app))
    return spokes


async def test_spokes_serving_https_fetch_from_each_other_over_verified_tls(
    hub: RunningServer, tmp_path: Path, dataset: Dataset,
) -> None:
    ca = trustme.CA()
    pki = issue(ca, tmp_path / "pki", "127.0.0.1")
    spokes = await start_tls_tier(hub, tmp_path, pki, pki.ca_file)
    urls = [s.url for s in spokes]
    connector = aiohttp.TCPConnector(ssl=client_context(str(pki.ca_file)))
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            await wait_all_up(http, urls)
            for path, data in dataset[1].items():
                status, _, body = await fetch(http, f"{urls[0]}/objects/{path}")
                assert (status, body) == (200, data)
            doc = await stats(http, urls[0])
            assert doc["peer_fetches"] > 0 and doc["peer_errors"] == 0
    finally:
        for spoke in spokes:
            await spoke.stop()


async def test_a_peer_whose_certificate_is_not_trusted_gets_no_chunk_requests(
    hub: RunningServer, tmp_path: Path, dataset: Dataset,
) -> None:
    ca = trustme.CA()
    pki = issue(ca, tmp_path / "pki", "127.0.0.1")
    stranger = issue(trustme.CA(), tmp_path / "other", "127.0.0.1")  # peers trust another CA
    spokes = await start_tls_tier(hub, tmp_path, pki, stranger.ca_file)
    urls = [s.url for s in spokes]
    connector = aiohttp.TCPConnector(ssl=client_context(str(pki.ca_file)))
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            for path, data in dataset[1].items():  # every read still right, from the hub
                status, _, body = await fetch(http, f"{urls[0]}/objects/{path}")
                assert (status, body) == (200, data)
            doc = await stats(http, urls[0])
            assert doc["peer_fetches"] == 0
            other = await stats(http, urls[1])
            assert other["peer_requests_served"] == 0
    finally:
        for spoke in spokes:
            await spoke.stop()
