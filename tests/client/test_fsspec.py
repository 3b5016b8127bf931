"""The fsspec filesystem over a real spoke, and pandas / pyarrow reading through it.

As in test_client.py, blocking calls run in a worker thread so the servers' event
loop (the test's) stays free.
"""

from __future__ import annotations

import asyncio
import io
import pickle
import random
from collections.abc import Iterator
from pathlib import Path

import fsspec  # type: ignore[import-untyped]
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spoke.client.clients import VersionChanged
from spoke.client.fsspec_fs import HubspokeFileSystem
from tests.conftest import CHUNK, SpokeFactory
from tests.support.clock import FakeClock
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    """Register the protocol (the entry point may not be installed) and, afterwards,
    close every cached filesystem so no session outlives its test."""
    fsspec.register_implementation("hubspoke", HubspokeFileSystem, clobber=True)
    yield
    for fs in list(HubspokeFileSystem._cache.values()):
        fs.close()
    HubspokeFileSystem.clear_instance_cache()


def _fs(spoke: RunningServer) -> HubspokeFileSystem:
    fs = fsspec.filesystem("hubspoke", endpoint=spoke.url)
    assert isinstance(fs, HubspokeFileSystem)
    return fs


async def test_ls_lists_files_and_synthesised_directories(
    spoke: RunningServer, dataset: Dataset
) -> None:
    _, files = dataset

    def check() -> None:
        fs = _fs(spoke)
        root = fs.ls("", detail=True)
        assert [(e["name"], e["type"]) for e in root] == [
            ("ds", "directory"), ("other", "directory"),
        ]
        assert fs.ls("hubspoke://ds", detail=False) == sorted(
            p for p in files if p.startswith("ds/")
        )
        big = {e["name"]: e for e in fs.ls("ds/")}["ds/big.bin"]
        assert big["size"] == len(files["ds/big.bin"]) and big["type"] == "file"
        assert fs.ls("other/notes.csv", detail=False) == ["other/notes.csv"]
        with pytest.raises(FileNotFoundError):
            fs.ls("nope")
        assert fs.find("") == sorted(files)
        assert fs.find("hubspoke://ds/big.bin") == ["ds/big.bin"]
        assert fs.find("nope") == []
        with_dirs = fs.find("", withdirs=True, detail=True)
        assert {n for n, e in with_dirs.items() if e["type"] == "directory"} == {"ds", "other"}
        assert fs.find("", maxdepth=1) == []  # fsspec's walk: no files at the top level
        assert fs.glob("ds/*.bin") == sorted(p for p in files if p.startswith("ds/"))

    await asyncio.to_thread(check)


async def test_find_with_nested_directories(spoke: RunningServer, dataset: Dataset) -> None:
    root, _ = dataset
    (root / "ds" / "sub" / "deep").mkdir(parents=True)
    (root / "ds" / "sub" / "deep" / "x.bin").write_bytes(b"x")

    def check() -> None:
        fs = _fs(spoke)
        found = fs.find("ds", withdirs=True, detail=True)
        dirs = sorted(n for n, e in found.items() if e["type"] == "directory")
        assert dirs == ["ds", "ds/sub", "ds/sub/deep"]
        assert "ds/sub/deep/x.bin" in found and list(found) == sorted(found)
        assert fs.ls("ds/sub", detail=False) == ["ds/sub/deep"]
        assert fs.glob("ds/**/*.bin")[-1] == "ds/sub/deep/x.bin"

    await asyncio.to_thread(check)


async def test_filesystem_pickles_with_its_endpoint(
    spoke: RunningServer, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, files = dataset
    monkeypatch.setenv("HUBSPOKE_ENDPOINT", spoke.url)

    def check() -> None:
        fs = fsspec.filesystem("hubspoke", skip_instance_cache=True)
        monkeypatch.delenv("HUBSPOKE_ENDPOINT")  # a worker need not have the variable
        copy = pickle.loads(pickle.dumps(fs))
        try:
            assert copy.cat_file("ds/small.bin") == files["ds/small.bin"]
        finally:
            fs.close()
            copy.close()

    await asyncio.to_thread(check)


async def test_info_exists_and_ukey(spoke: RunningServer, dataset: Dataset) -> None:
    _, files = dataset

    def check() -> None:
        fs = _fs(spoke)
        info = fs.info("hubspoke://ds/partial.bin")
        assert info["name"] == "ds/partial.bin" and info["type"] == "file"
        assert info["size"] == len(files["ds/partial.bin"]) and info["mtime"] is not None
        assert fs.ukey("ds/partial.bin") == info["etag"]
        assert fs.info("ds") == {"name": "ds", "size": 0, "type": "directory"}
        assert fs.isdir("ds") and fs.isfile("ds/big.bin") and not fs.exists("ds/nope.bin")
        with pytest.raises(FileNotFoundError):
            fs.info("ds/nope.bin")

    await asyncio.to_thread(check)


async def test_cat_file_ranges(spoke: RunningServer, dataset: Dataset) -> None:
    _, files = dataset
    big = files["ds/big.bin"]

    def check() -> None:
        fs = _fs(spoke)
        assert fs.cat_file("ds/big.bin") == big
        around = fs.cat_file("ds/big.bin", start=CHUNK - 2, end=CHUNK + 2)
        assert around == big[CHUNK - 2 : CHUNK + 2]
        assert fs.cat_file("ds/big.bin", start=-10) == big[-10:]
        assert fs.cat_file("ds/big.bin", start=5, end=-5) == big[5:-5]
        assert fs.cat_file("ds/big.bin", start=len(big) - 3, end=len(big) + 50) == big[-3:]
        assert fs.cat_file("ds/big.bin", start=len(big) + 1) == b""
        assert fs.cat_file("ds/big.bin", start=10, end=10) == b""
        assert fs.cat("hubspoke://other/notes.csv") == files["other/notes.csv"]

    await asyncio.to_thread(check)


async def test_open_seek_read_matches_bytes(spoke: RunningServer, dataset: Dataset) -> None:
    _, files = dataset
    big = files["ds/big.bin"]

    def check() -> None:
        fs = _fs(spoke)
        rng = random.Random(7)
        with fs.open("ds/big.bin", block_size=CHUNK + 17) as f:
            local = io.BytesIO(big)
            for _ in range(80):
                whence = rng.choice([io.SEEK_SET, io.SEEK_CUR, io.SEEK_END])
                offset = {
                    io.SEEK_SET: rng.randrange(len(big)),
                    io.SEEK_CUR: rng.randrange(-local.tell(), CHUNK),
                    io.SEEK_END: rng.randrange(-len(big), 0),
                }[whence]
                assert f.seek(offset, whence) == local.seek(offset, whence)
                n = rng.randrange(3 * CHUNK)
                assert f.read(n) == local.read(n)
            f.seek(-5, io.SEEK_END)
            assert f.read(100) == big[-5:] and f.read(1) == b""

    await asyncio.to_thread(check)


async def test_fsspec_open_with_options_and_env(
    spoke: RunningServer, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, files = dataset
    notes = files["other/notes.csv"]

    def check() -> None:
        with fsspec.open("hubspoke://other/notes.csv", endpoint=spoke.url) as f:
            assert f.read() == notes
        monkeypatch.setenv("HUBSPOKE_ENDPOINT", spoke.url)
        with fsspec.open("hubspoke://other/notes.csv", "rb") as f:
            assert f.read() == notes

    await asyncio.to_thread(check)


def test_endpoint_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HUBSPOKE_ENDPOINT", raising=False)
    with pytest.raises(ValueError, match="HUBSPOKE_ENDPOINT"):
        HubspokeFileSystem(skip_instance_cache=True)


def test_strip_protocol() -> None:
    strip = HubspokeFileSystem._strip_protocol
    assert strip("hubspoke://dataset/shard-0001.bin") == "dataset/shard-0001.bin"
    assert strip("hubspoke://dataset/") == "dataset"
    assert strip("/dataset/x") == "dataset/x"
    assert strip(["hubspoke://a", "b/"]) == ["a", "b"]


async def test_writes_are_refused(spoke: RunningServer) -> None:
    def check() -> None:
        fs = _fs(spoke)
        with pytest.raises(PermissionError):
            fs.open("ds/new.bin", "wb")
        with pytest.raises(PermissionError):
            fs.pipe_file("ds/new.bin", b"x")
        with pytest.raises(PermissionError):
            fs.rm("ds/big.bin")
        with pytest.raises(PermissionError):
            fs.mkdir("newdir")
        with pytest.raises(PermissionError):
            fs.touch("ds/new.bin")

    await asyncio.to_thread(check)


async def test_fsspec_file_is_pinned_to_its_version(
    make_spoke: SpokeFactory, dataset: Dataset
) -> None:
    root, files = dataset
    clock = FakeClock()
    spoke = await make_spoke(clock.clock(), meta_ttl_s=0.2)
    old = files["ds/partial.bin"]

    def check() -> None:
        fs = _fs(spoke)
        with fs.open("ds/partial.bin", block_size=CHUNK, cache_type="none") as f:
            assert f.read(100) == old[:100]
            (root / "ds/partial.bin").write_bytes(bytes(b ^ 0xA5 for b in old))
            clock.advance(0.2 + 0.001)  # past the metadata TTL: the spoke learns the new version
            with pytest.raises(VersionChanged, match=r"ds/partial\.bin"):
                f.read(2 * CHUNK)

    await asyncio.to_thread(check)


# --- pandas and pyarrow through the spoke -------------------------------------------------


def _frame(rows: int) -> pd.DataFrame:
    rng = random.Random(3)
    return pd.DataFrame({
        "id": range(rows),
        "score": [rng.random() for _ in range(rows)],
        "label": [rng.choice(["cat", "dog", "emu"]) for _ in range(rows)],
    })


async def test_pandas_read_csv_through_spoke(spoke: RunningServer, dataset: Dataset) -> None:
    root, _ = dataset
    local = root / "tables" / "people.csv"
    local.parent.mkdir()
    _frame(5000).to_csv(local, index=False)

    def check() -> None:
        remote = pd.read_csv(
            "hubspoke://tables/people.csv", storage_options={"endpoint": spoke.url}
        )
        pd.testing.assert_frame_equal(remote, pd.read_csv(local))

    await asyncio.to_thread(check)


async def test_parquet_through_spoke(spoke: RunningServer, dataset: Dataset) -> None:
    root, _ = dataset
    local = root / "tables" / "data.parquet"
    local.parent.mkdir()
    # Several row groups, so readers seek around the file rather than read it whole.
    pq.write_table(pa.Table.from_pandas(_frame(20_000)), local, row_group_size=3000)

    def check() -> None:
        fs = _fs(spoke)
        table = pq.read_table("tables/data.parquet", filesystem=fs)
        assert table.equals(pq.read_table(local))
        subset = pq.read_table("tables/data.parquet", filesystem=fs, columns=["score"])
        assert subset.equals(pq.read_table(local, columns=["score"]))
        frame = pd.read_parquet(
            "hubspoke://tables/data.parquet", storage_options={"endpoint": spoke.url}
        )
        pd.testing.assert_frame_equal(frame, pd.read_parquet(local))

    await asyncio.to_thread(check)
