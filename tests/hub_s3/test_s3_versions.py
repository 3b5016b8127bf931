"""Against the moto server, whose S3 keeps versions and honours ``If-Match``: a read is
pinned to the version its HEAD saw, so an overwrite mid-read never splices versions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hub.config import HubConfig
from hub.roots import open_backend
from hub.store.s3 import make_client
from loadtest.s3_stores import S3Store, start_moto
from tests.hub_s3.store_proxy import StoreProxy
from tests.support.http import assert_problem, fetch
from tests.support.servers import RunningServer, start_hub

CHUNK = 64 * 1024
KEY = "v/shard.bin"
OLD = random.Random(1).randbytes(CHUNK * 6 + 5)
NEW = random.Random(2).randbytes(CHUNK * 6 + 5)


@pytest.fixture
def moto(tmp_path: Path) -> Iterator[S3Store]:
    running = start_moto(log_dir=str(tmp_path))
    yield running
    running.stop()


def seeded(moto: S3Store, bucket: str, versioned: bool) -> Any:
    client = make_client(moto.url, moto.env(), 60)
    client.create_bucket(Bucket=bucket)
    if versioned:
        client.put_bucket_versioning(Bucket=bucket,
                                     VersioningConfiguration={"Status": "Enabled"})
    client.put_object(Bucket=bucket, Key=KEY, Body=OLD)
    return client


@pytest.fixture
async def proxy(moto: S3Store) -> AsyncIterator[StoreProxy]:
    running = await StoreProxy(moto.url).start()
    yield running
    await running.stop()


async def hub_over(moto: S3Store, proxy: StoreProxy, bucket: str, tmp: Path) -> RunningServer:
    config = HubConfig(root=f"s3://{bucket}", chunk_size=CHUNK, s3_endpoint=proxy.url,
                       s3_timeout=60, index_dir=str(tmp / "index"))
    backend = await asyncio.to_thread(open_backend, config.root, config.s3_endpoint,
                                      config.s3_timeout, moto.env())
    return await start_hub(config, backend)


async def test_a_versioned_read_overwritten_midway_is_the_old_version_whole(
    moto: S3Store, proxy: StoreProxy, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    client = seeded(moto, "versioned", versioned=True)
    hub = await hub_over(moto, proxy, "versioned", tmp_path)
    try:
        _, old_head, _ = await fetch(http, f"{hub.url}/objects/{KEY}", method="HEAD")
        proxy.faults.before_get = lambda: asyncio.to_thread(
            client.put_object, Bucket="versioned", Key=KEY, Body=NEW)
        status, headers, body = await fetch(http, f"{hub.url}/objects/{KEY}")
        assert (status, body, headers["ETag"]) == (200, OLD, old_head["ETag"])
        if_match, version = proxy.faults.pins[-1]
        assert if_match == old_head["ETag"] and version is not None
        status, headers, body = await fetch(http, f"{hub.url}/objects/{KEY}")
        assert (status, body) == (200, NEW) and headers["ETag"] != old_head["ETag"]
    finally:
        await hub.stop()


async def test_an_unversioned_overwrite_midway_is_refused_never_mixed(
    moto: S3Store, proxy: StoreProxy, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    client = seeded(moto, "plain", versioned=False)
    hub = await hub_over(moto, proxy, "plain", tmp_path)
    try:
        proxy.faults.before_get = lambda: asyncio.to_thread(
            client.put_object, Bucket="plain", Key=KEY, Body=NEW)
        assert_problem(await fetch(http, f"{hub.url}/manifest/{KEY}"), 409)
        status, _, body = await fetch(http, f"{hub.url}/objects/{KEY}")
        assert (status, body) == (200, NEW)
    finally:
        await hub.stop()
