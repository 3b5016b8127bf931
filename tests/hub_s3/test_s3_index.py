"""The digest index: a restarted hub, or one that ``python -m hub index`` prepared, serves
manifests without reading the bucket again (the proxy counts the store's GETs)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from pathlib import Path

import aiohttp

from loadtest.s3_stores import S3Store
from tests.hub_s3.conftest import BUCKET, CHUNK, PREFIX, Bucket, HubFactory
from tests.hub_s3.store_proxy import StoreProxy
from tests.support.http import fetch

BIG_KEY = f"/{BUCKET}/{PREFIX}/ds/big.bin"


async def test_a_restarted_hub_serves_manifests_without_reading_the_bucket(
    make_s3_hub: HubFactory, bucket: Bucket, proxy: StoreProxy, http: aiohttp.ClientSession
) -> None:
    first = await make_s3_hub()
    status, _, computed = await fetch(http, f"{first.url}/manifest/ds/big.bin")
    assert status == 200 and proxy.faults.gets[BIG_KEY] == 1
    await first.stop()
    second = await make_s3_hub()
    status, _, kept = await fetch(http, f"{second.url}/manifest/ds/big.bin")
    assert (status, kept) == (200, computed)
    assert proxy.faults.gets[BIG_KEY] == 1  # the second hub only asked for a HEAD
    # A new version is hashed anew, not answered from the index.
    bucket.write("ds/big.bin", b"shorter now" * 1000)
    status, _, body = await fetch(http, f"{second.url}/manifest/ds/big.bin")
    assert status == 200 and body != computed and proxy.faults.gets[BIG_KEY] == 2


async def run_index(
    store: S3Store, proxy: StoreProxy, index_dir: Path, prefix: str
) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub", "index", "--root", f"s3://{BUCKET}/{PREFIX}",
        "--prefix", prefix, "--s3-endpoint", proxy.url, "--index-dir", str(index_dir),
        "--chunk-size", str(CHUNK),
        env={**os.environ, **store.env()}, stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )
    _, err = await process.communicate()
    return int(process.returncode or 0), err.decode()


async def test_hub_index_precomputes_a_prefix_resumably_for_a_hub_to_use(
    make_s3_hub: HubFactory, bucket: Bucket, store: S3Store, proxy: StoreProxy,
    http: aiohttp.ClientSession, tmp_path: Path,
) -> None:
    index_dir = tmp_path / "index"
    code, err = await run_index(store, proxy, index_dir, "ds/b")
    assert code == 0, err
    assert "indexed 1 objects, 0 already indexed, 0 failed" in err
    assert proxy.faults.gets[BIG_KEY] == 1
    # A second run over the whole prefix goes on where the first stopped.
    code, err = await run_index(store, proxy, index_dir, "ds/")
    assert code == 0, err
    under_ds = [p for p in bucket.contents if p.startswith("ds/")]
    assert f"indexed {len(under_ds) - 1} objects, 1 already indexed" in err
    assert proxy.faults.gets[BIG_KEY] == 1
    with sqlite3.connect(index_dir / "digests.sqlite") as db:
        assert db.execute("SELECT count(*) FROM digests").fetchone() == (len(under_ds),)
    read_by_index = sum(proxy.faults.gets.values())
    hub = await make_s3_hub(index_dir=str(index_dir))
    for path in under_ds:
        status, _, _ = await fetch(http, f"{hub.url}/manifest/{path}")
        assert status == 200, path
    assert sum(proxy.faults.gets.values()) == read_by_index


async def test_hub_index_refuses_a_directory_root(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub", "index", "--root", str(tmp_path),
        "--index-dir", str(tmp_path / "index"), stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    assert process.returncode == 2 and "not an s3:// root" in err.decode()
