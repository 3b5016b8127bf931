"""Hostile object paths over raw HTTP, against the hub and the spoke.

Requests go out on a raw socket so that no client library normalises ``..`` or
re-encodes the target. Whatever the path, the answer is a 400 or 404
problem+json, never a 200 with bytes from outside the hub's root and never a 500.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
import yarl

from tests.conftest import FILES, SpokeFactory
from tests.support.raw_http import RawResponse, raw_request
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]

SECRET = b"TOP-SECRET-OUTSIDE-THE-ROOT\n"

HOSTILE_OBJECT_TARGETS = [
    "/objects/..",
    "/objects/../etc/passwd",
    "/objects/ds/../../etc/passwd",
    "/objects/ds/../small.bin",
    "/objects/./ds/small.bin",
    "/objects/ds/.",
    "/objects/%2e%2e/etc/passwd",
    "/objects/ds/%2e%2e/%2e%2e/etc/passwd",
    "/objects/%2E%2E/%2e%2e/etc/passwd",
    "/objects/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/objects/.%2e/etc/passwd",
    "/objects/%252e%252e/%252e%252e/etc/passwd",
    "/objects/ds/%252e%252e/small.bin",
    "/objects/%25252e%25252e/etc/passwd",
    "/objects/ds\\..\\..\\etc\\passwd",
    "/objects/ds%5csmall.bin",
    "/objects/..%5c..%5cetc%5cpasswd",
    "/objects/ds%255csmall.bin",
    "/objects/ds/small.bin%00",
    "/objects/ds/small.bin%00.txt",
    "/objects/ds/%00",
    "/objects/ds/small%01.bin",
    "/objects/ds//small.bin",
    "/objects/ds/small.bin/",
    "/objects//etc/passwd",
    "/objects/%2fetc/passwd",
    "/objects/%252fetc%252fpasswd",
    "/objects/ds/%c0%ae%c0%ae/small.bin",
    "/objects/ds/%ff.bin",
    "/objects/" + "a/" * 600 + "b.bin",
    "/objects/ds/" + "x" * 300 + ".bin",
]

MISSING_OBJECT_TARGETS = [
    "/objects/ds/missing.bin",
    "/objects/nowhere/missing.bin",
    "/objects/ds",  # a directory is not an object
    "/objects/ds/small.bin/x",  # nor is anything "under" a file
    "/objects/DS/small.bin",
]


def assert_refused(response: RawResponse, method: str = "GET") -> None:
    """400 or 404, as problem+json, and not one byte of anything outside the root."""
    assert response.status in (400, 404), response
    assert response.headers["content-type"].split(";")[0] == "application/problem+json"
    assert SECRET not in response.body
    assert b"root:" not in response.body
    if method == "HEAD":
        assert response.body == b""
        return
    problem = json.loads(response.body)
    assert problem["status"] == response.status
    assert isinstance(problem["title"], str) and problem["title"]
    assert isinstance(problem["detail"], str) and problem["detail"]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to (not inside) the hub's root, holding a secret file."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.bin").write_bytes(SECRET)
    return directory


async def test_raw_client_reaches_real_objects(
    server: RunningServer, dataset: Dataset
) -> None:
    """The raw-socket client itself works: a plain path gives the object's bytes."""
    response = await raw_request(server.url, "/objects/ds/small.bin")
    assert response.status == 200
    assert response.body == dataset[1]["ds/small.bin"]
    encoded = await raw_request(server.url, "/objects/ds/sm%61ll.bin")
    assert encoded.status == 200
    assert encoded.body == dataset[1]["ds/small.bin"]


async def test_hostile_object_paths_are_refused(server: RunningServer) -> None:
    for target in HOSTILE_OBJECT_TARGETS:
        for method in ("GET", "HEAD"):
            response = await raw_request(server.url, target, method=method)
            try:
                assert_refused(response, method)
            except AssertionError as exc:
                raise AssertionError(f"{method} {target}: {exc}") from None
    # Still serving, and serving the right bytes.
    assert (await raw_request(server.url, "/objects/ds/one-byte.bin")).status == 200


async def test_hostile_paths_with_the_encoded_url_client(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for target in ("/objects/%2E%2E/%2e%2e/etc/passwd", "/objects/ds/%252e%252e/small.bin",
                   "/objects/ds/a%00.bin", "/objects//etc/passwd"):
        url = yarl.URL(server.url + target, encoded=True)
        async with http.get(url) as resp:
            body = await resp.read()
            assert resp.status in (400, 404), target
            assert resp.content_type == "application/problem+json"
            assert json.loads(body)["status"] == resp.status


@pytest.mark.parametrize("target", MISSING_OBJECT_TARGETS)
async def test_missing_objects_are_404(server: RunningServer, target: str) -> None:
    response = await raw_request(server.url, target)
    assert response.status == 404
    assert_refused(response)


@pytest.mark.parametrize(
    "target", ["/list/..", "/list/../", "/list/%2e%2e/", "/list/ds//", "/list//etc/"]
)
async def test_hostile_list_prefixes_are_refused(server: RunningServer, target: str) -> None:
    assert_refused(await raw_request(server.url, target))


@pytest.mark.parametrize(
    "target",
    ["/manifest/../etc/passwd", "/manifest/%2e%2e/x", "/manifest//etc/passwd",
     "/manifest/ds/a%00", "/manifest/ds/missing.bin"],
)
async def test_hostile_manifest_paths_are_refused(hub: RunningServer, target: str) -> None:
    assert_refused(await raw_request(hub.url, target))


SPOKE_ESCAPE_BUG = (
    "BUG: spoke/upstream/hub.py _expect maps the hub's 400 (bad path, e.g. a symlink "
    "escaping the root) to BadGateway, so the spoke answers 502 instead of 400/404"
)
BOTH_WITH_SPOKE_BUG = [
    "hub",
    "spoke",
]


async def pick(which: str, hub: RunningServer, make_spoke: SpokeFactory) -> RunningServer:
    return hub if which == "hub" else await make_spoke()


@pytest.mark.parametrize("which", BOTH_WITH_SPOKE_BUG)
async def test_symlink_to_a_file_outside_the_root_is_refused(
    which: str, hub: RunningServer, make_spoke: SpokeFactory, dataset: Dataset, outside: Path
) -> None:
    root = dataset[0]
    (root / "ds" / "escape.bin").symlink_to(outside / "secret.bin")
    (root / "ds" / "relative-escape.bin").symlink_to(os.path.join("..", "..", "outside",
                                                                  "secret.bin"))
    assert (root / "ds" / "relative-escape.bin").read_bytes() == SECRET
    server = await pick(which, hub, make_spoke)
    for target in ("/objects/ds/escape.bin", "/objects/ds/relative-escape.bin"):
        for method in ("GET", "HEAD"):
            assert_refused(await raw_request(server.url, target, method=method), method)


@pytest.mark.parametrize("which", BOTH_WITH_SPOKE_BUG)
async def test_symlinked_directory_outside_the_root_is_refused(
    which: str, hub: RunningServer, make_spoke: SpokeFactory, dataset: Dataset, outside: Path
) -> None:
    (dataset[0] / "ds" / "elsewhere").symlink_to(outside, target_is_directory=True)
    server = await pick(which, hub, make_spoke)
    assert_refused(await raw_request(server.url, "/objects/ds/elsewhere/secret.bin"))


async def test_escaping_symlinks_are_refused_by_manifest_and_not_listed(
    server: RunningServer, hub: RunningServer, dataset: Dataset, outside: Path
) -> None:
    root = dataset[0]
    (root / "ds" / "escape.bin").symlink_to(outside / "secret.bin")
    (root / "ds" / "elsewhere").symlink_to(outside, target_is_directory=True)
    (root / "ds" / "dangling.bin").symlink_to(root / "ds" / "no-such-file")
    assert_refused(await raw_request(hub.url, "/manifest/ds/escape.bin"))
    assert_refused(await raw_request(hub.url, "/manifest/ds/elsewhere/secret.bin"))
    # The dangling link is simply not an object.
    dangling = await raw_request(server.url, "/objects/ds/dangling.bin")
    assert dangling.status == 404
    assert_refused(dangling)
    through_link = await raw_request(server.url, "/list/ds/elsewhere/")
    assert through_link.status in (200, 400, 404)
    assert SECRET not in through_link.body and b"secret.bin" not in through_link.body
    if through_link.status == 200:
        assert json.loads(through_link.body)["objects"] == []
    listing = await raw_request(server.url, "/list/ds/")
    assert listing.status == 200
    assert [e["path"] for e in json.loads(listing.body)["objects"]] == sorted(
        p for p in FILES if p.startswith("ds/")
    )
    assert SECRET not in listing.body


async def test_server_keeps_serving_after_hostile_requests(
    server: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    results = await asyncio.gather(
        *(raw_request(server.url, t) for t in HOSTILE_OBJECT_TARGETS[:12])
    )
    assert all(r.status in (400, 404) for r in results)
    async with http.get(f"{server.url}/objects/ds/exact.bin") as resp:
        assert resp.status == 200
        assert await resp.read() == dataset[1]["ds/exact.bin"]
    async with http.get(f"{server.url}/healthz") as resp:
        assert resp.status == 200


LEGAL_ODD_NAMES = [
    "ds/a b.bin", "ds/ü.bin", "ds/100%.bin", "ds/%41.bin", "ds/%25.bin", "ds/semi;colon.bin",
    "ds/q?.bin", "ds/hash#.bin", "ds/plus+.bin", "ds/...", "ds/.hidden", "ds/%zz",
]


async def test_legal_names_needing_percent_encoding_are_served(
    server: RunningServer, dataset: Dataset
) -> None:
    """Names with spaces, '%', '?', '#' or non-ASCII survive the spoke's trip to the hub."""
    root = dataset[0]
    contents = {name: name.encode() * 3 for name in LEGAL_ODD_NAMES}
    for name, data in contents.items():
        (root / name).write_bytes(data)
    for name, data in contents.items():
        response = await raw_request(server.url, "/objects/" + quote(name, safe="/"))
        assert (response.status, response.body) == (200, data), name
        assert response.headers["content-length"] == str(len(data))


async def test_fifo_in_the_root_is_404_not_a_hang(
    hub: RunningServer, dataset: Dataset, http: aiohttp.ClientSession
) -> None:
    fifo = dataset[0] / "ds" / "pipe.bin"
    os.mkfifo(fifo)
    try:
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with http.get(f"{hub.url}/objects/ds/pipe.bin", timeout=timeout) as resp:
            assert resp.status == 404
            assert resp.content_type == "application/problem+json"
    finally:
        _release_fifo_readers(fifo)


def _release_fifo_readers(fifo: Path) -> None:
    """Unblock any thread stuck opening ``fifo`` for reading, so the loop can close."""
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader is waiting any more
            return
        os.close(fd)
        time.sleep(0.05)
