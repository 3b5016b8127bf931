"""Every request the S3 front end cannot serve gets S3's XML error and status, never a
500 or a traceback; and the spoke serves correct bytes afterwards."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from tests.s3.conftest import S3Front, get_object
from tests.support.raw_http import connect, raw_request

Dataset = tuple[Path, dict[str, bytes]]


def _code(body: bytes) -> str:
    match = re.search(rb"<Code>([^<]*)</Code>", body)
    assert match is not None, body[:300]
    return match.group(1).decode()


@pytest.mark.parametrize(("method", "target", "status", "code"), [
    ("PUT", "/ds/new.bin", 501, "NotImplemented"),
    ("DELETE", "/ds/small.bin", 501, "NotImplemented"),
    ("POST", "/ds/small.bin?uploads", 501, "NotImplemented"),
    ("PUT", "/newbucket", 501, "NotImplemented"),
    ("DELETE", "/ds", 501, "NotImplemented"),
    ("POST", "/ds?delete", 501, "NotImplemented"),
    ("PATCH", "/ds/small.bin", 405, "MethodNotAllowed"),
    ("OPTIONS", "/ds/small.bin", 405, "MethodNotAllowed"),
    ("HEAD", "/", 405, "MethodNotAllowed"),
    ("GET", "/ds/small.bin?acl", 501, "NotImplemented"),
    ("GET", "/ds/small.bin?tagging", 501, "NotImplemented"),
    ("GET", "/ds/small.bin?partNumber=1", 501, "NotImplemented"),
    ("GET", "/ds/small.bin?versionId=abc", 501, "NotImplemented"),
    ("GET", "/ds?versioning", 501, "NotImplemented"),
    ("GET", "/ds?uploads", 501, "NotImplemented"),
    ("GET", "/ds?policy", 501, "NotImplemented"),
    ("GET", "/ds/..%2Fother/notes.csv", 400, "InvalidArgument"),
    ("GET", "/ds/%2e%2e/other/notes.csv", 400, "InvalidArgument"),
    ("GET", "/ds/%252e%252e/other/notes.csv", 400, "InvalidArgument"),
    ("GET", "/ds/a/../../other/notes.csv", 400, "InvalidArgument"),
    ("GET", "/ds/./small.bin", 400, "InvalidArgument"),
    ("GET", "/ds/a//b", 400, "InvalidArgument"),
    ("GET", "/ds/%00.bin", 400, "InvalidArgument"),
    ("GET", "/ds/%ff%fe.bin", 400, "InvalidArgument"),
    ("GET", "/ds/a%5cb", 400, "InvalidArgument"),
    ("GET", "/ds/" + "x" * 2000, 400, "InvalidArgument"),
    ("GET", "/../other/notes.csv", 400, "InvalidBucketName"),
    ("GET", "/%2e%2e/other/notes.csv", 400, "InvalidBucketName"),
    ("GET", "/ds%2Fother/notes.csv", 400, "InvalidBucketName"),
    ("GET", "//small.bin", 400, "InvalidBucketName"),
    ("GET", "/%ff/x", 400, "InvalidBucketName"),
    ("GET", "/ds/small.bin?%ff=1", 400, "InvalidArgument"),
    ("GET", "/ds/small.bin?response-content-type=a%0d%0aX-Evil:%201", 400, "InvalidArgument"),
    ("GET", "/ds/missing.bin", 404, "NoSuchKey"),
    ("GET", "/ds/sub/", 404, "NoSuchKey"),
    ("GET", "/ds/a//", 400, "InvalidArgument"),
    ("GET", "/ds/..%2F", 400, "InvalidArgument"),
    ("GET", "/nobucket/missing.bin", 404, "NoSuchBucket"),
])
async def test_refusals_are_s3_xml(
    front: S3Front, method: str, target: str, status: int, code: str
) -> None:
    answer = await raw_request(front.url, target, "Content-Length: 0", method=method)
    assert answer.status == status, (target, answer.status, answer.body[:300])
    assert answer.headers["x-amz-request-id"]
    if method != "HEAD":
        assert answer.headers["content-type"].startswith("application/xml")
        assert _code(answer.body) == code
        assert b"Traceback" not in answer.body


async def test_a_get_with_a_body_is_refused(front: S3Front, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{front.url}/ds/small.bin", data=b"payload") as r:
        assert r.status == 400
        assert _code(await r.read()) == "InvalidArgument"


async def test_presigned_and_x_id_parameters_are_not_operations(
    front: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    # botocore adds ?x-id=GetObject to some requests; presigned queries carry X-Amz-*.
    async with http.get(f"{front.url}/ds/small.bin?x-id=GetObject&X-Amz-Expires=60") as r:
        assert r.status == 200
        assert await r.read() == dataset[1]["ds/small.bin"]


async def test_still_serving_correct_bytes_after_refusals(
    front: S3Front, dataset: Dataset
) -> None:
    for target in ("/ds/%2e%2e/x", "/ds?max-keys=zz", "/%ff/x", "/ds/small.bin?acl"):
        await raw_request(front.url, target)
    _, body = await get_object(front.client(), Bucket="ds", Key="big.bin")
    assert body == dataset[1]["ds/big.bin"]


async def test_virtual_hosted_buckets(
    make_front: object, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    front = await make_front(domain="s3.test")  # type: ignore[operator]
    port = front.url.rsplit(":", 1)[1]
    async with http.get(f"{front.url}/small.bin", headers={"Host": f"ds.s3.test:{port}"}) as r:
        assert r.status == 200
        assert await r.read() == dataset[1]["ds/small.bin"]
    async with http.get(f"{front.url}/?list-type=2&prefix=sm",
                        headers={"Host": "ds.s3.test"}) as r:
        assert "<Key>small.bin</Key>" in await r.text()
    # The domain itself, or any other Host, is path-style.
    async with http.get(f"{front.url}/ds/small.bin", headers={"Host": "s3.test"}) as r:
        assert r.status == 200
    async with http.get(f"{front.url}/x", headers={"Host": "..%2f.s3.test"}) as r:
        assert r.status == 400
        assert _code(await r.read()) == "InvalidBucketName"


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"PROPFIND /ds/small.bin HTTP/1.1\r\nHost: x\r\n\r\n", 501, "NotImplemented"),
    (b"GET /ds/small.bin HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HttpVersionNotSupported"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n", 400, "InvalidRequest"),
    (b"GET /ds/small.bin HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "InvalidRequest"),
])
async def test_front_door_refusals_are_s3_xml(
    front: S3Front, raw: bytes, status: int, code: str
) -> None:
    reader, writer = await connect(front.url)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=15)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert int(head.split()[1]) == status, data[:300]
    assert b"x-amz-request-id: " in head.lower()
    assert b"application/xml" in head
    assert _code(body) == code
