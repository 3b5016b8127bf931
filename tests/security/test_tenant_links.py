"""Symlinks under tenant prefixes: a token scoped to ``b/`` never gets a byte of ``a/``.

The hub follows no link below its root (:class:`hub.backend.FilesystemBackend`), so a
name only ever serves its own file. Checked on the hub with the tenant's token, and
through spokes (in-process, and ``--workers 2`` with reader workers) whose own hub
token covers everything, after a root-scoped reader has asked for every link first,
so that nothing fetched for it can reach tenant B from the cache either.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from hub.config import HubConfig
from loadtest.procs import start_process
from tests.conftest import CHUNK
from tests.security.conftest import Mint, call
from tests.support.servers import RunningServer, start_hub, start_spoke
from tests.support.tenant_links import OWN, SECRET, TO_A, files_holding_a, leaks, plant_tenant_links
from tests.support.waits import wait_warm


@pytest.fixture
def link_root(tmp_path: Path) -> Path:
    root = tmp_path / "tenants"
    plant_tenant_links(root)
    return root


@pytest.fixture
async def link_hub(link_root: Path, secret_file: Path) -> AsyncIterator[RunningServer]:
    config = HubConfig(root=str(link_root), chunk_size=CHUNK, auth_secret_file=str(secret_file))
    server = await start_hub(config)
    yield server
    await server.stop()


@pytest.fixture
def hub_token_file(tmp_path: Path, mint: Mint) -> Path:
    path = tmp_path / "hub-token"
    path.write_text(mint("spoke-1", [""]) + "\n")
    return path


async def assert_no_route_to_a(http: aiohttp.ClientSession, url: str, mint: Mint) -> None:
    """Every way a ``b/`` or ``c/`` token could name A's object: no byte of it, ever."""
    b, c = mint("b", ["b/"]), mint("c", ["c/"])
    for path in TO_A:
        token = c if path.startswith("c/") else b
        for method, headers in (("GET", {}), ("HEAD", {}), ("GET", {"Range": "bytes=0-99"})):
            status, _, body = await call(http, f"{url}/objects/{path}", token, method, headers)
            assert status in (400, 403, 404), (path, method, status)
            assert not leaks(body), (path, method)
    listings = {"b/": ["b/own.bin"], "b": ["b/own.bin"], "b/dir-to-a/": [], "c/": [], "c": []}
    for prefix, expected in listings.items():
        status, _, body = await call(http, f"{url}/list/{prefix}", c if prefix[0] == "c" else b)
        assert not leaks(body) and b"secret" not in body, prefix
        if status == 200:
            assert [e["path"] for e in json.loads(body)["objects"]] == expected, prefix
    status, _, body = await call(http, f"{url}/objects/b/own.bin", b)
    assert status == 200 and body == OWN  # B's own object still reads


async def test_hub_serves_no_tenant_a_bytes_through_b_links(
    link_hub: RunningServer, http: aiohttp.ClientSession, mint: Mint
) -> None:
    await assert_no_route_to_a(http, link_hub.url, mint)
    b, root = mint("b", ["b/"]), mint("ops", [""])
    for path in TO_A:
        token = mint("c", ["c/"]) if path.startswith("c/") else b
        status, _, body = await call(http, f"{link_hub.url}/manifest/{path}", token)
        assert status in (400, 403, 404) and not leaks(body), path
        # Not even the root token gets A's bytes under another name: the spoke fetches
        # with such a token, and would cache them under B's path.
        status, _, body = await call(http, f"{link_hub.url}/objects/{path}", root)
        assert status == 404 and not leaks(body), path
    status, _, body = await call(http, f"{link_hub.url}/objects/a/secret.bin", root)
    assert status == 200 and body == SECRET  # A's object under its own name


async def test_spoke_serves_and_caches_no_tenant_a_bytes_through_b_links(
    link_hub: RunningServer, http: aiohttp.ClientSession, mint: Mint, tmp_path: Path,
    secret_file: Path, hub_token_file: Path,
) -> None:
    from spoke.config import SpokeConfig

    spoke = await start_spoke(SpokeConfig(
        hub_url=link_hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
        auth_secret_file=str(secret_file), hub_token_file=str(hub_token_file),
    ))
    try:
        await read_every_link_as_root(http, spoke.url, mint)
        await assert_no_route_to_a(http, spoke.url, mint)
        await assert_b_admin_cannot_pull_a_in(http, spoke.url, mint)
    finally:
        await spoke.stop()
    assert files_holding_a(tmp_path / "cache") == []


async def test_spoke_reader_workers_serve_no_tenant_a_bytes_through_b_links(
    link_hub: RunningServer, http: aiohttp.ClientSession, mint: Mint, tmp_path: Path,
    secret_file: Path, hub_token_file: Path,
) -> None:
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", link_hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "2", "--auth-secret-file", str(secret_file),
        "--hub-token-file", str(hub_token_file), "--access-log", "off", "--log-level", "warning",
    ])
    try:
        await read_every_link_as_root(http, spoke.url, mint)
        # Many connections, so that reader workers answer some of them, not only the owner.
        await asyncio.gather(*(assert_no_route_to_a(http, spoke.url, mint) for _ in range(4)))
    finally:
        await asyncio.to_thread(spoke.stop)
    assert files_holding_a(tmp_path / "cache") == []


async def read_every_link_as_root(http: aiohttp.ClientSession, url: str, mint: Mint) -> None:
    """A root-scoped reader asks for every link first: what it gets is never A's bytes
    (and none of A's bytes are cached, under any name: A's object itself is not read)."""
    root = mint("ops", [""])
    for path in TO_A:
        status, _, body = await call(http, f"{url}/objects/{path}", root)
        assert status == 404 and not leaks(body), path


async def assert_b_admin_cannot_pull_a_in(
    http: aiohttp.ClientSession, url: str, mint: Mint
) -> None:
    """A ``b/`` admin warming ``b`` or planning B's links caches nothing of A's."""
    admin = mint("b", ["b/"], admin=True)
    status, _, body = await call(http, f"{url}/warm", admin, "POST", json={"prefix": "b/"})
    assert status == 202, body
    doc = await wait_warm(http, url, json.loads(body)["id"], admin)
    assert doc["bytes_total"] == len(OWN), doc
    reads = [[path, 0, 100] for path in TO_A if path.startswith("b/")]
    status, _, body = await call(http, f"{url}/plans", admin, "POST", json={"reads": reads})
    assert status in (400, 403, 404) and not leaks(body), body
