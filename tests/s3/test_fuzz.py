"""Mangled S3 requests against a real spoke's S3 front end: S3 XML and a 2xx-4xx status
for every one (never a 500), and correct bytes afterwards."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.s3.credentials import parse_credentials
from spoke.s3.access import S3Access
from tests.s3.conftest import FrontFactory, S3Front, get_object
from tests.support.raw_http import raw_request

Dataset = tuple[Path, dict[str, bytes]]
KEYS = parse_credentials("FUZZKEY fuzz-secret-0123456789abcdef ds\n")

_PIECES = st.sampled_from([
    "ds", "other", "small.bin", "big.bin", "sub", "..", ".", "%2e%2e", "%252e", "%2f", "%2F",
    "%00", "%ff", "%c3%a9", "%", "%%", "a b", "é", "\\", "~", "+", "?", "=", "&", "#",
    "x" * 300, "",
])
_PATHS = st.lists(_PIECES, min_size=0, max_size=5).map(lambda parts: "/" + "/".join(parts))
_PARAMS = st.sampled_from([
    "list-type", "prefix", "delimiter", "max-keys", "continuation-token", "start-after",
    "marker", "encoding-type", "location", "acl", "uploads", "versionId", "partNumber",
    "response-content-type", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Date",
    "X-Amz-Expires", "X-Amz-Algorithm", "AWSAccessKeyId", "Signature", "x-id", "%ff", "",
])
_VALUES = st.sampled_from([
    "", "2", "1", "0", "-1", "999999999999999999999", "abc", "/", "..", "%ff", "%2e%2e/x",
    "url", "AWS4-HMAC-SHA256", "FUZZKEY/20200101/us-east-1/s3/aws4_request", "20200101T000000Z",
    "a" * 2000, "%0d%0aX: y", "aGV5", "=",
])
_QUERIES = st.lists(st.tuples(_PARAMS, _VALUES), max_size=4).map(
    lambda pairs: "&".join(f"{k}={v}" if v else k for k, v in pairs))
_AUTH = st.sampled_from([
    None, "", "AWS4-HMAC-SHA256", "AWS4-HMAC-SHA256 Credential=FUZZKEY/20200101/us-east-1/s3/"
    "aws4_request, SignedHeaders=host, Signature=00", "AWS AKIA:sig", "Bearer x",
    "AWS4-HMAC-SHA256 Credential=, SignedHeaders=, Signature=", "AWS4-HMAC-SHA256 " + "A" * 5000,
])
_METHODS = st.sampled_from(["GET", "GET", "GET", "HEAD", "PUT", "DELETE", "POST", "PATCH"])
_RANGES = st.sampled_from([None, "bytes=0-0", "bytes=-5", "bytes=9-1", "bytes=0-1,4-5",
                           "bytes=99999999-", "items=0-1", "bytes=x"])


def _fields(auth: str | None, rng: str | None) -> list[str]:
    fields = ["Content-Length: 0"]
    if auth is not None:
        fields.append(f"Authorization: {auth}")
    if rng is not None:
        fields.append(f"Range: {rng}")
    return fields


async def _check(front: S3Front, method: str, target: str, fields: list[str]) -> None:
    answer = await raw_request(front.url, target, *fields, method=method)
    assert 200 <= answer.status < 500 or answer.status in (501, 505), (
        method, target, fields, answer.status, answer.body[:300])
    assert answer.headers.get("x-amz-request-id"), (method, target)
    if answer.status >= 400 and method != "HEAD":
        assert answer.headers["content-type"].startswith("application/xml"), (method, target)
        assert re.search(rb"<Code>\w+</Code>", answer.body), answer.body[:300]


@pytest.mark.parametrize("keyed", [False, True], ids=["anonymous", "keys"])
async def test_mangled_requests_get_s3_xml_4xx(
    make_front: FrontFactory, dataset: Dataset, keyed: bool
) -> None:
    front = await make_front(access=S3Access(KEYS) if keyed else None)
    loop = asyncio.get_running_loop()
    seen = 0

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(method=_METHODS, path=_PATHS, query=_QUERIES, auth=_AUTH, rng=_RANGES)
    def one(method: str, path: str, query: str, auth: str | None, rng: str | None) -> None:
        nonlocal seen
        target = path + (f"?{query}" if query else "")
        if any(c in target for c in " #\\") or any(ord(c) > 0x7E for c in target):
            target = re.sub(r"[ #\\]|[^\x00-\x7e]", "%20", target)
        asyncio.run_coroutine_threadsafe(
            _check(front, method, target, _fields(auth, rng)), loop).result(timeout=60)
        seen += 1

    await asyncio.to_thread(one)
    assert seen >= 150
    client = front.client(key="FUZZKEY", secret="fuzz-secret-0123456789abcdef")
    _, body = await get_object(client, Bucket="ds", Key="big.bin")
    assert body == dataset[1]["ds/big.bin"]
