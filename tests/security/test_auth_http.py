"""Bearer tokens on real hub and spoke servers: 401/403 shapes, tenants sharing a spoke,
filtered listings, admin-only endpoints, and no token in any log line."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import aiohttp
import msgpack
import pytest
import yarl

from hub.config import HubConfig
from service import auth
from tests.conftest import CHUNK, FILES
from tests.security.conftest import AuthSpokeFactory, Dataset, Mint, call, problem, write_secret
from tests.support.raw_http import raw_request
from tests.support.servers import RunningServer, start_hub
from tests.support.waits import settled_stats

CHALLENGE = 'Bearer realm="hubspoke"'


@pytest.fixture(params=["hub", "spoke"])
async def server(
    request: pytest.FixtureRequest, auth_hub: RunningServer, make_auth_spoke: AuthSpokeFactory
) -> RunningServer:
    """The hub with auth on, or a spoke with auth on in front of it."""
    if request.param == "hub":
        return auth_hub
    return await make_auth_spoke()


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (None, None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer", None),
        ("Bearer not-a-token", "invalid_token"),
        ("Bearer hs1.e30.AAAA", "invalid_token"),
    ],
)
async def test_missing_or_bad_token_is_401_with_a_challenge(
    server: RunningServer, http: aiohttp.ClientSession, header: str | None, error: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    for path in ("/objects/ds/small.bin", "/list/ds/", "/no/such/route"):
        response = await call(http, server.url + path, headers=headers)
        problem(response, 401)
        challenge = response[1]["WWW-Authenticate"]
        assert challenge.startswith(CHALLENGE)
        assert (f'error="{error}"' in challenge) if error else ("error=" not in challenge)


async def test_expired_and_foreign_tokens_are_401(
    server: RunningServer, http: aiohttp.ClientSession, mint: Mint
) -> None:
    expired = mint("a", [""], ttl_s=60, now=time.time() - 61)
    doc = problem(await call(http, f"{server.url}/objects/ds/small.bin", expired), 401)
    assert doc["title"] == "Token expired"
    foreign = mint("a", [""], key=b"another-secret-of-32-bytes-------")
    doc = problem(await call(http, f"{server.url}/objects/ds/small.bin", foreign), 401)
    assert "signature" in str(doc["detail"])
    fresh = mint("a", [""], ttl_s=60)
    assert (await call(http, f"{server.url}/objects/ds/small.bin", fresh))[0] == 200
    server.app[auth.GUARD].clock = lambda: time.time() + 60  # the same token, a minute on
    problem(await call(http, f"{server.url}/objects/ds/small.bin", fresh), 401)


async def test_valid_token_reads_and_heads(
    server: RunningServer, http: aiohttp.ClientSession, dataset: Dataset, mint: Mint
) -> None:
    token = mint("a", ["ds/"])
    status, _, body = await call(http, f"{server.url}/objects/ds/partial.bin", token)
    assert status == 200 and body == dataset[1]["ds/partial.bin"]
    status, headers, body = await call(http, f"{server.url}/objects/ds/partial.bin", token,
                                       headers={"Range": "bytes=0-9"})
    assert status == 206 and headers["Content-Range"] == f"bytes 0-9/{FILES['ds/partial.bin']}"
    assert body == dataset[1]["ds/partial.bin"][:10]
    status, headers, body = await call(http, f"{server.url}/objects/ds/partial.bin", token,
                                       method="HEAD")
    assert status == 200 and body == b"" and headers["ETag"]


async def test_token_outside_its_prefixes_is_403(
    server: RunningServer, http: aiohttp.ClientSession, mint: Mint
) -> None:
    token = mint("a", ["ds"])
    for path in ("/objects/other/notes.csv", "/list/other/", "/list/", "/list"):
        doc = problem(await call(http, server.url + path, token), 403)
        assert "tenant a" in str(doc["detail"])
    problem(await call(http, f"{server.url}/objects/other/notes.csv", token, method="HEAD"), 403)


async def test_bad_paths_stay_400_or_404_for_authenticated_callers(
    server: RunningServer, http: aiohttp.ClientSession, mint: Mint
) -> None:
    token = mint("a", ["ds/"])
    for path in ("/objects/ds/%2e%2e/other/notes.csv", "/objects/ds/a%00b", "/objects/ds//x"):
        status, _, _ = await call(http, yarl.URL(server.url + path, encoded=True), token)
        assert status in (400, 404), path
    status, _, _ = await call(http, f"{server.url}/objects/ds/missing.bin", token)
    assert status == 404


async def test_health_stays_open_and_metrics_is_configurable(
    auth_hub: RunningServer, make_auth_spoke: AuthSpokeFactory, dataset: Dataset,
    secret_file: Path, http: aiohttp.ClientSession, mint: Mint,
) -> None:
    spoke = await make_auth_spoke()
    for url in (auth_hub.url, spoke.url):
        assert (await call(http, f"{url}/healthz"))[0] == 200
        assert (await call(http, f"{url}/metrics"))[0] == 200
    locked = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK,
                                       auth_secret_file=str(secret_file), metrics_auth="on"))
    try:
        problem(await call(http, f"{locked.url}/metrics"), 401)
        assert (await call(http, f"{locked.url}/healthz"))[0] == 200
        status, _, body = await call(http, f"{locked.url}/metrics", mint("ops", ["ds/"]))
        assert status == 200 and b"hub_auth_unauthorized_total 1.0" in body
    finally:
        await locked.stop()


async def test_two_tenants_share_a_spoke_without_sharing_objects(
    make_auth_spoke: AuthSpokeFactory, http: aiohttp.ClientSession, dataset: Dataset, mint: Mint
) -> None:
    spoke = await make_auth_spoke()
    tenant_a, tenant_b = mint("a", ["ds/"]), mint("b", ["other/"])
    admin = mint("ops", [""], admin=True)
    for path in ("ds/partial.bin", "ds/small.bin"):
        status, headers, body = await call(http, f"{spoke.url}/objects/{path}", tenant_a)
        assert status == 200 and body == dataset[1][path] and headers["X-Cache"] == "MISS"
        status, headers, _ = await call(http, f"{spoke.url}/objects/{path}", tenant_a)
        assert headers["X-Cache"] == "HIT"
    # Settled: the chunks answered may still be on their way to disk.
    before = await settled_stats(http, spoke.url, headers={"Authorization": f"Bearer {admin}"})
    assert before["used_bytes"] > 0
    # Whatever is cached, B's token does not cover it: no bytes, no cache headers.
    for path in ("ds/partial.bin", "ds/small.bin", "ds/empty.bin"):
        for method, extra in (("GET", {}), ("HEAD", {}), ("GET", {"Range": "bytes=0-0"}),
                              ("GET", {"If-None-Match": "*"})):
            response = await call(http, f"{spoke.url}/objects/{path}", tenant_b, method=method,
                                  headers=extra)
            problem(response, 403)
            assert "X-Cache" not in response[1] and "ETag" not in response[1]
    status, _, body = await call(http, f"{spoke.url}/objects/other/notes.csv", tenant_b)
    assert status == 200 and body == dataset[1]["other/notes.csv"]
    problem(await call(http, f"{spoke.url}/objects/other/notes.csv", tenant_a), 403)
    after = json.loads((await call(http, f"{spoke.url}/stats", admin))[2])
    assert after["hits"] == before["hits"]  # B's refusals never touched the cache


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
async def test_listing_is_filtered_to_the_tokens_prefixes(
    server: RunningServer, http: aiohttp.ClientSession, dataset: Dataset, mint: Mint,
    accept: str,
) -> None:
    # "ds" as a listing prefix is a string prefix: it also matches "dsX/...".
    sibling = dataset[0] / "dsX" / "secret.bin"
    sibling.parent.mkdir()
    sibling.write_bytes(b"not for tenant a")
    everything = mint("ops", [""])
    tenant_a = mint("a", ["ds"])
    unfiltered = await _listing(http, f"{server.url}/list/ds", everything, accept)
    assert "dsX/secret.bin" in unfiltered
    listed = await _listing(http, f"{server.url}/list/ds", tenant_a, accept)
    assert listed == sorted(p for p in FILES if p.startswith("ds/"))
    assert await _listing(http, f"{server.url}/list/ds/", tenant_a, accept) == listed
    narrow = mint("n", ["ds/small.bin", "ds/exact.bin"])
    problem(await call(http, f"{server.url}/list/ds/", narrow), 403)
    assert await _listing(http, f"{server.url}/list/ds/small.bin", narrow, accept) == [
        "ds/small.bin"
    ]


async def _listing(http: aiohttp.ClientSession, url: str, token: str, accept: str) -> list[str]:
    status, headers, body = await call(http, url, token, headers={"Accept": accept})
    assert status == 200, body
    assert headers["Content-Type"].startswith(accept)
    doc = msgpack.unpackb(body) if accept == "application/msgpack" else json.loads(body)
    return sorted(e["path"] for e in doc["objects"])


async def test_admin_endpoints_need_the_admin_scope(
    make_auth_spoke: AuthSpokeFactory, http: aiohttp.ClientSession, mint: Mint
) -> None:
    spoke = await make_auth_spoke()
    user = mint("a", [""])
    admin = mint("ops", [""], admin=True)
    narrow_admin = mint("ops-ds", ["ds/"], admin=True)
    refused = [
        ("GET", "/stats", None), ("GET", "/warm", None), ("GET", "/warm/abc", None),
        ("DELETE", "/warm/abc", None), ("POST", "/warm", {"paths": ["ds/small.bin"]}),
        ("DELETE", "/cache/ds/small.bin", None), ("DELETE", "/cache/ds/", None),
        ("GET", "/plans", None),
    ]
    for method, path, payload in refused:
        problem(await call(http, spoke.url + path, method=method, json=payload), 401)
        problem(await call(http, spoke.url + path, user, method=method, json=payload), 403)
    assert (await call(http, f"{spoke.url}/stats", admin))[0] == 200
    status, _, body = await call(http, f"{spoke.url}/warm", admin, method="POST",
                                 json={"paths": ["ds/small.bin"]})
    assert status == 202, body
    assert (await call(http, f"{spoke.url}/cache/ds/small.bin", admin, method="DELETE"))[0] == 200
    # An admin scoped to ds/ purges and warms only inside ds/.
    assert (await call(http, f"{spoke.url}/cache/ds/", narrow_admin, method="DELETE"))[0] == 200
    problem(await call(http, f"{spoke.url}/cache/other/notes.csv", narrow_admin,
                       method="DELETE"), 403)
    problem(await call(http, f"{spoke.url}/warm", narrow_admin, method="POST",
                       json={"paths": ["ds/small.bin", "other/notes.csv"]}), 403)
    problem(await call(http, f"{spoke.url}/warm", narrow_admin, method="POST",
                       json={"prefix": ""}), 403)


async def test_read_plans_only_name_paths_the_token_covers(
    make_auth_spoke: AuthSpokeFactory, http: aiohttp.ClientSession, mint: Mint
) -> None:
    spoke = await make_auth_spoke()
    tenant_a = mint("a", ["ds/"])
    doc = problem(await call(http, f"{spoke.url}/plans", tenant_a, method="POST",
                             json={"reads": [["ds/small.bin", 0, 10], ["other/notes.csv", 0, 10]]}),
                  403)
    assert "other/notes.csv" in str(doc["detail"])
    status, _, body = await call(http, f"{spoke.url}/plans", tenant_a, method="POST",
                                 json={"reads": [["ds/small.bin", 0, 10]]})
    assert status == 201, body


async def test_spoke_without_a_hub_token_says_so(
    make_auth_spoke: AuthSpokeFactory, http: aiohttp.ClientSession, mint: Mint
) -> None:
    spoke = await make_auth_spoke(hub_token_file=None)
    doc = problem(await call(http, f"{spoke.url}/objects/ds/small.bin", mint("a", ["ds/"])), 502)
    assert "401" in str(doc["detail"]) and "--hub-token-file" in str(doc["detail"])


async def test_spoke_tokens_pass_the_hub_only_within_their_own_prefixes(
    make_auth_spoke: AuthSpokeFactory, http: aiohttp.ClientSession, mint: Mint, tmp_path: Path
) -> None:
    narrow = tmp_path / "narrow-hub-token"
    narrow.write_text(mint("spoke-ds", ["ds/"]))
    spoke = await make_auth_spoke(hub_token_file=str(narrow))
    everything = mint("a", [""])
    assert (await call(http, f"{spoke.url}/objects/ds/small.bin", everything))[0] == 200
    doc = problem(await call(http, f"{spoke.url}/objects/other/notes.csv", everything), 502)
    assert "403" in str(doc["detail"])


async def test_key_rotation_on_a_running_hub(
    dataset: Dataset, secret_file: Path, tmp_path: Path, http: aiohttp.ClientSession, mint: Mint
) -> None:
    new_secret = write_secret(tmp_path / "new-secret")
    old_token = mint("a", ["ds/"])
    new_token = mint("a", ["ds/"], key=new_secret.read_bytes().strip())
    hub = await start_hub(HubConfig(
        root=str(dataset[0]), chunk_size=CHUNK, auth_secret_file=str(new_secret),
        auth_previous_secret_file=str(secret_file),
    ))
    try:
        for token in (old_token, new_token):
            assert (await call(http, f"{hub.url}/objects/ds/small.bin", token))[0] == 200
    finally:
        await hub.stop()


async def test_no_token_in_logs_or_answers(
    server: RunningServer, http: aiohttp.ClientSession, mint: Mint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = mint("a", ["ds/"])
    expired = mint("a", ["ds/"], ttl_s=60, now=time.time() - 61)
    tampered = good[:-3] + "AAA"
    caplog.set_level(logging.DEBUG)
    bodies: list[bytes] = []
    for token in (good, tampered, expired):
        for path in ("/objects/ds/small.bin", "/objects/other/notes.csv", "/list/", "/nope"):
            bodies.append((await call(http, server.url + path, token))[2])
    assert any(r.name == "hubspoke.access" for r in caplog.records)
    logged = caplog.text + " ".join(str(vars(r)) for r in caplog.records)
    for token in (good, tampered, expired):
        signature = token.rsplit(".", 1)[1]
        assert signature not in logged
        assert all(signature.encode() not in body for body in bodies if body[:1] == b"{")


CROSSING_TARGETS = [
    "/objects/ds/../other/notes.csv",
    "/objects/ds/%2e%2e/other/notes.csv",
    "/objects/ds/%2E%2E/other/notes.csv",
    "/objects/ds/%252e%252e/other/notes.csv",
    "/objects/ds/..%2fother%2fnotes.csv",
    "/objects/ds%2f..%2fother%2fnotes.csv",
    "/objects/ds/.%2e/other/notes.csv",
    "/objects/ds\\..\\other\\notes.csv",
    "/objects/ds/..%5cother%5cnotes.csv",
    "/objects/./other/notes.csv",
    "/objects//other/notes.csv",
    "/objects/other/notes.csv",
    "/manifest/ds/../other/notes.csv",
    "/list/ds/../other/",
    "/list/ds/%2e%2e/other/",
]


async def test_no_encoding_of_the_path_crosses_a_prefix(
    server: RunningServer, dataset: Dataset, mint: Mint
) -> None:
    """Tenant of ``ds/`` sends raw targets that would resolve into ``other/``."""
    token = mint("a", ["ds/"])
    secret = dataset[1]["other/notes.csv"]
    for target in CROSSING_TARGETS:
        status, _, body = await raw_request(server.url, target, f"Authorization: Bearer {token}")
        assert status in (400, 403, 404), (target, status)
        assert secret[:64] not in body and b"notes.csv" not in body.split(b"detail")[0], target
    status, _, body = await raw_request(
        server.url, "/objects/ds/small.bin", f"Authorization: Bearer {token}")
    assert status == 200 and body == dataset[1]["ds/small.bin"]


