"""/healthz, /metrics, /list, /manifest, /stats and error routes over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import msgpack
import pytest
import xxhash

from tests.conftest import CHUNK, FILES, SpokeFactory
from tests.support.http import assert_problem, fetch, scrape, stats
from tests.support.servers import RunningServer
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]

SPOKE_METRICS = {
    "spoke_cache_hits_total": "hits",
    "spoke_cache_misses_total": "misses",
    "spoke_hub_fetches_total": "hub_fetches",
    "spoke_hub_bytes_total": "hub_bytes",
    "spoke_singleflight_joins_total": "singleflight_joins",
    "spoke_evictions_total": "evictions",
    "spoke_cache_used_bytes": "used_bytes",
    "spoke_cache_capacity_bytes": "capacity_bytes",
}
STATS_KEYS = {*SPOKE_METRICS.values(), "policy"}
CAPACITY = 64 << 20  # what tests/conftest.py's make_spoke configures


async def test_healthz(
    server: RunningServer, hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    status, headers, body = await fetch(http, f"{server.url}/healthz")
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "application/json"
    # The hub also says its chunk size: a spoke asks it at start (spoke.cache.early).
    expected = {"status": "ok", "chunk_size": CHUNK} if server is hub else {"status": "ok"}
    assert json.loads(body) == expected


async def test_hub_metrics_count_requests_and_object_bytes_exactly(
    hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    before = await scrape(http, hub.url)
    assert {"hub_requests_total", "hub_bytes_sent_total"} <= before.keys()
    base = f"{hub.url}/objects"
    sent = [
        await fetch(http, f"{base}/ds/small.bin"),  # 1000 bytes
        await fetch(http, f"{base}/ds/big.bin", {"Range": "bytes=0-99"}),  # 100
        await fetch(http, f"{base}/ds/big.bin", method="HEAD"),  # none
        await fetch(http, f"{base}/ds/small.bin", {"Range": "bytes=0-9,20-29"}),  # 20
        await fetch(http, f"{base}/ds/small.bin", {"Range": "bytes=5000-"}),  # 416: none
        await fetch(http, f"{base}/ds/empty.bin"),  # none
        await fetch(http, f"{base}/ds/missing.bin"),  # 404: none
    ]
    assert [r[0] for r in sent] == [200, 206, 200, 206, 416, 200, 404]
    after = await scrape(http, hub.url)
    assert after["hub_bytes_sent_total"] - before["hub_bytes_sent_total"] == 1120
    # Seven requests, plus the second scrape itself.
    assert after["hub_requests_total"] - before["hub_requests_total"] == 8


async def test_spoke_fills_cost_the_hub_exactly_the_object_bytes(
    hub: RunningServer, spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1]["ds/partial.bin"]
    before = await scrape(http, hub.url)
    for _ in range(2):
        status, _, body = await fetch(http, f"{spoke.url}/objects/ds/partial.bin")
        assert (status, body) == (200, data)
    after = await scrape(http, hub.url)
    assert after["hub_bytes_sent_total"] - before["hub_bytes_sent_total"] == len(data)
    assert (await stats(http, spoke.url))["hub_bytes"] == len(data)


async def test_spoke_stats_and_metrics_agree_and_are_exact(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1]["ds/big.bin"]
    chunks = -(-len(data) // CHUNK)
    assert chunks == 41

    empty = await stats(http, spoke.url)
    assert empty.keys() >= STATS_KEYS
    assert {k: empty[k] for k in STATS_KEYS} == {
        "hits": 0, "misses": 0, "hub_fetches": 0, "hub_bytes": 0, "singleflight_joins": 0,
        "evictions": 0, "used_bytes": 0, "capacity_bytes": CAPACITY, "policy": "arc",
    }

    for _ in range(2):
        status, _, body = await fetch(http, f"{spoke.url}/objects/ds/big.bin")
        assert (status, body) == (200, data)
    status, _, body = await fetch(
        http, f"{spoke.url}/objects/ds/big.bin", {"Range": f"bytes={CHUNK - 1}-{CHUNK}"}
    )
    assert (status, body) == (206, data[CHUNK - 1 : CHUNK + 1])

    # An answer ends once its bytes are verified; the last chunks may still be on
    # their way to disk, not yet in used_bytes (as on a loaded machine). The figures
    # are the snapshot that shows none in flight or being stored, not a later one.
    figures = await settled_stats(http, spoke.url)
    assert {k: figures[k] for k in STATS_KEYS} == {
        "hits": chunks + 2, "misses": chunks, "hub_fetches": chunks, "hub_bytes": len(data),
        "singleflight_joins": 0, "evictions": 0, "used_bytes": len(data),
        "capacity_bytes": CAPACITY, "policy": "arc",
    }
    samples = await scrape(http, spoke.url)
    for metric, key in SPOKE_METRICS.items():
        assert samples[metric] == figures[key], metric


async def test_spoke_stats_name_the_configured_policy(
    make_spoke: SpokeFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    spoke = await make_spoke(policy="lru", capacity_bytes=10 * CHUNK)
    figures = await stats(http, spoke.url)
    assert (figures["policy"], figures["capacity_bytes"]) == ("lru", 10 * CHUNK)
    assert (await scrape(http, spoke.url))["spoke_cache_capacity_bytes"] == 10 * CHUNK
    # The reuse gate is the default; --admission all leaves the policy to admit by itself.
    assert {key: figures[key] for key in figures if key.startswith("admission")} == {
        "admission": "reuse", "admission_window_bytes": 0, "admission_promoted": 0,
        "admission_replaced": 0}
    other = await make_spoke(policy="arc", admission="all", cache_dir=str(tmp_path / "all"))
    assert (await stats(http, other.url))["admission"] == "policy"


async def expected_listing(
    http: aiohttp.ClientSession, base_url: str, prefix: str
) -> list[dict[str, object]]:
    """The entries a listing of ``prefix`` must hold, with each object's own ETag."""
    entries: list[dict[str, object]] = []
    for path in sorted(p for p in FILES if p.startswith(prefix)):
        status, headers, _ = await fetch(http, f"{base_url}/objects/{path}", method="HEAD")
        assert status == 200
        entries.append({"path": path, "size": FILES[path], "etag": headers["ETag"]})
    return entries


@pytest.mark.parametrize("prefix", ["ds/", "other/", "", "ds"])
async def test_list_json(
    server: RunningServer, http: aiohttp.ClientSession, prefix: str
) -> None:
    want = await expected_listing(http, server.url, prefix)
    assert len(want) == {"ds/": 6, "other/": 1, "": 7, "ds": 6}[prefix]
    status, headers, body = await fetch(http, f"{server.url}/list/{prefix}")
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "application/json"
    listing = json.loads(body)
    assert sorted(listing["objects"], key=lambda e: e["path"]) == want


@pytest.mark.parametrize(
    "which",
    [
        "hub",
        "spoke",
    ],
)
async def test_list_without_prefix_lists_everything(
    which: str, hub: RunningServer, make_spoke: SpokeFactory, http: aiohttp.ClientSession
) -> None:
    server = hub if which == "hub" else await make_spoke()
    status, _, body = await fetch(http, f"{server.url}/list")
    assert status == 200
    assert sorted(e["path"] for e in json.loads(body)["objects"]) == sorted(FILES)


async def test_list_of_an_empty_prefix_is_empty(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    status, _, body = await fetch(http, f"{server.url}/list/nothing-here/")
    assert status == 200
    assert json.loads(body)["objects"] == []


async def test_list_msgpack_has_the_same_content(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    want = await expected_listing(http, server.url, "ds/")
    status, headers, body = await fetch(
        http, f"{server.url}/list/ds/", {"Accept": "application/msgpack"}
    )
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "application/msgpack"
    listing = msgpack.unpackb(body, raw=False)
    assert sorted(listing["objects"], key=lambda e: e["path"]) == want
    _, _, json_body = await fetch(http, f"{server.url}/list/ds/")
    assert listing["objects"] == json.loads(json_body)["objects"]


async def test_hub_and_spoke_list_identically(
    hub: RunningServer, spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    for accept in ("application/json", "application/msgpack"):
        _, h_headers, h_body = await fetch(http, f"{hub.url}/list/", {"Accept": accept})
        _, s_headers, s_body = await fetch(http, f"{spoke.url}/list/", {"Accept": accept})
        # The hub adds "; charset=utf-8" to JSON; the media type is what must agree.
        assert s_headers["Content-Type"].split(";")[0] == h_headers["Content-Type"].split(";")[0]
        assert s_body == h_body


@pytest.mark.parametrize("path", sorted(FILES))
async def test_manifest(
    hub: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, path: str
) -> None:
    data = dataset[1][path]
    _, object_headers, _ = await fetch(http, f"{hub.url}/objects/{path}", method="HEAD")
    status, headers, body = await fetch(http, f"{hub.url}/manifest/{path}")
    assert status == 200
    assert headers["Content-Type"].split(";")[0] == "application/msgpack"
    manifest = msgpack.unpackb(body, raw=False)
    assert {"path", "size", "etag", "chunk_size", "digests", "digest_alg"} <= manifest.keys()
    assert manifest["path"] == path
    assert manifest["size"] == len(data)
    assert manifest["etag"] == object_headers["ETag"]
    assert manifest["chunk_size"] == CHUNK
    assert manifest["digest_alg"] == "xxh3-128"
    assert len(manifest["digests"]) == -(-len(data) // CHUNK)
    assert manifest["digests"] == [
        xxhash.xxh3_128_digest(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)
    ]


async def test_manifest_of_a_missing_object_is_404(
    hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert_problem(await fetch(http, f"{hub.url}/manifest/ds/missing.bin"), 404)


@pytest.mark.parametrize(
    "route", ["/nope", "/objects", "/objects/", "/list-all", "/healthz/extra", "/"]
)
async def test_unknown_route_is_404(
    server: RunningServer, http: aiohttp.ClientSession, route: str
) -> None:
    assert_problem(await fetch(http, f"{server.url}{route}"), 404)


async def test_role_specific_routes_are_404_on_the_other_server(
    hub: RunningServer, spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert_problem(await fetch(http, f"{hub.url}/stats"), 404)
    assert_problem(await fetch(http, f"{spoke.url}/manifest/ds/small.bin"), 404)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_writes_to_objects_are_405(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, method: str
) -> None:
    response = await fetch(http, f"{server.url}/objects/ds/small.bin", method=method)
    assert_problem(response, 405)
    assert "GET" in response[1]["Allow"]
    # And nothing was written.
    status, _, body = await fetch(http, f"{server.url}/objects/ds/small.bin")
    assert (status, body) == (200, dataset[1]["ds/small.bin"])


async def test_post_to_other_endpoints_is_405(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for route in ("/healthz", "/metrics", "/list/ds/"):
        response = await fetch(http, f"{server.url}{route}", method="POST")
        assert_problem(response, 405)
        assert "GET" in response[1]["Allow"]


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack", "*/*"])
async def test_list_says_it_varies_with_accept(
    server: RunningServer, http: aiohttp.ClientSession, accept: str
) -> None:
    """/list picks JSON or msgpack by Accept: a cache must know (RFC 9110 §12.5.5)."""
    status, headers, _ = await fetch(http, f"{server.url}/list/ds/", {"Accept": accept})
    assert status == 200
    assert headers["Vary"] == "Accept"


# Fields that differ between any two answers, or are the spoke's own.
PER_ANSWER = {"date", "x-request-id", "x-cache"}


async def test_hub_and_spoke_cannot_be_told_apart_but_by_x_cache(
    hub: RunningServer, spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    requests: list[tuple[str, dict[str, str]]] = [
        ("/objects/ds/small.bin", {}),
        ("/objects/ds/small.bin", {"Range": "bytes=10-19"}),
        ("/objects/ds/missing.bin", {}),
        ("/objects/ds/small.bin", {"Range": "bytes=5000-"}),
        ("/list/ds/", {}),
        ("/list/ds/", {"Accept": "application/msgpack"}),
        ("/list/", {"Accept": "application/json"}),
        ("/nope", {}),
    ]
    for target, headers in requests:
        for _ in range(2):  # the spoke cold, then warm
            h_status, h_headers, h_body = await fetch(http, f"{hub.url}{target}", headers)
            s_status, s_headers, s_body = await fetch(http, f"{spoke.url}{target}", headers)
            assert (s_status, s_body) == (h_status, h_body), target
            h_fields = {k.lower(): v for k, v in h_headers.items() if k.lower() not in PER_ANSWER}
            s_fields = {k.lower(): v for k, v in s_headers.items() if k.lower() not in PER_ANSWER}
            assert s_fields == h_fields, target
            assert h_headers["Server"] == "hubspoke"
