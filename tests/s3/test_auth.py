"""Anonymous reads without keys; SigV4 and key scopes with them (--s3-credentials)."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from protocol.s3.credentials import parse_credentials
from service.fast import FAST
from spoke.s3.access import S3Access, utc_now
from spoke.s3.fast import S3FastReads
from tests.s3.conftest import FrontFactory, S3Front, get_object
from tests.support.waits import settled_stats

Dataset = tuple[Path, dict[str, bytes]]
ALL_SECRET = "all-secret-0123456789abcdef"
DS_SECRET = "ds-secret-0123456789abcdef"
KEYS = parse_credentials(f"ALLKEY {ALL_SECRET} ''\nDSKEY {DS_SECRET} ds/exact.bin,ds/small.bin\n")


async def _error(call: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as raised:
        await asyncio.to_thread(call, **kwargs)
    response = raised.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


@pytest.fixture
async def keyed(make_front: FrontFactory) -> S3Front:
    return await make_front(access=S3Access(KEYS))


async def test_anonymous_mode_takes_signed_and_unsigned(front: S3Front, dataset: Dataset) -> None:
    for client in (front.client(), front.client(signed=False),
                   front.client(key="whoever", secret="wrong")):
        _, body = await get_object(client, Bucket="ds", Key="small.bin")
        assert body == dataset[1]["ds/small.bin"]


async def test_keys_require_a_valid_signature(keyed: S3Front, dataset: Dataset) -> None:
    good = keyed.client(key="ALLKEY", secret=ALL_SECRET)
    _, body = await get_object(good, Bucket="ds", Key="partial.bin", Range="bytes=5-500")
    assert body == dataset[1]["ds/partial.bin"][5:501]
    assert await _error(keyed.client(signed=False).get_object, Bucket="ds",
                        Key="small.bin") == (403, "AccessDenied")
    assert await _error(keyed.client(key="ALLKEY", secret="not-the-secret").get_object,
                        Bucket="ds", Key="small.bin") == (403, "SignatureDoesNotMatch")
    assert await _error(keyed.client(key="NOKEY", secret=ALL_SECRET).get_object,
                        Bucket="ds", Key="small.bin") == (403, "InvalidAccessKeyId")
    listed = await asyncio.to_thread(good.list_objects_v2, Bucket="ds")
    assert listed["KeyCount"] == 6


async def test_skewed_clock_is_refused(make_front: FrontFactory) -> None:
    late = S3Access(KEYS, now=lambda: utc_now() + datetime.timedelta(minutes=16))
    front = await make_front(access=late)
    assert await _error(front.client(key="ALLKEY", secret=ALL_SECRET).get_object,
                        Bucket="ds", Key="small.bin") == (403, "RequestTimeTooSkewed")


async def test_scope_holds_even_for_cached_chunks(
    keyed: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    # Cached through /objects first: the key's scope still refuses it.
    async with http.get(f"{keyed.spoke.url}/objects/ds/partial.bin") as r:
        assert await r.read() == dataset[1]["ds/partial.bin"]
    await settled_stats(http, keyed.spoke.url)
    scoped = keyed.client(key="DSKEY", secret=DS_SECRET)
    assert await _error(scoped.get_object, Bucket="ds", Key="partial.bin") == (403,
                                                                               "AccessDenied")
    assert await _error(scoped.head_object, Bucket="ds", Key="partial.bin") == (403, "403")
    assert await _error(scoped.get_object, Bucket="other", Key="notes.csv") == (403,
                                                                               "AccessDenied")
    _, body = await get_object(scoped, Bucket="ds", Key="small.bin")
    assert body == dataset[1]["ds/small.bin"]
    # Listings: only within the scope, and filtered to it.
    assert await _error(scoped.list_objects_v2, Bucket="other") == (403, "AccessDenied")
    listed = await asyncio.to_thread(scoped.list_objects_v2, Bucket="ds", Prefix="exact.bin")
    assert [o["Key"] for o in listed["Contents"]] == ["exact.bin"]
    assert await _error(scoped.list_objects_v2, Bucket="ds") == (403, "AccessDenied")
    buckets = await asyncio.to_thread(scoped.list_buckets)
    assert [b["Name"] for b in buckets["Buckets"]] == ["ds"]


async def test_presigned_urls(
    keyed: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    client = keyed.client(key="ALLKEY", secret=ALL_SECRET)
    url = client.generate_presigned_url("get_object", Params={"Bucket": "ds", "Key": "big.bin"},
                                        ExpiresIn=600)
    async with http.get(url, headers={"Range": "bytes=0-99"}) as r:
        assert r.status == 206
        assert await r.read() == dataset[1]["ds/big.bin"][:100]
    async with http.get(url.replace("X-Amz-Signature=", "X-Amz-Signature=0")) as r:
        assert r.status in (400, 403)
        assert "<Code>" in await r.text()


async def test_presigned_urls_expire(
    make_front: FrontFactory, http: aiohttp.ClientSession
) -> None:
    later = S3Access(KEYS, now=lambda: utc_now() + datetime.timedelta(seconds=700))
    front = await make_front(access=later)
    client = front.client(key="ALLKEY", secret=ALL_SECRET)
    for expires, status in ((600, 403), (3600, 200)):
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": "ds", "Key": "small.bin"}, ExpiresIn=expires)
        async with http.get(url) as r:
            text = await r.text(errors="replace")
            assert r.status == status, text
            if status == 403:
                assert "<Code>AccessDenied</Code>" in text


async def test_virtual_hosted_requests_verify(
    make_front: FrontFactory, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    front = await make_front(domain="s3.test", access=S3Access(KEYS))
    port = front.url.rsplit(":", 1)[1]
    signer = S3SigV4Auth(Credentials("DSKEY", DS_SECRET), "s3", "us-east-1")
    for path, status in (("/small.bin", 200), ("/partial.bin", 403)):
        request = AWSRequest("GET", f"http://ds.s3.test:{port}{path}",
                             headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        signer.add_auth(request)
        headers = {**dict(request.headers.items()), "Host": f"ds.s3.test:{port}"}
        async with http.get(f"{front.url}{path}", headers=headers) as r:
            body = await r.read()
            assert r.status == status, body
            if status == 200:
                assert body == dataset[1]["ds/small.bin"]


async def test_presigned_reads_take_the_fast_path(
    keyed: S3Front, http: aiohttp.ClientSession, dataset: Dataset
) -> None:
    fast = keyed.runner.app[FAST]
    assert isinstance(fast, S3FastReads)
    answered: list[bool] = []
    inner = fast._objects.read

    def spy(*args: Any) -> Any:
        reply = inner(*args)
        answered.append(reply is not None)
        return reply

    fast._objects.read = spy  # type: ignore[method-assign]
    client = keyed.client(key="DSKEY", secret=DS_SECRET)
    url = client.generate_presigned_url("get_object",
                                        Params={"Bucket": "ds", "Key": "exact.bin"})
    data = dataset[1]["ds/exact.bin"]
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as one:
        for rng, want in (("bytes=0-99", data[:100]), ("bytes=70000-", data[70000:]),
                          (None, data)):
            headers = {"Range": rng} if rng else {}
            async with one.get(url, headers=headers) as r:
                assert await r.read() == want
    # Outside the key's scope: refused, by aiohttp, in S3's words.
    denied = client.generate_presigned_url("get_object",
                                           Params={"Bucket": "ds", "Key": "big.bin"})
    async with http.get(denied) as r:
        assert r.status == 403 and "<Code>AccessDenied</Code>" in await r.text()
    assert answered == [True] * 3


class _Clock:
    """The front end's clock, moved by the test: a URL expires without waiting for it."""

    def __init__(self) -> None:
        self.ahead = datetime.timedelta(0)

    def __call__(self) -> datetime.datetime:
        return utc_now() + self.ahead


async def _read(http: aiohttp.ClientSession, url: str, rng: str) -> tuple[int, bytes]:
    async with http.get(url, headers={"Range": rng}) as r:
        return r.status, await r.read()


async def test_a_presigned_url_read_many_times_still_expires(
    make_front: FrontFactory, dataset: Dataset
) -> None:
    clock = _Clock()
    front = await make_front(access=S3Access(KEYS, now=clock))
    client = front.client(key="ALLKEY", secret=ALL_SECRET)
    url = client.generate_presigned_url("get_object", Params={"Bucket": "ds", "Key": "big.bin"},
                                        ExpiresIn=60)
    data = dataset[1]["ds/big.bin"]
    ranges = [(f"bytes={i * 1000}-{i * 1000 + 999}", data[i * 1000:i * 1000 + 1000])
              for i in range(4)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        for rng, want in ranges:  # one connection: the fast path, the URL remembered
            assert await _read(one, url, rng) == (206, want)
        clock.ahead = datetime.timedelta(seconds=62)
        for rng, _ in ranges:
            status, body = await _read(one, url, rng)
            assert status == 403, body
            assert b"<Code>AccessDenied</Code>" in body and b"expired" in body
        # A URL signed now is good: the refusals were the clock's, not a stuck memo's.
        clock.ahead = datetime.timedelta(0)
        assert await _read(one, url, ranges[0][0]) == (206, ranges[0][1])


def _tampered(url: str) -> dict[str, str]:
    signature = url.rsplit("X-Amz-Signature=", 1)[1]
    flipped = ("0" if signature[0] != "0" else "1") + signature[1:]
    return {
        "signature": url.replace(signature, flipped),
        "expiry": url.replace("X-Amz-Expires=60", "X-Amz-Expires=61"),
        "key": url.replace("/ds/big.bin?", "/ds/small.bin?"),
        "credential": url.replace("ALLKEY%2F", "DSKEY%2F"),
        "date": url.replace("X-Amz-Date=20", "X-Amz-Date=19"),
        "extra parameter": url + "&x-id=GetObject",
        "signed headers": url.replace("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=range"),
    }


async def test_a_tampered_presigned_url_is_refused_after_the_good_one(
    keyed: S3Front, dataset: Dataset
) -> None:
    client = keyed.client(key="ALLKEY", secret=ALL_SECRET)
    url = client.generate_presigned_url("get_object", Params={"Bucket": "ds", "Key": "big.bin"},
                                        ExpiresIn=60)
    want = dataset[1]["ds/big.bin"][:100]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        assert await _read(one, url, "bytes=0-99") == (206, want)
        for change, bad in _tampered(url).items():
            assert bad != url, change
            status, body = await _read(one, bad, "bytes=0-99")
            assert status in (400, 403) and b"<Code>" in body, (change, status, body)
        # Another Host: signed, so another request.
        async with one.get(url, headers={"Range": "bytes=0-99", "Host": "evil.example"}) as r:
            assert r.status == 403 and b"SignatureDoesNotMatch" in await r.read()
        assert await _read(one, url, "bytes=0-99") == (206, want)


async def test_a_presigned_get_is_no_head_after_it_was_read(
    keyed: S3Front, dataset: Dataset
) -> None:
    """The fast path keeps a target's verdict: it holds for the method signed only."""
    client = keyed.client(key="ALLKEY", secret=ALL_SECRET)
    url = client.generate_presigned_url("get_object", Params={"Bucket": "ds", "Key": "big.bin"},
                                        ExpiresIn=60)
    want = dataset[1]["ds/big.bin"][:100]
    head_url = client.generate_presigned_url(
        "head_object", Params={"Bucket": "ds", "Key": "big.bin"}, ExpiresIn=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        for _ in range(2):
            assert await _read(one, url, "bytes=0-99") == (206, want)
            async with one.head(url) as r:
                assert r.status == 403, r.headers
            async with one.head(head_url) as r:  # signed for HEAD: good
                assert r.status == 200 and r.headers["Content-Length"] == str(len(
                    dataset[1]["ds/big.bin"]))
            async with one.get(head_url, headers={"Range": "bytes=0-99"}) as r:
                assert r.status == 403 and b"SignatureDoesNotMatch" in await r.read()


async def test_a_key_out_of_scope_is_refused_where_another_key_just_read(
    keyed: S3Front, dataset: Dataset
) -> None:
    """Header-signed reads of one object by two keys share a request target: the fast
    path remembers which key its scope covered, never that the target is allowed."""
    wide = keyed.client(key="ALLKEY", secret=ALL_SECRET)
    scoped = keyed.client(key="DSKEY", secret=DS_SECRET)
    want = dataset[1]["ds/partial.bin"][:100]
    for _ in range(2):
        _, body = await get_object(wide, Bucket="ds", Key="partial.bin", Range="bytes=0-99")
        assert body == want
        assert await _error(scoped.get_object, Bucket="ds", Key="partial.bin",
                            Range="bytes=0-99") == (403, "AccessDenied")
