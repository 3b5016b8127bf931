"""The hub's fast path (hub.fast) over raw sockets: it answers as aiohttp's handler does,
line for line, and keeps every rule (paths, tokens, conditionals, versions, limits,
request ids, the access log, the counters); what it declines, aiohttp answers."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import pytest

from hub.app import make_app
from hub.config import HubConfig
from protocol.auth import issue
from protocol.conditional import http_date
from service.fast import FAST
from service.runner import start_site
from tests.conftest import CHUNK
from tests.support.fast_notes import FastNotes
from tests.support.raw_http import connect, read_answer, read_response, request
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]
BIG = "ds/big.bin"  # 2.5 MiB: its large ranges go by sendfile
SECRET = b"5e" * 32  # as the secret file holds it: hex text


@dataclass(kw_only=True)
class FastHub(FastNotes):
    """A real hub whose fast handler notes whether it answered each request."""

    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url


async def start_fast_hub(config: HubConfig) -> FastHub:
    app = make_app(config)  # the filesystem backend: the fast path is on
    hub = FastHub(server=RunningServer("", None, app))  # type: ignore[arg-type]
    # A client that hangs up once it has its whole answer (Connection: close) may do so
    # before the answer's coroutine resumes: the answer still ends there, counted and logged.
    app[FAST] = hub.noting(app[FAST])
    runner, port = await start_site(app, "127.0.0.1", 0)
    hub.server = RunningServer(f"http://127.0.0.1:{port}", runner, app)
    return hub


HubFactory = Callable[..., Awaitable[FastHub]]


@pytest.fixture
async def make_fast_hub(dataset: Dataset) -> AsyncIterator[HubFactory]:
    started: list[FastHub] = []

    async def make(**overrides: object) -> FastHub:
        config = replace(HubConfig(root=str(dataset[0]), chunk_size=CHUNK), **overrides)  # type: ignore[arg-type]
        hub = await start_fast_hub(config)
        started.append(hub)
        return hub

    yield make
    for hub in reversed(started):
        await hub.server.stop()


@pytest.fixture
async def fast_hub(make_fast_hub: HubFactory) -> FastHub:
    return await make_fast_hub()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def get(path: str, *fields: str, method: str = "GET") -> bytes:
    return request(f"/objects/{path}", *fields, method=method)


async def raw_head(url: str, data: bytes, method: str = "GET") -> tuple[list[str], bytes]:
    """One answer on a new connection: its head's lines in order (Date and request id
    left out: they differ by design) and its body."""
    reader, writer = await connect(url)
    writer.write(data)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    lines = [ln for ln in head.decode("latin-1").split("\r\n") if ln]
    length = next((int(ln.split(": ")[1]) for ln in lines
                   if ln.lower().startswith("content-length: ")), 0)
    body = b"" if method == "HEAD" else await asyncio.wait_for(reader.readexactly(length), 15)
    writer.close()
    return [ln for ln in lines if not ln.startswith(("Date: ", "X-Request-Id: "))], body


async def etag_of(http: aiohttp.ClientSession, hub: FastHub, path: str) -> str:
    async with http.head(f"{hub.url}/objects/{path}") as resp:
        etag = resp.headers["ETag"]
    assert await hub.took() == [True]
    return etag


@pytest.mark.parametrize("close", [False, True])
async def test_the_fast_path_answers_as_the_aiohttp_handler_does(
    fast_hub: FastHub, dataset: Dataset, http: aiohttp.ClientSession, close: bool
) -> None:
    # A field outside the fast path's set (here an unknown one) sends the same request
    # to aiohttp's handler: both answers must match line for line and byte for byte.
    data = dataset[1][BIG]
    size = len(data)
    etag = await etag_of(http, fast_hub, BIG)
    rng = random.Random(3)
    ranges = [(0, 0), (0, CHUNK - 1), (size - 1, size - 1), (size - 10, size + 500),
              (5, size - 3), (300_000, 900_000)]
    ranges += [(a, a + rng.randrange(1, 3 * CHUNK)) for a in rng.sample(range(size), 6)]
    cases: list[tuple[str, list[str], str, bytes | None]] = [
        (BIG, [f"Range: bytes={a}-{b}"], "GET", data[a:b + 1]) for a, b in ranges
    ]
    cases += [
        (BIG, ["Range: bytes=-700"], "GET", data[-700:]),
        (BIG, ["Range: bytes=1000-"], "GET", data[1000:]),
        (BIG, [], "GET", data),
        ("ds/small.bin", [], "GET", dataset[1]["ds/small.bin"]),
        ("ds/empty.bin", [], "GET", b""),
        ("other/notes.csv", ["Range: bytes=10-19"], "GET", dataset[1]["other/notes.csv"][10:20]),
        (BIG, [], "HEAD", b""),
        (BIG, ["Range: bytes=0-9"], "HEAD", b""),
        (BIG, ["Range: bytes=0-9", f"If-Match: {etag}"], "GET", data[:10]),
        (BIG, ["Range: bytes=0-9", f"If-Range: {etag}"], "GET", data[:10]),
        (BIG, ["Range: bytes=0-9", 'If-Range: "other"'], "GET", data),
        (BIG, [f"If-None-Match: {etag}"], "GET", b""),  # 304
        (BIG, [f"If-Modified-Since: {http_date(int(time.time()) - 60)}"], "GET", b""),  # 304
        (BIG, ["Range: bytes=0-9", "User-Agent: test", "Accept: */*"], "GET", data[:10]),
    ]
    extra = ["Connection: close"] if close else []
    for path, fields, method, expected in cases:
        fast = await raw_head(fast_hub.url, get(path, *fields, *extra, method=method), method)
        assert await fast_hub.took() == [True], (path, fields, method)
        slow = await raw_head(
            fast_hub.url, get(path, *fields, *extra, "X-Not-Plain: 1", method=method), method)
        assert await fast_hub.took() == [False]
        assert fast == slow, (path, fields, method)
        assert expected is None or fast[1] == expected
        assert ("Connection: close" in fast[0]) is close


async def test_what_the_fast_path_declines_aiohttp_answers_as_before(
    fast_hub: FastHub, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    etag = await etag_of(http, fast_hub, BIG)
    size = len(dataset[1][BIG])
    declined = [
        get(BIG, "Range: bytes=0-9", 'If-Match: "stale"'),  # 412
        get(BIG, f"Range: bytes={size}-{size + 10}"),  # 416
        get(BIG, "Range: bytes=0-9,100-109"),  # multipart: the boundary is checked
        get("ds/missing.bin"),  # 404
        get("ds/../x"),  # 400
        get("ds%2Fbig.bin"),  # percent-encoded: aiohttp decodes it
        get(BIG, "X-Other: 1"),  # a field that might change the answer
        request("/manifest/ds/big.bin"),
        request("/healthz"),
    ]
    statuses = [412, 416, 206, 404, 400, 200, 200, 200, 200]
    for data, status in zip(declined, statuses, strict=True):
        reader, writer = await connect(fast_hub.url)
        writer.write(data)
        answer = await read_answer(reader)
        writer.close()
        assert answer.status == status, (data, answer.describe())
        # Declined, or handed to aiohttp before it was offered (a head outside the reader's subset).
        assert await fast_hub.took() in ([False], []), data
    assert etag


async def test_pipelined_reads_mixed_with_declined_ones_come_in_order(
    fast_hub: FastHub, dataset: Dataset
) -> None:
    data = dataset[1][BIG]
    reader, writer = await connect(fast_hub.url)
    ranges = [(a, a + 1000 + a % 7) for a in range(0, 600_000, 40_000)]
    ranges.append((100, 700_000))  # a large one, by sendfile
    requests = [get(BIG, f"Range: bytes={a}-{b - 1}") for a, b in ranges]
    writer.write(b"".join(requests[:5]) + request("/healthz") + b"".join(requests[5:]))
    answers = [await read_response(reader) for _ in range(len(requests) + 1)]
    writer.close()
    bodies = [body for status, _, body in answers if status == 206]
    assert bodies == [data[a:b] for a, b in ranges]
    assert answers[5][0] == 200 and b'"status"' in answers[5][2]
    # aiohttp has the connection from /healthz on: the rest are its answers.
    assert await fast_hub.took() == [True] * 5 + [False]


async def test_a_large_range_reaches_a_slow_reader_whole(
    fast_hub: FastHub, dataset: Dataset
) -> None:
    root, _ = dataset
    data = random.Random(5).randbytes(24 << 20)  # more than the socket buffers hold
    (root / "ds" / "large.bin").write_bytes(data)
    with (root / "ds" / "large.bin").open("rb") as f:
        assert f.read() == data  # in the page cache now
    start, stop = 3, len(data) - 5
    reader, writer = await connect(fast_hub.url)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    writer.write(get("ds/large.bin", f"Range: bytes={start}-{stop - 1}")
                 + get("ds/large.bin", "Range: bytes=0-0"))
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 206 ")
    received = bytearray()
    while len(received) < stop - start:
        want = min(256 << 10, stop - start - len(received))
        received += await asyncio.wait_for(reader.readexactly(want), 15)
        await asyncio.sleep(0.001)
    assert bytes(received) == data[start:stop]
    assert (await read_response(reader))[::2] == (206, data[0:1])
    writer.close()
    assert await fast_hub.took() == [True, True]


async def test_links_below_the_root_are_not_followed(
    fast_hub: FastHub, dataset: Dataset
) -> None:
    root, contents = dataset
    (root / "ds" / "link.bin").symlink_to(root / "other" / "notes.csv")
    (root / "linked").symlink_to(root / "other", target_is_directory=True)
    for path in ("ds/link.bin", "linked/notes.csv"):
        reader, writer = await connect(fast_hub.url)
        writer.write(get(path, "Range: bytes=0-9"))
        answer = await read_answer(reader)
        writer.close()
        assert answer.status == 404, answer.describe()
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert contents["other/notes.csv"][:10] not in answer.body
    assert await fast_hub.took() == [False, False]


@pytest.mark.parametrize("swap", ["directory", "file"])
async def test_a_file_read_before_is_not_served_once_a_link_takes_its_place(
    fast_hub: FastHub, dataset: Dataset, swap: str
) -> None:
    # The fast path keeps files open between reads; a link put where a read file (or
    # one of its directories) was must still be refused, as the backend refuses links.
    root, contents = dataset
    data = contents["ds/small.bin"]
    first = await raw_head(fast_hub.url, get("ds/small.bin", "Range: bytes=0-99"))
    assert first[1] == data[:100]
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "small.bin").write_bytes(b"x" * 1000)
    if swap == "directory":
        os.rename(root / "ds", root / "ds-moved")
        (root / "ds").symlink_to(root / "elsewhere", target_is_directory=True)
    else:
        os.rename(root / "ds" / "small.bin", root / "ds" / "small-moved.bin")
        (root / "ds" / "small.bin").symlink_to(root / "elsewhere" / "small.bin")
    reader, writer = await connect(fast_hub.url)
    writer.write(get("ds/small.bin", "Range: bytes=0-99"))
    answer = await read_answer(reader)
    writer.close()
    assert answer.status == 404, answer.describe()
    assert await fast_hub.took() == [True, False]


async def test_tokens_are_checked_on_the_fast_path(
    make_fast_hub: HubFactory, dataset: Dataset, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET + b"\n")
    hub = await make_fast_hub(auth_secret_file=str(secret))
    now = time.time()
    good = issue(SECRET, "t1", ["ds/"], ttl_s=600, now=now, admin=False)
    expired = issue(SECRET, "t1", ["ds/"], ttl_s=60, now=now - 3600, admin=False)
    other = issue(SECRET, "t2", ["other/"], ttl_s=600, now=now, admin=False)
    data = dataset[1][BIG]
    cases = [
        ([f"Authorization: Bearer {good}"], 206, True),
        ([f"Authorization: Bearer {good}", "If-Range: \"x\""], 200, True),
        ([], 401, False),
        ([f"Authorization: Bearer {expired}"], 401, False),
        ([f"Authorization: Bearer {good}x"], 401, False),
        ([f"Authorization: Bearer {other}"], 403, False),
    ]
    for fields, status, fast in cases:
        reader, writer = await connect(hub.url)
        writer.write(get(BIG, "Range: bytes=0-99", *fields))
        answer = await read_answer(reader)
        writer.close()
        assert answer.status == status, (fields, answer.describe())
        if status in (200, 206):
            assert answer.body == (data[:100] if status == 206 else data)
        else:
            assert data[:100] not in answer.body
        assert await hub.took() == ([True] if fast else [False])
    async with http.get(f"{hub.url}/metrics") as resp:
        metrics = await resp.text()
    assert "hub_auth_unauthorized_total 3.0" in metrics
    assert "hub_auth_forbidden_total 1.0" in metrics


async def test_a_new_version_is_served_at_once_with_its_own_etag(
    fast_hub: FastHub, dataset: Dataset
) -> None:
    root, _ = dataset
    path = root / "ds" / "small.bin"
    first = await raw_head(fast_hub.url, get("ds/small.bin", "Range: bytes=0-99"))
    new = random.Random(9).randbytes(1000)
    (root / "ds" / "new.tmp").write_bytes(new)
    os.replace(root / "ds" / "new.tmp", path)  # same size, another file
    day_ago = time.time() - 86400
    os.utime(path, (day_ago, day_ago))
    second = await raw_head(fast_hub.url, get("ds/small.bin", "Range: bytes=0-99"))
    assert second[1] == new[:100] != first[1]
    etags = [next(ln for ln in h if ln.startswith("ETag: ")) for h, _ in (first, second)]
    assert etags[0] != etags[1]
    reader, writer = await connect(fast_hub.url)
    old_etag = etags[0].removeprefix("ETag: ")
    writer.write(get("ds/small.bin", "Range: bytes=0-99", f"If-Match: {old_etag}"))
    assert (await read_answer(reader)).status == 412  # the old version is gone
    writer.close()
    assert await fast_hub.took() == [True, True, False]


def drop_from_page_cache(path: Path) -> bool:
    """Drop a file's pages; true once a read of its start would wait for the disk.

    The kernel drops only clean pages no one holds: one still in a CPU's add-to-LRU
    batch, or locked by a read-ahead or a writeback, stays. So ask again until it went.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(100):
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(1)], 5, os.RWF_NOWAIT)
            except BlockingIOError:
                return True  # not cached: reading it would wait
            time.sleep(0.05)
        return False
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [100, 700_000])
async def test_bytes_not_in_the_page_cache_are_read_in_a_thread_on_the_fast_path(
    fast_hub: FastHub, dataset: Dataset, size: int
) -> None:
    root, contents = dataset
    path = root / BIG
    assert await asyncio.to_thread(drop_from_page_cache, path)
    reader, writer = await connect(fast_hub.url)
    # The cold read, then a cached one on the same connection: it stays on the fast path.
    writer.write(get(BIG, f"Range: bytes=5-{4 + size}") + get(BIG, "Range: bytes=5-14"))
    assert (await read_response(reader))[::2] == (206, contents[BIG][5:5 + size])
    assert (await read_response(reader))[::2] == (206, contents[BIG][5:15])
    writer.close()
    assert await fast_hub.took() == [True, True]


async def test_a_client_at_its_in_flight_limit_gets_429_from_aiohttp(
    make_fast_hub: HubFactory, dataset: Dataset
) -> None:
    root, _ = dataset
    data = random.Random(6).randbytes(24 << 20)
    (root / "ds" / "large.bin").write_bytes(data)
    with (root / "ds" / "large.bin").open("rb") as f:
        assert f.read() == data  # cached: the fast path sends it
    hub = await make_fast_hub(max_inflight_per_client=1)
    slow_reader, slow_writer = await connect(hub.url)
    slow_writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    slow_writer.write(get("ds/large.bin"))  # held while the reader does not read
    await asyncio.wait_for(slow_reader.readuntil(b"\r\n\r\n"), 15)
    reader, writer = await connect(hub.url)
    writer.write(get(BIG, "Range: bytes=0-9"))
    status, headers, _ = await read_response(reader)
    assert (status, headers["retry-after"]) == (429, "1")
    writer.close()
    assert await asyncio.wait_for(slow_reader.readexactly(len(data)), 30) == data
    slow_writer.close()
    assert await hub.took() == [False, True]  # the 429 was aiohttp's; the large read fast


async def test_request_ids_access_log_and_counters_are_kept(
    fast_hub: FastHub, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async def counters() -> tuple[float, float]:
        async with http.get(f"{fast_hub.url}/metrics") as resp:
            text = await resp.text()
        found = [re.search(rf"^{name} (\S+)$", text, re.M)
                 for name in ("hub_requests_total", "hub_bytes_sent_total")]
        assert found[0] is not None and found[1] is not None
        return float(found[0][1]), float(found[1][1])

    before = await counters()
    await fast_hub.took()  # the /metrics request's (declined)
    reader, writer = await connect(fast_hub.url)
    with caplog.at_level(logging.INFO, logger="hubspoke.access"):
        writer.write(get(BIG, "Range: bytes=0-9", "X-Request-Id: loader-7.a")
                     + get(BIG, "Range: bytes=0-299999"))
        _, mine, _ = await read_response(reader)
        _, fresh, _ = await read_response(reader)
    writer.close()
    # Both answered and logged: the second's bytes go from a thread, and reach the
    # client before its coroutine resumes to count them.
    assert await fast_hub.took() == [True, True]
    after = await counters()
    assert mine["x-request-id"] == "loader-7.a"
    assert re.fullmatch(r"[0-9a-f]{16}", fresh["x-request-id"])
    ours = ("loader-7.a", fresh["x-request-id"])
    lines = [r for r in caplog.records
             if r.name == "hubspoke.access" and r.request_id in ours]  # type: ignore[attr-defined]
    assert [(r.request_id, r.status, r.bytes) for r in lines] == [  # type: ignore[attr-defined]
        ("loader-7.a", 206, 10), (fresh["x-request-id"], 206, 300_000)]
    # Two reads, and the first /metrics request itself (counted as it came in).
    assert (after[0] - before[0], after[1] - before[1]) == (3, 300_010)
