"""TLS with a throwaway CA (trustme): hub over HTTPS, a spoke verifying it with --hub-ca,
loaders over HTTPS to the spoke, and refusals that say why."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web

from hub.app import make_app as make_hub_app
from hub.config import HubConfig
from service.runner import start_site
from service.tls import client_context, server_context
from spoke.app import make_app as make_spoke_app
from spoke.config import SpokeConfig
from tests.conftest import CHUNK
from tests.security.conftest import Dataset, call, problem
from tests.support.servers import RunningServer


@dataclass
class Pki:
    ca_file: Path
    cert_file: Path
    key_file: Path


def issue(ca: trustme.CA, directory: Path, *names: str) -> Pki:
    """A certificate for ``names`` signed by ``ca``, written as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    cert = ca.issue_cert(*names)
    chain = directory / "cert.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key = directory / "key.pem"
    cert.private_key_pem.write_to_path(str(key))
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca_file, chain, key)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def hub_pki(ca: trustme.CA, tmp_path: Path) -> Pki:
    return issue(ca, tmp_path / "hub-pki", "127.0.0.1", "localhost")


async def serve(app: web.Application, pki: Pki | None) -> RunningServer:
    context = server_context(str(pki.cert_file), str(pki.key_file)) if pki else None
    runner, port = await start_site(app, "127.0.0.1", 0, context)
    scheme = "https" if pki else "http"
    return RunningServer(f"{scheme}://127.0.0.1:{port}", runner, app)


@pytest.fixture
async def tls_hub(dataset: Dataset, hub_pki: Pki) -> AsyncIterator[RunningServer]:
    server = await serve(make_hub_app(HubConfig(root=str(dataset[0]), chunk_size=CHUNK)), hub_pki)
    yield server
    await server.stop()


@pytest.fixture
async def started() -> AsyncIterator[list[RunningServer]]:
    servers: list[RunningServer] = []
    yield servers
    for server in reversed(servers):
        await server.stop()


async def spoke_for(
    hub_url: str, tmp_path: Path, started: list[RunningServer], pki: Pki | None = None,
    **config: object,
) -> RunningServer:
    app = make_spoke_app(SpokeConfig(
        hub_url=hub_url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
        fetch_attempts=1, **config,  # type: ignore[arg-type]
    ))
    server = await serve(app, pki)
    started.append(server)
    return server


def trusting(ca_file: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(str(ca_file))))


async def test_hub_serves_https_and_the_spoke_verifies_it(
    tls_hub: RunningServer, hub_pki: Pki, ca: trustme.CA, dataset: Dataset, tmp_path: Path,
    started: list[RunningServer],
) -> None:
    spoke_pki = issue(ca, tmp_path / "spoke-pki", "127.0.0.1")
    spoke = await spoke_for(tls_hub.url, tmp_path, started, spoke_pki,
                            hub_ca=str(hub_pki.ca_file))
    assert tls_hub.url.startswith("https://") and spoke.url.startswith("https://")
    async with trusting(hub_pki.ca_file) as https:
        status, _, body = await call(https, f"{tls_hub.url}/objects/ds/partial.bin")
        assert status == 200 and body == dataset[1]["ds/partial.bin"]
        for expected in ("MISS", "HIT"):
            status, headers, body = await call(https, f"{spoke.url}/objects/ds/big.bin")
            assert status == 200 and body == dataset[1]["ds/big.bin"]
            assert headers["X-Cache"] == expected


async def test_plain_http_clients_get_no_bytes_from_an_https_hub(
    tls_hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    plain = tls_hub.url.replace("https://", "http://")
    with pytest.raises(aiohttp.ClientError):
        await call(http, f"{plain}/objects/ds/small.bin")
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await call(http, f"{tls_hub.url}/objects/ds/small.bin")  # system CAs: not trusted


@pytest.mark.parametrize("trust", ["system CAs", "another CA", "wrong host name"])
async def test_an_untrusted_hub_certificate_is_refused_and_nothing_is_cached(
    tls_hub: RunningServer, hub_pki: Pki, dataset: Dataset, tmp_path: Path,
    started: list[RunningServer], http: aiohttp.ClientSession, trust: str,
) -> None:
    hub_url, hub_ca = tls_hub.url, None
    if trust == "another CA":
        hub_ca = str(issue(trustme.CA(), tmp_path / "other-ca", "127.0.0.1").ca_file)
    elif trust == "wrong host name":
        # A CA the spoke trusts, but its certificate names hub.example, not 127.0.0.1.
        other = issue(trustme.CA(), tmp_path / "named", "hub.example")
        server = await serve(
            make_hub_app(HubConfig(root=str(dataset[0]), chunk_size=CHUNK)), other
        )
        started.append(server)
        hub_url, hub_ca = server.url, str(other.ca_file)
    spoke = await spoke_for(hub_url, tmp_path, started, hub_ca=hub_ca)
    for path in ("/objects/ds/small.bin", "/objects/ds/big.bin", "/list/ds/"):
        doc = problem(await call(http, spoke.url + path), 502)
        assert "certificate verification failed" in str(doc["detail"])
        hint = "must name the host" if trust == "wrong host name" else "--hub-ca"
        assert hint in str(doc["detail"])
    status, _, body = await call(http, f"{spoke.url}/stats")
    stats = json.loads(body)
    assert status == 200 and stats["hub_bytes"] == 0 and stats["used_bytes"] == 0
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "chunks" in p.parts]


async def test_a_spoke_dialling_https_to_a_plain_hub_says_tls_failed(
    dataset: Dataset, tmp_path: Path, started: list[RunningServer], http: aiohttp.ClientSession
) -> None:
    plain = await serve(make_hub_app(HubConfig(root=str(dataset[0]), chunk_size=CHUNK)), None)
    started.append(plain)
    spoke = await spoke_for(plain.url.replace("http://", "https://"), tmp_path, started)
    doc = problem(await call(http, f"{spoke.url}/objects/ds/small.bin"), 502)
    assert "TLS" in str(doc["title"]) + str(doc["detail"])


def test_client_context_verifies_by_default() -> None:
    context = client_context(None)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
