"""A spoke's chunk fill from a hub over a real store (rclone, through the counting proxy)
is answered on the fast path (hub.store.fills) exactly as aiohttp's handler answers it;
whatever the fast path cannot answer whole, aiohttp answers, with nothing sent before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
import pytest

from hub.store.plain import PlainGets
from loadtest.s3_stores import S3Store
from spoke.config import SpokeConfig
from tests.hub_s3.conftest import (
    BUCKET,
    CHUNK,
    PREFIX,
    Bucket,
    NotedHub,
    noted_store_hub,
)
from tests.hub_s3.store_proxy import StoreProxy
from tests.support.http import fetch
from tests.support.raw_http import connect, read_answer, request
from tests.support.servers import start_spoke

BIG = "ds/big.bin"  # 40 chunks and 7 bytes
LARGE = "ds/large.bin"  # written by the tests that need a body spliced off the socket


@pytest.fixture
async def fills_hub(
    store: S3Store, proxy: StoreProxy, tmp_path: Path
) -> AsyncIterator[NotedHub]:
    async with noted_store_hub(proxy.url, store, tmp_path) as hub:
        yield hub


async def etag_of(hub: NotedHub, path: str) -> str:
    """The version's ETag, once the version is past its first second: until then its
    Last-Modified is the second before each answer's Date (RFC 9110 §8.8.2.2's weak
    date), so two answers a second apart differ in it."""
    async with asyncio.timeout(30):
        while True:
            reader, writer = await connect(hub.url)
            writer.write(request(f"/objects/{path}", method="HEAD"))
            answer = await read_answer(reader, "HEAD")
            writer.close()
            assert await hub.took() == [False]  # a HEAD is aiohttp's
            modified = parsedate_to_datetime(answer.headers["last-modified"])
            if (parsedate_to_datetime(answer.headers["date"]) - modified).total_seconds() >= 2:
                return answer.headers["etag"]
            await asyncio.sleep(0.2)


def fill(path: str, etag: str, start: int, stop: int, *fields: str) -> bytes:
    return request(f"/objects/{path}", f"Range: bytes={start}-{stop - 1}", f"If-Match: {etag}",
                   *fields)


async def head_and_body(url: str, data: bytes) -> tuple[list[str], bytes]:
    """One whole answer on a new connection: its head's lines in order (Date and request
    id left out: they differ by design) and its body."""
    reader, writer = await connect(url)
    writer.write(data)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    lines = [ln for ln in head.decode("latin-1").split("\r\n") if ln]
    length = next(int(ln.split(": ")[1]) for ln in lines if ln.startswith("Content-Length: "))
    body = await asyncio.wait_for(reader.readexactly(length), 15)
    writer.close()
    return [ln for ln in lines if not ln.startswith(("Date: ", "X-Request-Id: "))], body


async def test_a_chunk_fill_is_answered_on_the_fast_path_as_aiohttps_handler_answers_it(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    bucket.write(LARGE, bytes(range(256)) * (12 << 12))  # 12 MiB: spliced off the socket
    for path in (BIG, LARGE):
        data = bucket.contents[path]
        size = len(data)
        etag = await etag_of(fills_hub, path)
        # One byte, one chunk, the last byte, a range past the end (clipped), 3 MiB.
        spans = [(0, 1), (CHUNK, 2 * CHUNK), (size - 1, size), (size - 10, size + 500),
                 (1000, 1000 + (3 << 20))]
        for start, stop in spans:
            gets = proxy.faults.gets[f"/{BUCKET}/{PREFIX}/{path}"]
            fast = await head_and_body(fills_hub.url, fill(path, etag, start, stop))
            assert await fills_hub.took() == [True], (path, start, stop)
            # A field outside the fast path's set sends the same request to aiohttp.
            slow = await head_and_body(fills_hub.url, fill(path, etag, start, stop, "X-Not: 1"))
            assert await fills_hub.took() == [False]
            assert fast == slow, (path, start, stop)
            assert fast[0][0] == "HTTP/1.1 206 Partial Content"
            assert fast[1] == data[start:stop], (path, start, stop)
            # One store GET each, pinned to the version (the proxy counts what it forwards).
            assert proxy.faults.gets[f"/{BUCKET}/{PREFIX}/{path}"] == gets + 2
            assert proxy.faults.pins[-2][0] == etag


async def test_what_the_store_does_not_answer_with_the_range_aiohttp_answers_with_nothing_sent(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    data = bucket.contents[BIG]
    etag = await etag_of(fills_hub, BIG)
    cases: list[tuple[bytes, int, bytes]] = [
        (fill(BIG, '"stale"', 0, 10), 412, b""),  # rclone ignores If-Match: the hub does not
        (fill("ds/nope.bin", etag, 0, 10), 404, b""),
        (request(f"/objects/{BIG}", "Range: bytes=-10"), 206, data[-10:]),  # not bytes=a-b
        (request(f"/objects/{BIG}", "Range: bytes=0-9,20-29"), 206, b""),  # multipart
    ]
    for data_sent, status, body in cases:
        reader, writer = await connect(fills_hub.url)
        writer.write(data_sent)
        answer = await read_answer(reader)
        writer.close()
        assert answer.status == status, answer.describe()
        assert answer.complete and (not body or answer.body == body)
        assert await fills_hub.took() == [False]
    # The store throttles the fill: aiohttp's path, with botocore's retries, answers it.
    proxy.faults.slow_down = 2
    reader, writer = await connect(fills_hub.url)
    writer.write(fill(BIG, etag, CHUNK, 2 * CHUNK))
    answer = await read_answer(reader)
    writer.close()
    assert (answer.status, answer.complete, answer.body) == (206, True, data[CHUNK:2 * CHUNK])
    assert await fills_hub.took() == [False]


async def test_a_fill_that_names_no_version_is_pinned_to_the_one_a_head_finds(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    data = bucket.contents[BIG]
    etag = await etag_of(fills_hub, BIG)
    key = f"/{BUCKET}/{PREFIX}/{BIG}"
    heads, gets = proxy.faults.heads[key], proxy.faults.gets[key]
    fast = await head_and_body(fills_hub.url, request(f"/objects/{BIG}", "Range: bytes=5-99"))
    assert await fills_hub.took() == [True]
    slow = await head_and_body(
        fills_hub.url, request(f"/objects/{BIG}", "Range: bytes=5-99", "X-Not: 1"))
    assert await fills_hub.took() == [False]
    assert fast == slow and fast[1] == data[5:100]
    assert (proxy.faults.heads[key], proxy.faults.gets[key]) == (heads + 2, gets + 2)
    assert proxy.faults.pins[-2][0] == etag  # the fast path's GET, pinned to the HEAD's


async def test_a_store_failing_before_the_first_byte_leaves_the_fill_to_aiohttp(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    data = bucket.contents[BIG]
    etag = await etag_of(fills_hub, BIG)
    proxy.faults.cut_after = 0  # the store answers the GET, then resets before its body
    reader, writer = await connect(fills_hub.url)
    writer.write(fill(BIG, etag, CHUNK, 3 * CHUNK))
    answer = await read_answer(reader)
    writer.close()
    # Nothing had gone: aiohttp's path asked the store again and answered whole.
    assert (answer.status, answer.complete, answer.body) == (206, True, data[CHUNK:3 * CHUNK])
    assert await fills_hub.took() == [False]
    assert proxy.faults.gets[f"/{BUCKET}/{PREFIX}/{BIG}"] == 2


@pytest.mark.parametrize("cut", [1, CHUNK * 2 + 100])
async def test_a_body_the_store_cuts_after_the_head_cuts_the_answer_never_pads_it(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy, cut: int
) -> None:
    bucket.write(LARGE, bytes(range(256)) * (4 << 12))  # 4 MiB
    data = bucket.contents[LARGE]
    etag = await etag_of(fills_hub, LARGE)
    proxy.faults.cut_after = cut
    reader, writer = await connect(fills_hub.url)
    writer.write(fill(LARGE, etag, 1000, 1000 + (3 << 20)))
    answer = await read_answer(reader)
    assert answer.status == 206 and not answer.complete, answer.describe()
    assert len(answer.body) <= cut and answer.body == data[1000:1000 + len(answer.body)]
    assert await reader.read() == b""  # the connection is cut, not left to carry on
    writer.close()
    assert await fills_hub.took() == [True]


async def test_fills_on_one_connection_reuse_one_store_connection(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    bucket.write(LARGE, bytes(range(256)) * (12 << 12))
    data = bucket.contents[LARGE]
    etag = await etag_of(fills_hub, LARGE)
    proxy.faults.peers.clear()
    reader, writer = await connect(fills_hub.url)
    for i in range(3):  # spliced off the store's socket, each to its last byte
        start = i * (2 << 20)
        writer.write(fill(LARGE, etag, start, start + (2 << 20)))
        answer = await read_answer(reader)
        assert answer.complete and answer.body == data[start:start + (2 << 20)]
    writer.close()
    assert await fills_hub.took() == [True, True, True]
    assert len(proxy.faults.peers) == 1


async def test_a_fill_on_a_store_connection_the_store_closed_goes_again_on_a_new_one(
    fills_hub: NotedHub, bucket: Bucket, proxy: StoreProxy
) -> None:
    data = bucket.contents[BIG]
    etag = await etag_of(fills_hub, BIG)
    key = f"/{BUCKET}/{PREFIX}/{BIG}"
    first = await head_and_body(fills_hub.url, fill(BIG, etag, 0, CHUNK))
    assert first[1] == data[:CHUNK]
    proxy.faults.peers.clear()
    await proxy.close_connections()  # the hub's kept store connection is closed under it
    gets = proxy.faults.gets[key]
    again = await head_and_body(fills_hub.url, fill(BIG, etag, CHUNK, 2 * CHUNK))
    assert again[1] == data[CHUNK:2 * CHUNK]
    assert await fills_hub.took() == [True, True]  # on the fast path both times
    assert proxy.faults.gets[key] == gets + 1 and len(proxy.faults.peers) == 1


def test_only_a_plain_http_store_without_a_proxy_gets_the_hubs_own_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert PlainGets.for_endpoint("http://127.0.0.1:9000", None, 5) is not None
    assert PlainGets.for_endpoint("https://s3.example.com", None, 5) is None  # TLS: botocore's
    assert PlainGets.for_endpoint("http://127.0.0.1:9000", {"http": "http://p:3128"}, 5) is None
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert PlainGets.for_endpoint("http://127.0.0.1:9000", None, 5) is None


async def test_a_spokes_cold_reads_through_the_hub_are_fast_path_fills(
    fills_hub: NotedHub, bucket: Bucket, tmp_path: Path
) -> None:
    spoke = await start_spoke(SpokeConfig(
        hub_url=fills_hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
    ))
    try:
        async with aiohttp.ClientSession() as http:
            for path in (BIG, "ds/partial.bin"):
                status, _, body = await fetch(http, f"{spoke.url}/objects/{path}")
                assert (status, body) == (200, bucket.contents[path]), path
    finally:
        await spoke.stop()
    taken = await fills_hub.took()
    # The spoke's manifests and the like go aiohttp's way, on its session's connections;
    # its chunk fills, on connections of their own, every one the fast path's.
    chunks = -(-len(bucket.contents[BIG]) // CHUNK) + -(-len(bucket.contents["ds/partial.bin"])
                                                         // CHUNK)
    assert taken.count(True) >= chunks, taken  # (a first chunk may be asked twice: early)
