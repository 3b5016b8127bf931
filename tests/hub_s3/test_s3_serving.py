"""A hub over an ``s3://`` root serves the bucket's objects exactly as it serves files:
the same bytes, ranges, manifests and listings, to a client and through a spoke."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import aiohttp
import msgpack
import pytest

from hub.store import s3
from protocol.digests import digest
from protocol.manifest import decode_manifest
from spoke.config import SpokeConfig
from tests.hub_s3 import store_proxy
from tests.hub_s3.conftest import CHUNK, Bucket, HubFactory
from tests.hub_s3.store_proxy import StoreProxy
from tests.support.http import assert_problem, fetch
from tests.support.servers import RunningServer, start_spoke


async def test_every_object_comes_back_byte_exact_whole_and_in_ranges(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession
) -> None:
    for path, data in bucket.contents.items():
        status, headers, body = await fetch(http, f"{s3_hub.url}/objects/{path}")
        assert (status, body) == (200, data), path
        assert headers["ETag"].startswith('"') and headers["ETag"].endswith('"')
        if len(data) > 10:
            start, stop = len(data) // 3, len(data) - 2
            status, headers, body = await fetch(
                http, f"{s3_hub.url}/objects/{path}", {"Range": f"bytes={start}-{stop - 1}"}
            )
            assert status == 206 and body == data[start:stop], path
            assert headers["Content-Range"] == f"bytes {start}-{stop - 1}/{len(data)}"


async def test_the_etag_is_the_stores_and_a_conditional_request_uses_it(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession
) -> None:
    _, headers, _ = await fetch(http, f"{s3_hub.url}/objects/ds/small.bin", method="HEAD")
    # rclone's ETag of a single-part object is its MD5, as S3's is.
    md5 = hashlib.md5(bucket.contents["ds/small.bin"]).hexdigest()
    assert headers["ETag"] == f'"{md5}"'
    status, _, body = await fetch(
        http, f"{s3_hub.url}/objects/ds/small.bin", {"If-None-Match": headers["ETag"]}
    )
    assert (status, body) == (304, b"")


async def test_manifests_hold_the_digest_of_every_chunk(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession
) -> None:
    for path, data in bucket.contents.items():
        status, headers, body = await fetch(http, f"{s3_hub.url}/manifest/{path}")
        assert status == 200, body
        manifest = decode_manifest(body)
        assert manifest.size == len(data) and manifest.etag == headers["ETag"]
        expected = [digest(manifest.digest_alg, data[i:i + CHUNK])
                    for i in range(0, len(data), CHUNK)]
        assert list(manifest.digests) == expected, path


async def test_the_digest_pass_reads_each_version_once_in_one_streamed_get(
    s3_hub: RunningServer, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    status, _, _ = await fetch(http, f"{s3_hub.url}/manifest/ds/big.bin")  # 41 chunks
    assert status == 200
    status, _, _ = await fetch(http, f"{s3_hub.url}/manifest/ds/big.bin")
    assert status == 200
    assert proxy.faults.gets["/data/team/corpus/ds/big.bin"] == 1


async def test_a_range_is_read_with_one_store_request_not_one_per_block(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    data = bytes(range(256)) * (12 << 12)  # 12 MiB: many of the hub's send blocks
    bucket.write("ds/large.bin", data)
    status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/large.bin")
    assert status == 200 and body == data
    assert proxy.faults.gets["/data/team/corpus/ds/large.bin"] == 1


async def test_keys_outside_the_prefix_are_neither_listed_nor_served(
    s3_hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    for path in ("outside/secret.bin", "../outside/secret.bin", "team/corpus/ds/small.bin"):
        status, _, _ = await fetch(http, f"{s3_hub.url}/objects/{path}")
        assert status in (400, 404), path
    status, _, body = await fetch(http, f"{s3_hub.url}/list")
    assert status == 200
    assert all(not o["path"].startswith("outside") for o in json.loads(body)["objects"])


async def test_a_missing_object_is_404_problem_json(
    s3_hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    for kind in ("objects", "manifest"):
        assert_problem(await fetch(http, f"{s3_hub.url}/{kind}/ds/nope.bin"), 404)


async def test_the_listing_names_every_object_with_size_and_the_etag_a_head_gives(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession
) -> None:
    status, headers, body = await fetch(http, f"{s3_hub.url}/list/ds/")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["prefix"] == "ds/"
    expected = {p: len(d) for p, d in bucket.contents.items() if p.startswith("ds/")}
    assert {o["path"]: o["size"] for o in doc["objects"]} == expected
    for entry in doc["objects"]:
        _, head, _ = await fetch(http, f"{s3_hub.url}/objects/{entry['path']}", method="HEAD")
        assert entry["etag"] == head["ETag"]
    status, headers, packed = await fetch(
        http, f"{s3_hub.url}/list/ds/", {"Accept": "application/msgpack"}
    )
    assert status == 200 and headers["Content-Type"] == "application/msgpack"
    assert msgpack.unpackb(packed) == doc


async def test_a_listing_of_many_pages_streams_in_order(
    s3_hub: RunningServer, http: aiohttp.ClientSession
) -> None:
    many = [f"many/k{i:05d}" for i in range(2345)]  # three store pages (seeded as files)
    status, headers, body = await fetch(http, f"{s3_hub.url}/list/many/")
    assert status == 200 and "Content-Length" not in headers  # streamed, not built whole
    doc = json.loads(body)
    assert [o["path"] for o in doc["objects"]] == many
    # Framed exactly as a built answer would be.
    assert body == json.dumps(doc).encode()
    _, _, packed = await fetch(http, f"{s3_hub.url}/list/many/",
                               {"Accept": "application/msgpack"})
    assert msgpack.unpackb(packed) == doc
    for accept in ("application/json", "application/msgpack"):
        status, _, body = await fetch(http, f"{s3_hub.url}/list/nothing-here/", {"Accept": accept})
        assert status == 200
        empty = msgpack.unpackb(body) if "msgpack" in accept else json.loads(body)
        assert empty == {"prefix": "nothing-here/", "objects": []}


async def test_a_spoke_in_front_serves_the_bucket_byte_exact(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    spoke = await start_spoke(SpokeConfig(
        hub_url=s3_hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
    ))
    try:
        for _ in range(2):  # cold, then from the spoke's cache
            for path, data in bucket.contents.items():
                status, _, body = await fetch(http, f"{spoke.url}/objects/{path}")
                assert (status, body) == (200, data), path
        # The hub's streamed listing, relayed by the spoke as it is.
        _, _, direct = await fetch(http, f"{s3_hub.url}/list/ds/")
        status, _, relayed = await fetch(http, f"{spoke.url}/list/ds/")
        assert status == 200 and json.loads(relayed) == json.loads(direct)
        start = CHUNK * 3 + 17
        status, _, body = await fetch(http, f"{spoke.url}/objects/ds/big.bin",
                                      {"Range": f"bytes={start}-{start + CHUNK * 2}"})
        assert status == 206 and body == bucket.contents["ds/big.bin"][start:start + CHUNK * 2 + 1]
    finally:
        await spoke.stop()


async def test_a_new_version_gets_a_new_etag_manifest_and_bytes(
    make_s3_hub: HubFactory, bucket: Bucket, http: aiohttp.ClientSession
) -> None:
    hub = await make_s3_hub()
    _, first, _ = await fetch(http, f"{hub.url}/manifest/ds/small.bin")
    new = b"a new version" * 100
    bucket.write("ds/small.bin", new)
    status, headers, body = await fetch(http, f"{hub.url}/manifest/ds/small.bin")
    assert status == 200 and headers["ETag"] != first["ETag"]
    assert decode_manifest(body).size == len(new)
    status, headers, body = await fetch(http, f"{hub.url}/objects/ds/small.bin")
    assert (status, body) == (200, new)
    # The old version is gone: asking for it by If-Match is refused, not answered.
    status, _, _ = await fetch(http, f"{hub.url}/objects/ds/small.bin",
                               {"If-Match": first["ETag"], "Range": "bytes=0-9"})
    assert status == 412


async def test_a_spokes_chunk_fill_is_one_store_request_and_a_stale_one_is_412(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    key = "/data/team/corpus/ds/big.bin"
    data = bucket.contents["ds/big.bin"]
    _, head, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", method="HEAD")
    heads = proxy.faults.heads[key]
    for start in (0, CHUNK * 7, CHUNK * 40):  # the last one: a range past the end, clipped
        status, headers, body = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
            "Range": f"bytes={start}-{start + CHUNK - 1}", "If-Match": head["ETag"]})
        assert status == 206 and body == data[start:start + CHUNK]
        assert headers["ETag"] == head["ETag"]
        assert headers["Content-Range"] == (
            f"bytes {start}-{min(start + CHUNK, len(data)) - 1}/{len(data)}")
    assert proxy.faults.heads[key] == heads and proxy.faults.gets[key] == 3
    status, _, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
        "Range": "bytes=0-9", "If-Match": '"not-this-version"'})
    assert status == 412
    status, _, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
        "Range": f"bytes={len(data) + 5}-{len(data) + 9}", "If-Match": head["ETag"]})
    assert status == 416


async def test_a_spokes_chunk_fill_is_one_presigned_get_of_the_version_it_names(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    data = bucket.contents["ds/big.bin"]
    key = "/data/team/corpus/ds/big.bin"
    _, headers, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", method="HEAD")
    heads = proxy.faults.heads[key]
    for start in (0, CHUNK, 3 * CHUNK + 5):
        stop = min(start + CHUNK, len(data))
        status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
            "Range": f"bytes={start}-{stop - 1}", "If-Match": headers["ETag"]})
        assert (status, body) == (206, data[start:stop]), start
    # No HEAD: each GET gave the version, the size and the bytes; the URL signed once
    # serves every chunk, and each GET still names the version it must be.
    assert proxy.faults.heads[key] == heads and proxy.faults.gets[key] == 3
    assert proxy.faults.presigned == 3
    assert all(if_match == headers["ETag"] for if_match, _ in proxy.faults.pins)


async def test_a_chunk_fill_the_store_refuses_goes_botocores_way_and_is_retried(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    data = bucket.contents["ds/big.bin"]
    _, headers, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", method="HEAD")
    proxy.faults.slow_down = 2  # the presigned GET, then botocore's first attempt
    status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
        "Range": f"bytes={CHUNK}-{2 * CHUNK - 1}", "If-Match": headers["ETag"]})
    assert (status, body) == (206, data[CHUNK:2 * CHUNK])
    assert proxy.faults.slow_down == 0


async def test_ranges_moved_off_the_stores_socket_leave_its_connection_reusable(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    data = bytes(range(256)) * (8 << 12)  # 8 MiB: sent from the store's socket by splice
    bucket.write("ds/large.bin", data)
    _, headers, _ = await fetch(http, f"{s3_hub.url}/objects/ds/large.bin", method="HEAD")
    proxy.faults.peers.clear()
    for start in (0, 3 << 20, 5 << 20):
        status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/large.bin", {
            "Range": f"bytes={start}-{start + (2 << 20) - 1}", "If-Match": headers["ETag"]})
        assert (status, body) == (206, data[start:start + (2 << 20)]), start
    # One after the other, every GET came on the connection the one before gave back.
    assert len(proxy.faults.peers) == 1


async def test_reads_in_flight_are_not_capped_by_the_cpu_count(
    s3_hub: RunningServer, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy
) -> None:
    data = bucket.contents["ds/big.bin"]
    _, headers, _ = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", method="HEAD")
    fills = 16  # more than a default executor's threads on a small machine
    proxy.faults.gather = fills  # the store answers none until all have asked

    async def fill(i: int) -> tuple[int, bytes]:
        status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/big.bin", {
            "Range": f"bytes={i * CHUNK}-{(i + 1) * CHUNK - 1}", "If-Match": headers["ETag"]})
        return status, body

    answers = await asyncio.gather(*(fill(i) for i in range(fills)))
    assert answers == [(206, data[i * CHUNK:(i + 1) * CHUNK]) for i in range(fills)]
    assert proxy.faults.most_held == fills


async def test_reads_in_flight_are_held_to_the_stores_connections(
    make_s3_hub: HubFactory, bucket: Bucket, http: aiohttp.ClientSession, proxy: StoreProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    most = 3
    monkeypatch.setattr(s3, "STORE_CONNECTIONS", most)
    # The proxy waits for one GET more than the hub may send: then lets the held go.
    monkeypatch.setattr(store_proxy, "GATHER_S", 2.0)
    hub = await make_s3_hub()
    data = bucket.contents["ds/big.bin"]
    _, headers, _ = await fetch(http, f"{hub.url}/objects/ds/big.bin", method="HEAD")
    fills = 2 * most
    proxy.faults.gather = most + 1

    async def fill(i: int) -> tuple[int, bytes]:
        status, _, body = await fetch(chunks, f"{hub.url}/objects/ds/big.bin", {
            "Range": f"bytes={i * CHUNK}-{(i + 1) * CHUNK - 1}", "If-Match": headers["ETag"]})
        return status, body

    # Connections that carry fills only, as a spoke's (the loop sends their GETs).
    async with aiohttp.ClientSession() as chunks:
        answers = await asyncio.gather(*(fill(i) for i in range(fills)))
    assert answers == [(206, data[i * CHUNK:(i + 1) * CHUNK]) for i in range(fills)]
    assert proxy.faults.most_held == most
