"""rclone (as an S3 client: an s3 remote configured by environment) and s5cmd through the
S3 endpoint: listing, copy, cat."""

from __future__ import annotations

from pathlib import Path

from tests.s3_clients.endpoints import REGION, CacheWatch, Endpoint
from tests.s3_clients.tools import files_under, run, tool


def rclone_env(s3: Endpoint, tmp_path: Path) -> dict[str, str]:
    env = s3.env(tmp_path / "home")
    env |= {
        "RCLONE_CONFIG": str(tmp_path / "no-rclone.conf"),
        "RCLONE_CONFIG_HS_TYPE": "s3", "RCLONE_CONFIG_HS_PROVIDER": "Other",
        "RCLONE_CONFIG_HS_ENDPOINT": s3.url, "RCLONE_CONFIG_HS_REGION": REGION,
        "RCLONE_CONFIG_HS_FORCE_PATH_STYLE": "true",
        "RCLONE_CONFIG_HS_ACCESS_KEY_ID": s3.access_key or "",
        "RCLONE_CONFIG_HS_SECRET_ACCESS_KEY": s3.secret_key or "",
    }
    return env


def rclone(s3: Endpoint, tmp_path: Path, *args: str) -> bytes:
    return run([tool("rclone"), *args], rclone_env(s3, tmp_path), tmp_path)


def test_rclone_lists(s3: Endpoint, tmp_path: Path) -> None:
    assert {"train/", "other/"} <= set(rclone(s3, tmp_path, "lsf", "hs:").decode().split())
    listed = rclone(s3, tmp_path, "lsf", "hs:train/nested").decode().split()
    assert sorted(listed) == ["a/", "top.bin"]
    sized = rclone(s3, tmp_path, "ls", "hs:train/many").decode().splitlines()
    got = {name: int(size) for size, name in (line.split() for line in sized)}
    assert got == {k.removeprefix("train/many/"): len(v) for k, v in s3.files.items()
                   if k.startswith("train/many/")}


def test_rclone_copy_and_cat(s3: Endpoint, tmp_path: Path) -> None:
    out = tmp_path / "copied"
    rclone(s3, tmp_path, "copy", "hs:train/shards", str(out))
    assert files_under(out) == {k.removeprefix("train/shards/"): v for k, v in s3.files.items()
                                if k.startswith("train/shards/")}
    key = "train/by-client/rclone/cold.bin"
    data = s3.files[key]
    assert rclone(s3, tmp_path, "cat", f"hs:{key}") == data
    watch = CacheWatch(s3)
    assert rclone(s3, tmp_path, "cat", "--offset", "70000", "--count", "150000",
                  f"hs:{key}") == data[70000:220000]
    watch.assert_all_hits()


def s5cmd(s3: Endpoint, tmp_path: Path, *args: str) -> bytes:
    return run([tool("s5cmd"), "--endpoint-url", s3.url, *args], s3.env(tmp_path / "home"),
               tmp_path)


def test_s5cmd_ls(s3: Endpoint, tmp_path: Path) -> None:
    buckets = s5cmd(s3, tmp_path, "ls").decode()
    assert "s3://train" in buckets and "s3://other" in buckets
    rows = s5cmd(s3, tmp_path, "ls", "s3://train/many/*").decode().splitlines()
    got = {line.split()[-1]: int(line.split()[-2]) for line in rows}
    assert got == {k.removeprefix("train/many/"): len(v) for k, v in s3.files.items()
                   if k.startswith("train/many/")}


def test_s5cmd_cp_and_cat(s3: Endpoint, tmp_path: Path) -> None:
    out = tmp_path / "copied"
    s5cmd(s3, tmp_path, "cp", "s3://train/shards/*", f"{out}/")
    assert files_under(out) == {k.removeprefix("train/shards/"): v for k, v in s3.files.items()
                                if k.startswith("train/shards/")}
    key = "train/by-client/s5cmd/cold.bin"
    assert s5cmd(s3, tmp_path, "cat", f"s3://{key}") == s3.files[key]
    watch = CacheWatch(s3)
    # Several parts of the object at once.
    s5cmd(s3, tmp_path, "cp", "--concurrency", "4", "--part-size", "5", f"s3://{key}",
          str(tmp_path / "again.bin"))
    assert (tmp_path / "again.bin").read_bytes() == s3.files[key]
    watch.assert_all_hits()
