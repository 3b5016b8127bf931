"""Faults of the store behind an ``s3://`` hub: throttling, an unreachable or slow store,
a body cut short, an object deleted or overwritten mid-read, an object without an ETag.
None may give a wrong byte or a wrong digest; each gets a clear answer."""

from __future__ import annotations

import asyncio

import aiohttp

from protocol.digests import digest
from protocol.manifest import decode_manifest
from tests.hub_s3.conftest import CHUNK, Bucket, HubFactory
from tests.hub_s3.store_proxy import StoreProxy
from tests.support.http import assert_problem, fetch
from tests.support.servers import RunningServer

BIG = "ds/big.bin"
BIG_KEY = "/data/team/corpus/ds/big.bin"


async def read_or_cut(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes] | None:
    """The status and whole body, or None when the answer was cut mid-body."""
    try:
        async with http.get(url) as resp:
            return resp.status, await resp.read()
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        return None


def assert_retry_after(response: tuple[int, object, bytes]) -> None:
    problem = assert_problem(response, 503)  # type: ignore[arg-type]
    assert "store" in str(problem["detail"])
    headers = response[1]
    assert int(headers["Retry-After"]) >= 1  # type: ignore[index]


async def test_throttling_is_retried_until_the_store_answers(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    before = proxy.faults.requests
    proxy.faults.slow_down = 2
    status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/small.bin")
    assert (status, body) == (200, bucket.contents["ds/small.bin"])
    assert proxy.faults.slow_down == 0
    assert proxy.faults.requests - before == 2 + 2  # two refused HEADs, the HEAD, the GET


async def test_throttling_that_does_not_stop_is_503_with_retry_after(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    proxy.faults.slow_down = 1000
    for kind in ("objects", "manifest"):
        assert_retry_after(await fetch(http, f"{s3_hub.url}/{kind}/ds/small.bin"))
    assert_retry_after(await fetch(http, f"{s3_hub.url}/list/ds/"))
    proxy.faults.slow_down = 0
    status, _, body = await fetch(http, f"{s3_hub.url}/objects/ds/small.bin")
    assert (status, body) == (200, bucket.contents["ds/small.bin"])


async def test_an_unreachable_store_is_503_with_retry_after(
    s3_hub: RunningServer, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    await proxy.stop()  # the hub's endpoint now refuses connections
    for kind in ("objects", "manifest"):
        assert_retry_after(await fetch(http, f"{s3_hub.url}/{kind}/ds/small.bin"))
    assert_retry_after(await fetch(http, f"{s3_hub.url}/list/ds/"))


async def test_a_store_slower_than_the_timeout_is_503(
    make_s3_hub: HubFactory, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    hub = await make_s3_hub(s3_timeout=1.0)
    proxy.faults.hold_s = 8.0  # well past the hub's timeout on any machine
    # HEAD is not held: the GET of the digest pass is, each of its attempts timing out.
    assert_retry_after(await fetch(http, f"{hub.url}/manifest/ds/small.bin"))
    assert proxy.faults.gets["/data/team/corpus/ds/small.bin"] >= 2  # retried first


async def test_a_body_cut_mid_chunk_never_yields_a_digest(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    proxy.faults.cut_after = CHUNK * 2 + 100
    assert_retry_after(await fetch(http, f"{s3_hub.url}/manifest/{BIG}"))
    status, _, body = await fetch(http, f"{s3_hub.url}/manifest/{BIG}")
    assert status == 200
    data = bucket.contents[BIG]
    assert list(decode_manifest(body).digests) == [
        digest("xxh3-128", data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)
    ]


async def test_a_body_cut_mid_range_cuts_the_answer_never_pads_it(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    proxy.faults.cut_after = CHUNK * 2 + 100
    assert await read_or_cut(http, f"{s3_hub.url}/objects/{BIG}") is None
    assert await read_or_cut(http, f"{s3_hub.url}/objects/{BIG}") == (200, bucket.contents[BIG])


async def test_an_object_deleted_mid_read_is_404(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    async def delete() -> None:
        await asyncio.to_thread(bucket.delete, BIG)

    proxy.faults.before_get = delete  # after the hub's HEAD, before its GET
    assert_problem(await fetch(http, f"{s3_hub.url}/manifest/{BIG}"), 404)
    assert_problem(await fetch(http, f"{s3_hub.url}/objects/{BIG}"), 404)


async def test_an_object_deleted_while_sent_is_cut(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    async def delete() -> None:
        await asyncio.to_thread(bucket.delete, BIG)

    proxy.faults.before_get = delete
    assert await read_or_cut(http, f"{s3_hub.url}/objects/{BIG}") is None


async def test_an_object_overwritten_mid_read_is_a_new_version_never_mixed_bytes(
    s3_hub: RunningServer, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    old = bucket.contents[BIG]
    new = bytes(b ^ 0x5A for b in old)

    async def overwrite() -> None:
        await asyncio.to_thread(bucket.write, BIG, new)

    proxy.faults.before_get = overwrite
    problem = assert_problem(await fetch(http, f"{s3_hub.url}/manifest/{BIG}"), 409)
    assert "changed" in str(problem["detail"])
    status, _, body = await fetch(http, f"{s3_hub.url}/manifest/{BIG}")
    assert status == 200
    assert list(decode_manifest(body).digests) == [
        digest("xxh3-128", new[i:i + CHUNK]) for i in range(0, len(new), CHUNK)
    ]
    # Overwritten again while an answer is being sent: cut, never old and new spliced.
    proxy.faults.before_get = lambda: asyncio.to_thread(bucket.write, BIG, old)
    assert await read_or_cut(http, f"{s3_hub.url}/objects/{BIG}") is None
    assert await read_or_cut(http, f"{s3_hub.url}/objects/{BIG}") == (200, old)
    assert all(if_match is not None for if_match, _ in proxy.faults.pins)


async def test_an_object_the_store_gives_no_etag_is_not_served(
    s3_hub: RunningServer, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    proxy.faults.strip_etag = True
    for kind in ("objects", "manifest"):
        problem = assert_problem(await fetch(http, f"{s3_hub.url}/{kind}/ds/small.bin"), 502)
        assert "ETag" in str(problem["detail"])
    assert not proxy.faults.gets  # nothing read of a version that cannot be pinned
