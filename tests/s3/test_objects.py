"""GetObject and HeadObject through the spoke's S3 front end, with boto3 as the client."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError

from service.fast import FAST
from spoke.s3.fast import S3FastReads
from tests.conftest import CHUNK
from tests.s3.conftest import S3Front, get_object
from tests.support.waits import settled_stats, wait_for_stats

Dataset = tuple[Path, dict[str, bytes]]


def _code(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


async def _fails(call: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as raised:
        await asyncio.to_thread(call, **kwargs)
    return _code(raised.value)


async def test_whole_and_ranged_gets_are_byte_exact(front: S3Front, dataset: Dataset) -> None:
    _, contents = dataset
    client = front.client()
    for path in ("ds/empty.bin", "ds/one-byte.bin", "ds/partial.bin", "ds/big.bin",
                 "other/notes.csv"):
        bucket, key = path.split("/", 1)
        answer, body = await get_object(client, Bucket=bucket, Key=key)
        assert body == contents[path], path
        assert answer["ContentLength"] == len(contents[path])
    data = contents["ds/big.bin"]
    for header, want in [("bytes=100-70000", data[100:70001]), ("bytes=-10", data[-10:]),
                         (f"bytes={len(data) - 5}-", data[-5:]),
                         ("bytes=0-99999999", data)]:
        answer, body = await get_object(client, Bucket="ds", Key="big.bin", Range=header)
        assert body == want, header
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert answer["ContentRange"].endswith(f"/{len(data)}")


async def test_headers_match_objects_and_carry_no_checksum(
    front: S3Front, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{front.spoke.url}/objects/ds/partial.bin",
                        headers={"Range": "bytes=10-20"}) as r:
        objects = r.headers
    async with http.get(f"{front.url}/ds/partial.bin", headers={"Range": "bytes=10-20"}) as r:
        assert r.status == 206
        await r.read()
        s3 = r.headers
    for name in ("ETag", "Last-Modified", "Content-Range", "Content-Length", "Accept-Ranges"):
        assert s3[name] == objects[name], name
    assert s3["ETag"].startswith('"') and s3["ETag"].endswith('"')
    assert not [h for h in s3 if h.lower().startswith("x-amz-checksum")]
    assert s3["x-amz-request-id"]


async def test_multiple_ranges_get_the_whole_object(front: S3Front, dataset: Dataset) -> None:
    _, contents = dataset
    answer, body = await get_object(front.client(), Bucket="ds", Key="small.bin",
                                    Range="bytes=0-1,5-6")
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert body == contents["ds/small.bin"]


async def test_conditionals(front: S3Front) -> None:
    client = front.client()
    head = await asyncio.to_thread(client.head_object, Bucket="ds", Key="small.bin")
    etag, modified = head["ETag"], head["LastModified"]
    answer, _ = await get_object(client, Bucket="ds", Key="small.bin", IfMatch=etag)
    assert answer["ETag"] == etag
    assert await _fails(client.get_object, Bucket="ds", Key="small.bin",
                        IfMatch='"other"') == (412, "PreconditionFailed")
    assert await _fails(client.get_object, Bucket="ds", Key="small.bin",
                        IfNoneMatch=etag) == (304, "304")
    assert await _fails(client.get_object, Bucket="ds", Key="small.bin",
                        IfModifiedSince=modified) == (304, "304")
    before = modified - datetime.timedelta(days=1)
    assert await _fails(client.get_object, Bucket="ds", Key="small.bin",
                        IfUnmodifiedSince=before) == (412, "PreconditionFailed")
    answer, _ = await get_object(client, Bucket="ds", Key="small.bin", IfModifiedSince=before)
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200


async def test_unsatisfiable_range_is_invalid_range_with_the_size(
    front: S3Front, http: aiohttp.ClientSession
) -> None:
    assert await _fails(front.client().get_object, Bucket="ds", Key="small.bin",
                        Range="bytes=5000-6000") == (416, "InvalidRange")
    async with http.get(f"{front.url}/ds/small.bin", headers={"Range": "bytes=5000-"}) as r:
        assert r.status == 416
        assert r.headers["Content-Range"] == "bytes */1000"
        assert r.content_type == "application/xml"
        assert "<Code>InvalidRange</Code>" in await r.text()


async def test_response_overrides(front: S3Front) -> None:
    answer, _ = await get_object(
        front.client(), Bucket="ds", Key="small.bin", ResponseContentType="text/x-test",
        ResponseContentDisposition='attachment; filename="s.bin"',
        ResponseCacheControl="no-cache",
    )
    assert answer["ContentType"] == "text/x-test"
    assert answer["ContentDisposition"] == 'attachment; filename="s.bin"'
    assert answer["CacheControl"] == "no-cache"


async def test_head_object_and_its_range(front: S3Front, dataset: Dataset) -> None:
    _, contents = dataset
    client = front.client()
    head = await asyncio.to_thread(client.head_object, Bucket="ds", Key="partial.bin")
    assert head["ContentLength"] == len(contents["ds/partial.bin"])
    assert head["AcceptRanges"] == "bytes"
    head = await asyncio.to_thread(client.head_object, Bucket="ds", Key="partial.bin",
                                   Range="bytes=10-19")
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert head["ContentLength"] == 10
    assert head["ContentRange"] == f"bytes 10-19/{len(contents['ds/partial.bin'])}"
    assert await _fails(client.head_object, Bucket="ds", Key="missing.bin") == (404, "404")


async def test_head_of_the_first_byte_warms_the_whole_object(
    front: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    _, contents = dataset
    size = len(contents["ds/big.bin"])
    head = await asyncio.to_thread(front.client().head_object, Bucket="ds", Key="big.bin",
                                   Range="bytes=0-0")
    assert head["ResponseMetadata"]["HTTPStatusCode"] == 206
    chunks = -(-size // CHUNK)
    await wait_for_stats(http, front.spoke.url,
                         lambda doc: doc["hub_fetches"] >= chunks and doc["chunks_storing"] == 0
                         and doc["hub_fetches_in_flight"] == 0, timeout_s=30)
    async with http.get(f"{front.spoke.url}/objects/ds/big.bin") as r:
        assert await r.read() == contents["ds/big.bin"]
        assert r.headers["X-Cache"] == "HIT"


async def test_one_cache_for_both_fronts(
    front: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    _, contents = dataset
    client = front.client()
    answer, body = await get_object(client, Bucket="ds", Key="partial.bin")
    assert body == contents["ds/partial.bin"]
    await settled_stats(http, front.spoke.url)
    async with http.get(f"{front.spoke.url}/objects/ds/partial.bin") as r:
        assert r.headers["X-Cache"] == "HIT"
        assert await r.read() == contents["ds/partial.bin"]
    async with http.get(f"{front.spoke.url}/objects/ds/exact.bin") as r:
        assert r.headers["X-Cache"] == "MISS"
        await r.read()
    await settled_stats(http, front.spoke.url)
    before = (await settled_stats(http, front.spoke.url))["hub_fetches"]
    answer, body = await get_object(client, Bucket="ds", Key="exact.bin")
    assert body == contents["ds/exact.bin"]
    assert answer["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "HIT"
    assert (await settled_stats(http, front.spoke.url))["hub_fetches"] == before


async def test_missing_object_is_no_such_key_in_xml(
    front: S3Front, http: aiohttp.ClientSession
) -> None:
    assert await _fails(front.client().get_object, Bucket="ds",
                        Key="nope.bin") == (404, "NoSuchKey")
    async with http.get(f"{front.url}/ds/nope.bin") as r:
        text = await r.text()
        assert r.status == 404 and r.content_type == "application/xml"
        assert f"<RequestId>{r.headers['x-amz-request-id']}</RequestId>" in text
        assert "<Resource>/ds/nope.bin</Resource>" in text


async def test_hub_unreachable_is_503_with_retry_after(
    make_front: Any, http: aiohttp.ClientSession
) -> None:
    front = await make_front(hub_url="http://127.0.0.1:9", fetch_attempts=1,
                             connect_timeout_s=1.0, fetch_deadline_s=2.0)
    async with http.get(f"{front.url}/ds/small.bin") as r:
        text = await r.text()
        assert r.status == 503, text
        assert r.headers["Retry-After"]
        assert "<Code>ServiceUnavailable</Code>" in text
    status, code = await _fails(front.client().list_objects_v2, Bucket="ds")
    assert (status, code) == (503, "ServiceUnavailable")


async def test_metrics_count_s3_operations(
    front: S3Front, http: aiohttp.ClientSession
) -> None:
    await get_object(front.client(), Bucket="ds", Key="small.bin")
    with pytest.raises(ClientError):
        await get_object(front.client(), Bucket="ds", Key="nope.bin")
    async with http.get(f"{front.spoke.url}/metrics") as r:
        text = await r.text()
    assert 'spoke_s3_requests_total{operation="GetObject"} 2.0' in text
    assert 'spoke_s3_errors_total{code="NoSuchKey"} 1.0' in text
    assert 'spoke_s3_read_seconds_count{cache="miss"} 1.0' in text
    # The S3 share of every front end's reads, by front end.
    assert 'spoke_read_seconds_count{cache="miss",front="s3"} 1.0' in text
    assert 'spoke_read_seconds_count{cache="miss",front="http"} 0.0' in text


async def test_warm_ranged_reads_answer_alike_on_the_fast_path(
    front: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    data = dataset[1]["ds/big.bin"]
    # Its own connection: one the fast path declines is aiohttp's from then on.
    async with http.get(f"{front.url}/ds/big.bin", headers={"Connection": "close"}) as r:
        assert await r.read() == data
    await settled_stats(http, front.spoke.url)
    fast = front.runner.app[FAST]
    assert isinstance(fast, S3FastReads)
    answered: list[bool] = []
    inner = fast._objects.read

    def spy(*args: Any) -> Any:
        reply = inner(*args)
        answered.append(reply is not None)
        return reply

    fast._objects.read = spy  # type: ignore[method-assign]
    # A plain range (the fast path's), and one only aiohttp takes (an override).
    for lo, hi in ((0, 99), (CHUNK - 10, CHUNK + 10), (0, 600_000), (5, len(data) - 1)):
        answers = []
        for query in ("", "?response-cache-control=x"):
            # Each on its own connection: one the fast path declines is aiohttp's for good.
            async with http.get(f"{front.url}/ds/big.bin{query}",
                                headers={"Range": f"bytes={lo}-{hi}", "Connection": "close"}) as r:
                assert r.status == 206
                assert await r.read() == data[lo:hi + 1]
                assert r.headers["X-Cache"] == "HIT"
                assert r.headers["x-amz-request-id"] == r.headers["X-Request-Id"]
                answers.append({k: v for k, v in r.headers.items()
                                if k.lower() not in ("date", "x-request-id", "x-amz-request-id",
                                                     "cache-control")})
        assert answers[0] == answers[1]
    assert answered.count(True) == 4  # each plain read once, on the fast path
    async with http.get(f"{front.spoke.url}/metrics") as r:
        text = await r.text()
    assert 'spoke_s3_read_seconds_count{cache="hit"} 8.0' in text  # both paths time reads


async def test_fast_path_errors_are_s3_xml(
    front: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    async with http.get(f"{front.url}/ds/small.bin", headers={"Connection": "close"}) as r:
        etag = r.headers["ETag"]
        await r.read()
    async with http.head(f"{front.url}/ds", headers={"Connection": "close"}) as r:
        assert r.status == 200  # the bucket is known to exist: a 404 in it is NoSuchKey
    await settled_stats(http, front.spoke.url)
    fast = front.runner.app[FAST]
    assert isinstance(fast, S3FastReads)
    answered: list[bool] = []
    inner = fast._objects.read

    def spy(*args: Any) -> Any:
        reply = inner(*args)
        answered.append(reply is not None)
        return reply

    fast._objects.read = spy  # type: ignore[method-assign]
    cases = [
        ("GET", "/ds/small.bin", {"If-Match": '"other"'}, 412, "PreconditionFailed"),
        ("GET", "/ds/small.bin", {"If-None-Match": etag}, 304, None),
        ("GET", "/ds/small.bin", {"Range": "bytes=5000-"}, 416, "InvalidRange"),
        ("GET", "/ds/nothing-here.bin", {}, 404, "NoSuchKey"),
        ("HEAD", "/ds/small.bin", {}, 200, None),
        ("GET", "/ds/small.bin", {}, 200, None),
    ]
    for method, path, headers, status, code in cases:
        async with http.request(method, f"{front.url}{path}",
                                headers={**headers, "Connection": "close"}) as r:
            body = await r.read()
            assert r.status == status, (path, headers, body)
            # Once, and the request's id (the fast path's connection writes it).
            assert r.headers.getall("x-amz-request-id") == [r.headers["X-Request-Id"]]
            if code is not None:
                assert r.content_type == "application/xml"
                assert f"<Code>{code}</Code>".encode() in body
                # The path the S3 request named, not the /objects read it became.
                assert f"<Resource>{path}</Resource>".encode() in body
                assert f"<RequestId>{r.headers['X-Request-Id']}</RequestId>".encode() in body
            if status == 416:
                assert r.headers["Content-Range"] == "bytes */1000"
            if status == 200 and method == "GET":
                assert body == dataset[1]["ds/small.bin"]
    assert answered == [True] * len(cases)


async def test_a_client_over_its_in_flight_cap_is_told_to_slow_down(
    make_front: Any, gated: Any, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    front = await make_front(max_inflight_per_client=1)
    gated.gate.clear()  # the hub holds its reads: the first GET stays in flight
    gated.drain()
    first = asyncio.create_task(_read(http, f"{front.url}/ds/small.bin"))
    await asyncio.to_thread(gated.waiting.acquire, True, 30)
    async with http.get(f"{front.url}/ds/partial.bin") as r:
        text = await r.text()
        assert r.status == 503, text
        assert r.headers["Retry-After"]
        assert "<Code>SlowDown</Code>" in text
    gated.gate.set()
    assert await first == dataset[1]["ds/small.bin"]


async def _read(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url) as r:
        return await r.read()


async def test_a_cold_first_read_keeps_its_connection_on_the_fast_path(
    front: S3Front, dataset: Dataset
) -> None:
    fast = front.runner.app[FAST]
    assert isinstance(fast, S3FastReads)
    answered: list[bool] = []
    inner = fast._objects.read

    def spy(*args: Any) -> Any:
        reply = inner(*args)
        answered.append(reply is not None)
        return reply

    fast._objects.read = spy  # type: ignore[method-assign]
    data = dataset[1]["ds/partial.bin"]
    connector = aiohttp.TCPConnector(limit=1)  # one connection for every request
    async with aiohttp.ClientSession(connector=connector) as one:
        for headers, want in [({}, data), ({"Range": "bytes=10-99"}, data[10:100]),
                              ({}, data), ({"Range": "bytes=-7"}, data[-7:])]:
            async with one.get(f"{front.url}/ds/partial.bin", headers=headers) as r:
                assert await r.read() == want
                assert r.headers["x-amz-request-id"]
    assert answered == [True] * 4


async def test_percent_encoded_keys_take_the_fast_path(
    front: S3Front, dataset: Dataset
) -> None:
    root, _ = dataset
    (root / "ds" / "sp ace+%.bin").write_bytes(b"0123456789")
    fast = front.runner.app[FAST]
    assert isinstance(fast, S3FastReads)
    answered: list[bool] = []
    inner = fast._objects.read

    def spy(*args: Any) -> Any:
        reply = inner(*args)
        answered.append(reply is not None)
        return reply

    fast._objects.read = spy  # type: ignore[method-assign]
    client = front.client()
    for rng, want in ((None, b"0123456789"), ("bytes=2-4", b"234")):
        kwargs = {"Range": rng} if rng else {}
        _, body = await get_object(client, Bucket="ds", Key="sp ace+%.bin", **kwargs)
        assert body == want
    assert answered == [True, True]
