"""s3fs (fsspec) and pyarrow's S3FileSystem through the S3 endpoint: listings, ranged
reads, open/seek/read, and a Parquet table read in row-group ranges."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
import s3fs
from pyarrow import fs

from tests.s3_clients.endpoints import REGION, CacheWatch, Endpoint


@pytest.fixture
def s3_fs(s3: Endpoint) -> Iterator[s3fs.S3FileSystem]:
    yield s3fs_for(s3)


def s3fs_for(endpoint: Endpoint) -> s3fs.S3FileSystem:
    anon = endpoint.access_key is None
    return s3fs.S3FileSystem(
        anon=anon, key=endpoint.access_key, secret=endpoint.secret_key,
        endpoint_url=endpoint.url, skip_instance_cache=True, use_listings_cache=False,
        client_kwargs={"region_name": REGION},
        config_kwargs={"s3": {"addressing_style": "path"}},
        default_block_size=128 << 10, default_cache_type="none",
    )


def test_s3fs_ls_and_find(s3: Endpoint, s3_fs: s3fs.S3FileSystem) -> None:
    assert sorted(s3_fs.ls("train/nested", detail=False)) == [
        "train/nested/a", "train/nested/top.bin"]
    found = s3_fs.find("train/many/")
    assert found == sorted(k for k in s3.files if k.startswith("train/many/"))
    info = s3_fs.info("train/big.bin")
    assert info["size"] == len(s3.files["train/big.bin"]) and info["type"] == "file"


def test_s3fs_cat_file_ranges(s3: Endpoint, s3_fs: s3fs.S3FileSystem) -> None:
    key = "train/by-client/s3fs/cold.bin"
    data = s3.files[key]
    for start, end in ((0, 10), (65530, 65546), (100000, 300000), (len(data) - 5, len(data))):
        assert s3_fs.cat_file(key, start=start, end=end) == data[start:end], (start, end)
    assert s3_fs.cat_file(key) == data
    watch = CacheWatch(s3)
    assert s3_fs.cat_file(key, start=70000, end=260000) == data[70000:260000]
    watch.assert_all_hits()


def test_s3fs_open_seek_read(s3: Endpoint, s3_fs: s3fs.S3FileSystem) -> None:
    data = s3.files["train/big.bin"]
    with s3_fs.open("train/big.bin", "rb", block_size=64 << 10) as f:
        assert f.read(100) == data[:100]
        f.seek(1_000_000)
        assert f.read(200_000) == data[1_000_000:1_200_000]
        f.seek(-7, 2)
        assert f.read() == data[-7:]
        assert f.tell() == len(data)


def test_s3fs_anonymous(anonymous: Endpoint) -> None:
    anon_fs = s3fs_for(anonymous)
    assert anon_fs.cat_file("train/nested/top.bin") == anonymous.files["train/nested/top.bin"]
    assert "train/nested/top.bin" in anon_fs.ls("train/nested", detail=False)


def arrow_fs(endpoint: Endpoint) -> fs.S3FileSystem:
    return fs.S3FileSystem(
        access_key=endpoint.access_key, secret_key=endpoint.secret_key, region=REGION,
        endpoint_override=endpoint.host_port, scheme="http", force_virtual_addressing=False,
        anonymous=endpoint.access_key is None, check_directory_existence_before_creation=False,
    )


def test_pyarrow_reads_a_parquet_table(s3: Endpoint) -> None:
    local = pq.read_table(str(s3.root / "train" / "table.parquet"))
    arrow = arrow_fs(s3)
    table = pq.read_table("train/table.parquet", filesystem=arrow)
    assert table.equals(local)
    # A column of one row group: the reader asks for ranges of the file.
    parquet = pq.ParquetFile("train/table.parquet", filesystem=arrow)
    assert parquet.metadata.num_row_groups > 3
    assert parquet.read_row_group(3, columns=["score"]).equals(
        pq.ParquetFile(str(s3.root / "train" / "table.parquet")).read_row_group(
            3, columns=["score"]))


def test_pyarrow_listing_and_read_at(s3: Endpoint) -> None:
    arrow = arrow_fs(s3)
    infos = arrow.get_file_info(fs.FileSelector("train/many", recursive=True))
    assert sorted(i.path for i in infos) == sorted(k for k in s3.files
                                                   if k.startswith("train/many/"))
    assert all(i.size == len(s3.files[i.path]) for i in infos)
    key = "train/by-client/arrow/cold.bin"
    data = s3.files[key]
    with arrow.open_input_file(key) as f:
        assert f.size() == len(data)
        assert f.read_at(150_000, 65_540) == data[65_540:215_540]
        f.seek(len(data) - 10)
        assert f.read() == data[-10:]


def test_pyarrow_anonymous(anonymous: Endpoint) -> None:
    table = pq.read_table("train/table.parquet", filesystem=arrow_fs(anonymous))
    assert table.equals(pq.read_table(str(anonymous.root / "train" / "table.parquet")))
