"""spoke.client.clients against a real spoke (and, for retries, small fakes of foreign servers).

The fixtures' servers run on the test's event loop, so every blocking call of the
sync Client runs in a worker thread (``asyncio.to_thread``) to leave that loop free.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import itertools
import os
import pickle
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import aiohttp
import pytest
from aiohttp import web

from service.runner import start_site
from spoke.client.clients import (
    AsyncClient,
    Client,
    HubspokeError,
    InvalidPath,
    ObjectNotFound,
    Unavailable,
    VersionChanged,
)
from tests.conftest import CHUNK, SpokeFactory
from tests.support.clock import FakeClock
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]


@pytest.fixture
async def client(spoke: RunningServer) -> AsyncIterator[Client]:
    c = Client(spoke.url)
    yield c
    await asyncio.to_thread(c.close)


# --- file objects compared with the local file -----------------------------------------


def _replay(remote: IO[bytes], local: IO[bytes], rng: random.Random, ops: int) -> None:
    """Apply the same random seek/read/readinto sequence to both files; they must agree."""
    size = local.seek(0, io.SEEK_END)
    local.seek(0)
    for step in range(ops):
        op = rng.choice(["set", "cur", "end", "read", "read", "readinto", "readall"])
        if op == "set":
            args: tuple[int, int] = (rng.randrange(0, size + 3 * CHUNK), io.SEEK_SET)
        elif op == "cur":
            args = (rng.randrange(-local.tell(), 2 * CHUNK + 1), io.SEEK_CUR)
        elif op == "end":
            args = (rng.randrange(-size, 100), io.SEEK_END)
        if op in ("set", "cur", "end"):
            assert remote.seek(*args) == local.seek(*args), (step, op, args)
        elif op == "read":
            n = rng.choice([0, 1, 7, CHUNK - 1, CHUNK + 1, 3 * CHUNK + 5, rng.randrange(300_000)])
            assert remote.read(n) == local.read(n), (step, op, n, local.tell())
        elif op == "readinto":
            n = rng.randrange(1, 2 * CHUNK)
            a, b = bytearray(n), bytearray(n)
            assert remote.readinto(a) == local.readinto(b), (step, op)
            assert a == b
        elif op == "readall" and rng.random() < 0.2:
            assert remote.read() == local.read(), (step, op)
        assert remote.tell() == local.tell(), (step, op)


@pytest.mark.parametrize("raw", [False, True], ids=["buffered", "raw"])
async def test_file_object_matches_local_file(
    client: Client, dataset: Dataset, raw: bool
) -> None:
    root, _ = dataset

    def check() -> None:
        rng = random.Random(20240611)
        opened = client.open_raw if raw else (lambda p: client.open(p, buffer_size=3 * CHUNK))
        for path in ("ds/big.bin", "ds/partial.bin", "ds/small.bin"):
            with opened(path) as remote, open(root / path, "rb") as local:
                _replay(remote, local, rng, ops=60)

    await asyncio.to_thread(check)


async def test_reads_at_chunk_boundaries_and_eof(client: Client, dataset: Dataset) -> None:
    _, files = dataset
    big = files["ds/big.bin"]

    def check() -> None:
        assert client.read("ds/big.bin", CHUNK - 3, 6) == big[CHUNK - 3 : CHUNK + 3]
        assert client.read("ds/big.bin", 5 * CHUNK - 1, 2 * CHUNK + 2) == big[
            5 * CHUNK - 1 : 7 * CHUNK + 1
        ]
        assert client.read("ds/big.bin", len(big) - 4, 100) == big[-4:]  # short at EOF
        assert client.read("ds/big.bin", len(big), 10) == b""  # at EOF: empty
        assert client.read("ds/big.bin", len(big) + 99, 10) == b""
        assert client.read("ds/big.bin", 40 * CHUNK) == big[40 * CHUNK :]  # length -1
        assert client.read("ds/big.bin") == big
        assert client.read("ds/empty.bin") == b""
        assert client.read("ds/empty.bin", 0, 10) == b""
        with client.open("ds/empty.bin") as f:
            assert f.read() == b"" and f.seek(0, io.SEEK_END) == 0
        with client.open("ds/one-byte.bin") as f:
            assert f.read(5) == files["ds/one-byte.bin"] and f.read(5) == b""

    await asyncio.to_thread(check)


async def test_seek_before_start_and_closed_file_raise(client: Client) -> None:
    def check() -> None:
        f = client.open_raw("ds/small.bin")
        with pytest.raises(ValueError):
            f.seek(-1)
        with pytest.raises(ValueError):
            f.seek(-1001, io.SEEK_END)
        f.close()
        with pytest.raises(ValueError):
            f.read(1)

    await asyncio.to_thread(check)


# --- stat, list, errors -----------------------------------------------------------------


async def test_stat_list_and_read_many(client: Client, dataset: Dataset) -> None:
    _, files = dataset

    def check() -> None:
        stat = client.stat("ds/partial.bin")
        assert stat.path == "ds/partial.bin" and stat.size == CHUNK * 5 + 123
        assert stat.etag.startswith('"') and stat.mtime is not None
        listed = client.list("ds/")
        assert [e.path for e in listed] == sorted(p for p in files if p.startswith("ds/"))
        assert {e.path: e.size for e in listed}["ds/big.bin"] == len(files["ds/big.bin"])
        assert {e.path: e.etag for e in listed}["ds/partial.bin"] == stat.etag
        assert [e.path for e in client.list("")] == sorted(files)
        assert client.list("nothing-here/") == []
        ranges = [(0, 10), (CHUNK - 5, 10), (len(files["ds/big.bin"]) - 3, 10)]
        big = files["ds/big.bin"]
        assert client.read_many("ds/big.bin", ranges) == [big[o : o + n] for o, n in ranges]

    await asyncio.to_thread(check)


async def test_missing_and_invalid_paths(client: Client) -> None:
    def check() -> None:
        with pytest.raises(ObjectNotFound) as missing:
            client.open("ds/missing.bin")
        assert isinstance(missing.value, FileNotFoundError)
        assert missing.value.status == 404 and missing.value.path == "ds/missing.bin"
        with pytest.raises(ObjectNotFound) as missing_read:
            client.read("ds/missing.bin", 0, 10)
        # A GET carries the server's problem+json detail (a HEAD has no body).
        assert missing_read.value.detail and "ds/missing.bin" in missing_read.value.detail
        with pytest.raises(InvalidPath):
            client.read("../etc/passwd")
        with pytest.raises(InvalidPath):
            client.stat("/abs/path")

    await asyncio.to_thread(check)


async def test_async_client_against_spoke(spoke: RunningServer, dataset: Dataset) -> None:
    _, files = dataset
    async with AsyncClient(spoke.url) as client:
        stat = await client.stat("ds/big.bin")
        got = await client.read("ds/big.bin", 3 * CHUNK - 1, CHUNK + 2, etag=stat.etag)
        assert got == files["ds/big.bin"][3 * CHUNK - 1 : 4 * CHUNK + 1]
        with pytest.raises(VersionChanged):
            await client.read("ds/big.bin", 0, 1, etag='"not-the-etag"')


async def test_async_client_leaves_a_given_session_open(
    spoke: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    async with AsyncClient(spoke.url, session=http) as client:
        assert await client.read("ds/small.bin", 10, 20) == files["ds/small.bin"][10:30]
        small = files["ds/small.bin"]
        got = await client.read_many("ds/small.bin", [(999, 5), (0, 1)])
        assert got == [small[999:], small[:1]]
        with pytest.raises(ObjectNotFound):
            await client.read_many("ds/nope.bin", [(0, 1), (5, 1)])
    assert not http.closed


# --- version pinning ----------------------------------------------------------------------


async def test_open_file_never_mixes_versions(
    make_spoke: SpokeFactory, dataset: Dataset
) -> None:
    root, files = dataset
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), meta_ttl_s=0.2)
    old = files["ds/big.bin"]
    new = bytes(b ^ 0x5A for b in old)

    def check() -> None:
        with Client(spoke.url) as client:
            f = client.open("ds/big.bin", buffer_size=CHUNK)
            assert f.read(CHUNK // 2) == old[: CHUNK // 2]
            (root / "ds/big.bin").write_bytes(new)
            clock.advance(0.2 + 0.001)  # past the metadata TTL: the spoke learns the new version
            with pytest.raises(VersionChanged) as changed:
                f.read(2 * CHUNK)
            assert "ds/big.bin" in str(changed.value) and changed.value.status == 412
            f.close()
            with client.open("ds/big.bin") as reopened:  # a new open sees the new bytes
                assert reopened.read() == new

    await asyncio.to_thread(check)


# --- retries against fake foreign servers ------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def fake_server(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner, port = await start_site(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _failing_then_ok(failures: int, status: int, retry_after: str) -> tuple[Handler, list[float]]:
    """A handler answering ``status`` ``failures`` times, then 200; and its call times."""
    calls: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(time.monotonic())
        if len(calls) <= failures:
            return web.Response(status=status, headers={"Retry-After": retry_after})
        return web.Response(body=b"hello", headers={"ETag": '"v1"'})

    return handler, calls


async def test_retry_after_is_honoured() -> None:
    handler, calls = _failing_then_ok(2, 503, "1")
    async with fake_server(handler) as url, AsyncClient(url) as client:
        assert await client.read("x.bin") == b"hello"
    assert len(calls) == 3
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(0.9 <= gap < 2.0 for gap in gaps), gaps


async def test_sync_client_retries_504_then_succeeds() -> None:
    handler, calls = _failing_then_ok(1, 504, "0")
    async with fake_server(handler) as url:
        with Client(url) as client:
            assert await asyncio.to_thread(client.read, "x.bin") == b"hello"
    assert len(calls) == 2


async def test_always_unavailable_raises_after_max_retries() -> None:
    handler, calls = _failing_then_ok(1000, 503, "0")
    async with fake_server(handler) as url, AsyncClient(url, max_retries=3) as client:
        with pytest.raises(Unavailable) as failed:
            await client.read("x.bin")
    assert len(calls) == 4
    assert failed.value.status == 503 and "4 attempts" in str(failed.value)


async def test_retry_after_beyond_the_wait_budget_fails_at_once() -> None:
    handler, calls = _failing_then_ok(1000, 503, "30")
    async with fake_server(handler) as url, AsyncClient(url, max_retry_wait_s=2) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await client.read("x.bin")
    assert len(calls) == 1 and time.monotonic() - started < 1


async def test_connection_refused_is_retried_then_raised() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with AsyncClient(f"http://127.0.0.1:{port}", max_retries=2) as client:
        with pytest.raises(Unavailable) as failed:
            await client.stat("x.bin")
    assert failed.value.status is None


async def test_problem_json_detail_is_carried() -> None:
    async def handler(request: web.Request) -> web.Response:
        body = '{"status": 500, "title": "Broken", "detail": "the disk is on fire"}'
        return web.Response(status=500, text=body, content_type="application/problem+json")

    async with fake_server(handler) as url, AsyncClient(url) as client:
        with pytest.raises(HubspokeError) as failed:
            await client.read("x.bin", 0, 10)
    assert failed.value.status == 500
    assert failed.value.title == "Broken" and failed.value.detail == "the disk is on fire"
    assert "the disk is on fire" in str(failed.value)


# --- processes ----------------------------------------------------------------------------


def _child_reads(client: Client, path: str, digest: str) -> int:
    """Runs in a forked child: the parent's client must work here too."""
    with client.open(path) as f:
        data = f.read()
    return 0 if hashlib.sha256(data).hexdigest() == digest else 3


def _in_forked_child(work: Callable[[], int]) -> int:
    """Exit status of ``work()`` run in a forked child (plain fork, as DataLoader does;
    multiprocessing's own exit path reports 1 when forked from a non-main thread)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = work()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


# Python 3.12+ warns about forking a multi-threaded process; DataLoader does it anyway.
@pytest.mark.filterwarnings("ignore:.*multi-threaded.*:DeprecationWarning")
async def test_client_works_after_fork(client: Client, dataset: Dataset) -> None:
    _, files = dataset
    digest = hashlib.sha256(files["ds/partial.bin"]).hexdigest()

    def check() -> int | None:
        assert client.read("ds/partial.bin", 0, 4) == files["ds/partial.bin"][:4]  # warm
        code = _in_forked_child(lambda: _child_reads(client, "ds/partial.bin", digest))
        assert client.read("ds/small.bin") == files["ds/small.bin"]  # parent unaffected
        return code

    assert await asyncio.to_thread(check) == 0


async def test_client_pickles_for_spawned_workers(client: Client, dataset: Dataset) -> None:
    _, files = dataset

    def check() -> None:
        client.stat("ds/small.bin")
        with pickle.loads(pickle.dumps(client)) as copy:
            assert copy.endpoint == client.endpoint
            assert copy.read("ds/small.bin") == files["ds/small.bin"]

    await asyncio.to_thread(check)
