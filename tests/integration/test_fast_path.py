"""The spoke's fast path over raw sockets: pipelining, hand-over to aiohttp mid-connection,
sendfile to a slow reader, split request heads, and what it shares with aiohttp
(request ids, the access log, the in-flight limit, metrics)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import socket
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import CHUNK, SpokeFactory
from tests.support.raw_http import connect, read_response, request
from tests.support.servers import GatedBackend, RunningServer
from tests.support.waits import settled_stats, wait_for_stats

Dataset = tuple[Path, dict[str, bytes]]
BIG = "ds/big.bin"


def get(path: str, *fields: str) -> bytes:
    return request(f"/objects/{path}", *fields)


async def warm(http: aiohttp.ClientSession, spoke: RunningServer, path: str) -> None:
    async with http.get(f"{spoke.url}/objects/{path}") as resp:
        assert resp.status == 200
        await resp.read()


async def test_pipelined_reads_are_answered_in_order_with_the_right_bytes(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    ranges = [(i * 1000 + 17, i * 1000 + 17 + CHUNK + i) for i in range(20)]
    reader, writer = await connect(spoke.url)
    writer.write(b"".join(get(BIG, f"Range: bytes={a}-{b - 1}") for a, b in ranges))
    for a, b in ranges:
        status, headers, body = await read_response(reader)
        assert (status, headers["x-cache"], body) == (206, "HIT", data[a:b])
        assert headers["content-range"] == f"bytes {a}-{b - 1}/{len(data)}"
    writer.close()


async def test_a_request_the_fast_path_declines_hands_the_connection_to_aiohttp(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """A cached read, then a plan (a POST with a body), then reads again, pipelined on
    one connection: all answered, in order."""
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    body = b'{"reads": [["ds/big.bin", 0, 100]]}'
    post = (b"POST /plans HTTP/1.1\r\nHost: spoke\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    reader, writer = await connect(spoke.url)
    writer.write(get(BIG, "Range: bytes=0-9") + post + get(BIG, "Range: bytes=10-19")
                 + get("ds/../x"))
    assert (await read_response(reader))[::2] == (206, data[0:10])
    status, headers, _ = await read_response(reader)
    assert status == 201 and headers["location"].startswith("/plans/")
    assert (await read_response(reader))[::2] == (206, data[10:20])
    status, headers, _ = await read_response(reader)
    assert status == 400 and headers["content-type"].startswith("application/problem+json")
    writer.close()


async def test_a_head_split_over_several_packets_is_read_whole(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    request = get(BIG, "Range: bytes=5-99")
    reader, writer = await connect(spoke.url)
    for i in range(0, len(request), 7):
        writer.write(request[i:i + 7])
        await writer.drain()
        await asyncio.sleep(0.005)
    status, _, body = await read_response(reader)
    assert (status, body) == (206, data[5:100])
    writer.close()


async def test_a_large_cached_range_reaches_a_slow_reader_whole(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    """Large ranges go out with sendfile; a reader slower than the socket buffers makes
    it wait for the socket, and every byte still arrives, in order."""
    root, _ = dataset
    data = random.Random(5).randbytes(24 << 20)  # more than the socket buffers hold
    (root / "ds" / "large.bin").write_bytes(data)
    await warm(http, spoke, "ds/large.bin")
    start, stop = 3, len(data) - 5
    reader, writer = await connect(spoke.url)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    writer.write(get("ds/large.bin", f"Range: bytes={start}-{stop - 1}")
                 + get("ds/large.bin", "Range: bytes=0-0"))
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"206" in head.split(b"\r\n")[0]
    received = bytearray()
    while len(received) < stop - start:
        want = min(256 << 10, stop - start - len(received))
        received += await asyncio.wait_for(reader.readexactly(want), 10)
        await asyncio.sleep(0.001)
    assert bytes(received) == data[start:stop]
    assert (await read_response(reader))[::2] == (206, data[0:1])  # the next one follows
    writer.close()


async def test_request_ids_access_log_and_latency_are_kept_on_the_fast_path(
    spoke: RunningServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    await warm(http, spoke, BIG)
    reader, writer = await connect(spoke.url)
    with caplog.at_level(logging.INFO, logger="hubspoke.access"):
        writer.write(get(BIG, "Range: bytes=0-9", "X-Request-Id: loader-7.a")
                     + get(BIG, "Range: bytes=0-9"))
        _, mine, _ = await read_response(reader)
        _, fresh, _ = await read_response(reader)
    writer.close()
    assert mine["x-request-id"] == "loader-7.a"
    assert re.fullmatch(r"[0-9a-f]{16}", fresh["x-request-id"])
    # The warm-up's own line may land among them (aiohttp logs once its answer is done).
    ours = ("loader-7.a", fresh["x-request-id"])
    lines = [r for r in caplog.records
             if r.name == "hubspoke.access" and r.request_id in ours]  # type: ignore[attr-defined]
    assert [(r.request_id, r.status, r.x_cache, r.bytes) for r in lines] == [  # type: ignore[attr-defined]
        ("loader-7.a", 206, "HIT", 10), (fresh["x-request-id"], 206, "HIT", 10)]
    async with http.get(f"{spoke.url}/metrics") as resp:
        metrics = await resp.text()
    hits = re.search(r'spoke_read_seconds_count\{cache="hit",front="http"\} (\S+)', metrics)
    assert hits is not None and float(hits[1]) >= 2


async def test_connection_close_is_honoured(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    await warm(http, spoke, BIG)
    reader, writer = await connect(spoke.url)
    writer.write(get(BIG, "Range: bytes=0-3", "Connection: close") + get(BIG))
    status, headers, body = await read_response(reader)
    assert (status, headers["connection"], body) == (206, "close", dataset[1][BIG][:4])
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed; the second not answered
    writer.close()


async def test_a_client_at_its_in_flight_limit_gets_429_from_aiohttp(
    make_spoke: SpokeFactory, gated: GatedBackend, http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke(max_inflight_per_client=1)
    gated.gate.clear()
    first = asyncio.ensure_future(http.get(f"{spoke.url}/objects/ds/small.bin"))
    # The first read now waits on the hub, holding this client's only slot.
    assert await asyncio.to_thread(gated.waiting.acquire, True, 10)
    reader, writer = await connect(spoke.url)
    writer.write(get("ds/exact.bin"))
    status, headers, _ = await read_response(reader)
    assert (status, headers["retry-after"]) == (429, "1")
    gated.gate.set()
    resp = await first
    assert resp.status == 200
    resp.release()
    writer.close()


async def read_raw_head(reader: asyncio.StreamReader) -> tuple[list[str], bytes]:
    """The head's lines in order (Date and request id left out: they differ by design)
    and the body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = [ln for ln in head.decode("latin-1").split("\r\n") if ln]
    length = next(int(ln.split(": ")[1]) for ln in lines if ln.startswith("Content-Length: "))
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    kept = [ln for ln in lines if not ln.startswith(("Date: ", "X-Request-Id: "))]
    return kept, body


@pytest.mark.parametrize("close", [False, True])
async def test_a_plain_read_is_answered_as_the_general_path_answers_it(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession, close: bool
) -> None:
    # A field outside the plain set (here an unknown one) sends the same read down the
    # general path: both answers must match line for line and byte for byte.
    data = dataset[1][BIG]
    size = len(data)
    await warm(http, spoke, BIG)
    rng = random.Random(5)
    ranges = [(0, 0), (0, CHUNK - 1), (CHUNK - 1, CHUNK), (size - 1, size - 1),
              (size - 10, size + 500), (3 * CHUNK + 5, 7 * CHUNK + 2)]
    ranges += [(a, a + rng.randrange(1, 3 * CHUNK)) for a in rng.sample(range(size), 12)]
    specs = [(f"bytes={a}-{b}", data[a:b + 1]) for a, b in ranges]
    specs.append(("bytes=-700", data[-700:]))
    # A batch of samples (multipart/byteranges), with overlapping ranges merged.
    specs += [(f"bytes={spec}", b"") for spec in (
        "0-99,5000-5099,200000-200999", f"{size - 5}-,10-20", "100-199,150-299,1000-1000",
    )]
    extra = ["Connection: close"] if close else []
    for spec, expected in specs:
        answers = []
        for fields in (extra, [*extra, "X-Not-Plain: 1"]):
            reader, writer = await connect(spoke.url)
            writer.write(get(BIG, f"Range: {spec}", *fields))
            answers.append(await read_raw_head(reader))
            writer.close()
        (plain_head, plain_body), (general_head, general_body) = answers
        boundary = re.compile(r"[0-9a-f]{24}")  # a new one for every answer, by design
        assert [boundary.sub("B", ln) for ln in plain_head] == \
            [boundary.sub("B", ln) for ln in general_head]
        assert boundary.sub("B", plain_body.decode("latin-1")) == \
            boundary.sub("B", general_body.decode("latin-1"))
        if expected:
            assert plain_body == expected
        assert plain_head[0] == "HTTP/1.1 206 Partial Content"
        assert ("Connection: close" in plain_head) is close


@pytest.mark.parametrize("first, last, chunks", [
    (CHUNK - 10, CHUNK + 9, 2),  # a sample: answered from views within the callback
    (CHUNK - 10, 6 * CHUNK + 9, 7),  # worth a sendfile: the socket takes what it can at once
])
async def test_plain_reads_count_hits_like_the_general_path(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession,
    first: int, last: int, chunks: int,
) -> None:
    await warm(http, spoke, BIG)

    async def counters() -> tuple[int, int]:
        async with http.get(f"{spoke.url}/stats") as resp:
            stats = await resp.json()
        return stats["hits"], stats["bytes_served_hit"]

    deltas = []
    for fields in ([], ["X-Not-Plain: 1"]):
        before = await counters()
        reader, writer = await connect(spoke.url)
        writer.write(get(BIG, f"Range: bytes={first}-{last}", *fields))
        _, body = await read_raw_head(reader)
        assert body == dataset[1][BIG][first:last + 1]
        writer.close()
        # The aiohttp path counts a slice's bytes once its write returns, which may be
        # just after the loader has them: wait for the count, then check it is exact.
        length = last + 1 - first
        await wait_for_stats(
            http, spoke.url,
            lambda s, served=before[1] + length: s["bytes_served_hit"] >= served)
        after = await counters()
        deltas.append((after[0] - before[0], after[1] - before[1]))
    assert deltas == [(chunks, length), (chunks, length)]  # every chunk touched, each byte


def chunk_file(cache_dir: Path, etag: str, index: int) -> Path:
    from spoke.cache.keys import chunk_name, version_id

    name = chunk_name(version_id(BIG, etag, CHUNK), index)
    return cache_dir / "chunks" / name[:2] / name


async def test_a_torn_chunk_file_is_never_sent_and_is_fetched_again(
    make_spoke: SpokeFactory, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    # Plain reads send chunk files with sendfile, after the head: a short file must be
    # caught before (its size is checked when opened, and again at every read of an
    # open one), never padded or served short as if complete.
    spoke = await make_spoke()
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    async with http.head(f"{spoke.url}/objects/{BIG}") as resp:
        etag = resp.headers["ETag"]
    plain = get(BIG, f"Range: bytes={CHUNK + 10}-{CHUNK + 1009}")

    os.truncate(chunk_file(tmp_path / "cache", etag, 1), 500)  # torn before it is opened
    reader, writer = await connect(spoke.url)
    writer.write(plain)
    status, headers, body = await read_response(reader)
    assert (status, headers["x-cache"], body) == (206, "MISS", data[CHUNK + 10:CHUNK + 1010])
    writer.close()
    await settled_stats(http, spoke.url)  # stored again

    reader, writer = await connect(spoke.url)  # fetched again, and now opened for sendfile
    writer.write(plain)
    assert (await read_response(reader))[1]["x-cache"] == "HIT"
    os.truncate(chunk_file(tmp_path / "cache", etag, 1), 500)  # torn while open
    writer.write(plain)
    status, headers, body = await read_response(reader)  # caught before the head
    assert (status, headers["x-cache"], body) == (206, "MISS", data[CHUNK + 10:CHUNK + 1010])
    writer.close()


async def test_a_torn_chunk_file_is_never_sent_with_sendfile_and_is_fetched_again(
    make_spoke: SpokeFactory, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    # A range worth a sendfile: its chunks' sizes are checked before the head goes, so a
    # file cut short while open is fetched again, never sent short after a whole head.
    spoke = await make_spoke()
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    async with http.head(f"{spoke.url}/objects/{BIG}") as resp:
        etag = resp.headers["ETag"]
    first, last = CHUNK + 10, 6 * CHUNK + 9
    large = get(BIG, f"Range: bytes={first}-{last}")
    reader, writer = await connect(spoke.url)
    writer.write(large)
    status, headers, body = await read_response(reader)
    assert (status, headers["x-cache"], body) == (206, "HIT", data[first:last + 1])
    os.truncate(chunk_file(tmp_path / "cache", etag, 3), 500)  # torn while open
    writer.write(large)
    status, headers, body = await read_response(reader)  # caught before the head
    assert (status, headers["x-cache"], body) == (206, "PARTIAL", data[first:last + 1])
    writer.close()


async def test_plain_reads_reach_a_slow_reader_whole_and_in_order(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    # Far more answered bytes than the socket holds: sendfile stops part way, the rest
    # of each answer is queued behind it, and the next answers behind those.
    data = dataset[1][BIG]
    await warm(http, spoke, BIG)
    host, port = spoke.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    rng = random.Random(11)
    ranges = [(a, a + 60_000) for a in (rng.randrange(len(data) - 60_000) for _ in range(150))]
    writer.write(b"".join(get(BIG, f"Range: bytes={a}-{b - 1}") for a, b in ranges))
    await asyncio.sleep(0.5)  # let the server fill the socket and queue the rest
    for a, b in ranges:
        status, headers, body = await read_response(reader)
        assert (status, headers["x-cache"], body) == (206, "HIT", data[a:b])
    writer.close()
