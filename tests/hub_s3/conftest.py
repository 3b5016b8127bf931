"""A real ``rclone serve s3`` store over a directory (its folders are buckets), a counting
and fault-injecting proxy in front of it, and real hubs over ``s3://`` roots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trustme

from hub.app import make_app as make_hub_app
from hub.config import HubConfig
from hub.roots import open_backend
from hub.store.s3 import make_client
from loadtest.s3_stores import S3Store, start_rclone_s3
from service.fast import FAST
from service.runner import start_site
from tests.hub_s3.store_proxy import StoreProxy
from tests.security.test_tls import issue
from tests.support.fast_notes import FastNotes
from tests.support.servers import RunningServer, start_hub, write_dataset

CHUNK = 64 * 1024
BUCKET = "data"
PREFIX = "team/corpus"
FILES = {
    "ds/empty.bin": 0,
    "ds/one-byte.bin": 1,
    "ds/small.bin": 1000,
    "ds/exact.bin": CHUNK * 4,
    "ds/partial.bin": CHUNK * 5 + 123,
    "ds/big.bin": CHUNK * 40 + 7,
    "other/notes.csv": 3000,
}
# Generous: a loaded machine must not time the store out; tests of slowness set their own.
TIMEOUT_S = 60.0


@dataclass
class Bucket:
    """The bucket's objects under the prefix: seeded as files before the store starts,
    changed through the store's own S3 API once it runs (its listing cache sees those)."""

    store_root: Path
    contents: dict[str, bytes]
    client: Any = None  # a botocore client straight to the store (set by ``store``)

    @property
    def root(self) -> Path:
        return self.store_root / BUCKET / PREFIX

    def write(self, path: str, data: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path}", Body=data)
        self.contents[path] = data

    def delete(self, path: str) -> None:
        self.client.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{path}")
        self.contents.pop(path, None)


@pytest.fixture
def bucket(tmp_path: Path) -> Bucket:
    store_root = tmp_path / "store"
    (store_root / BUCKET / PREFIX).mkdir(parents=True)
    contents = write_dataset(str(store_root / BUCKET / PREFIX), FILES)
    # A key outside the prefix, which the hub must neither list nor serve.
    write_dataset(str(store_root / BUCKET), {"outside/secret.bin": 100})
    # Enough keys for a listing of several store pages.
    many = store_root / BUCKET / PREFIX / "many"
    many.mkdir()
    for i in range(2345):
        (many / f"k{i:05d}").write_bytes(bytes([i % 251]))
    return Bucket(store_root, contents)


@pytest.fixture
def store(bucket: Bucket, tmp_path: Path) -> Iterator[S3Store]:
    running = start_rclone_s3(str(bucket.store_root), log_dir=str(tmp_path))
    bucket.client = make_client(running.url, running.env(), TIMEOUT_S)
    yield running
    running.stop()


@pytest.fixture
def tls_store(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[S3Store]:
    """The bucket served by rclone over HTTPS, with a certificate of a test CA that
    botocore trusts by the standard variable (``AWS_CA_BUNDLE``)."""
    pki = issue(trustme.CA(), tmp_path / "pki", "127.0.0.1")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca_file))
    running = start_rclone_s3(str(bucket.store_root), log_dir=str(tmp_path),
                              tls=(str(pki.cert_file), str(pki.key_file)))
    yield running
    running.stop()


@pytest.fixture
async def proxy(store: S3Store) -> AsyncIterator[StoreProxy]:
    running = await StoreProxy(store.url).start()
    yield running
    await running.stop()


HubFactory = Callable[..., Awaitable[RunningServer]]


@pytest.fixture
async def make_s3_hub(
    store: S3Store, proxy: StoreProxy, tmp_path: Path
) -> AsyncIterator[HubFactory]:
    """Hubs over ``s3://data/team/corpus`` through the proxy, sharing one index dir."""
    started: list[RunningServer] = []

    async def make(endpoint: str | None = None, **overrides: object) -> RunningServer:
        config = HubConfig(
            root=f"s3://{BUCKET}/{PREFIX}", chunk_size=CHUNK, s3_endpoint=endpoint or proxy.url,
            s3_timeout=TIMEOUT_S, index_dir=str(tmp_path / "index"),
        )
        config = replace(config, **overrides)  # type: ignore[arg-type]
        # In a thread: its startup check goes through the proxy, which runs on this loop.
        backend = await asyncio.to_thread(
            open_backend, config.root, config.s3_endpoint, config.s3_timeout, store.env()
        )
        server = await start_hub(config, backend)
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def s3_hub(make_s3_hub: HubFactory) -> RunningServer:
    return await make_s3_hub()


@dataclass(kw_only=True)
class NotedHub(FastNotes):
    """A real hub over the store whose fast handler notes whether it answered each request."""

    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url


@asynccontextmanager
async def noted_store_hub(endpoint: str, store: S3Store, tmp_path: Path
                          ) -> AsyncIterator[NotedHub]:
    """A :class:`NotedHub` over ``s3://data/team/corpus`` at ``endpoint`` (the store, or
    the proxy in front of it)."""
    config = HubConfig(root=f"s3://{BUCKET}/{PREFIX}", chunk_size=CHUNK, s3_endpoint=endpoint,
                       s3_timeout=TIMEOUT_S, index_dir=str(tmp_path / "index"))
    # In a thread: its startup check may go through the proxy, which runs on this loop.
    backend = await asyncio.to_thread(
        open_backend, config.root, config.s3_endpoint, config.s3_timeout, store.env())
    app = make_hub_app(config, backend)
    hub = NotedHub(server=RunningServer("", None, app))  # type: ignore[arg-type]
    app[FAST] = hub.noting(app[FAST])
    runner, port = await start_site(app, "127.0.0.1", 0)
    hub.server = replace(hub.server, url=f"http://127.0.0.1:{port}", runner=runner)
    try:
        yield hub
    finally:
        await hub.server.stop()
