"""The aws cli through the S3 endpoint: ls (buckets, prefixes, recursive), cp to stdout
and to a directory (multipart ranges), s3api get-object --range, head-object, presign."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.s3_clients.endpoints import CacheWatch, Endpoint
from tests.s3_clients.tools import files_under, run, tool

COLD = "by-client/cli/cold.bin"


def aws_env(s3: Endpoint, tmp_path: Path) -> dict[str, str]:
    """No profile of the machine's; small multipart parts so that cp reads in ranges."""
    env = s3.env(tmp_path / "home")
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n  addressing_style = path\n"
                      "  multipart_threshold = 256KB\n  multipart_chunksize = 256KB\n"
                      "  max_concurrent_requests = 4\n")
    env["AWS_CONFIG_FILE"] = str(config)
    return env


def aws(s3: Endpoint, tmp_path: Path, *args: str) -> bytes:
    return run([tool("aws"), *args], aws_env(s3, tmp_path), tmp_path)


def test_ls_buckets_prefixes_and_recursive(s3: Endpoint, tmp_path: Path) -> None:
    buckets = aws(s3, tmp_path, "s3", "ls").decode()
    assert {line.split()[-1] for line in buckets.splitlines()} >= {"train", "other"}
    top = aws(s3, tmp_path, "s3", "ls", "s3://train/nested/").decode().splitlines()
    assert sorted(line.split()[-1] for line in top) == ["a/", "top.bin"]
    deep = aws(s3, tmp_path, "s3", "ls", "--recursive", "s3://train/many/").decode()
    rows = [line.split() for line in deep.splitlines()]
    assert [r[3] for r in rows] == sorted(k.removeprefix("train/") for k in s3.files
                                          if k.startswith("train/many/"))
    assert all(int(r[2]) == len(s3.files[f"train/{r[3]}"]) for r in rows)


def test_cp_to_stdout_and_to_a_directory(s3: Endpoint, tmp_path: Path) -> None:
    data = s3.files[f"train/{COLD}"]
    assert aws(s3, tmp_path, "s3", "cp", f"s3://train/{COLD}", "-") == data
    out = tmp_path / "shards"
    aws(s3, tmp_path, "s3", "cp", "--recursive", "--only-show-errors", "s3://train/shards/",
        str(out))
    assert files_under(out) == {k.removeprefix("train/shards/"): v for k, v in s3.files.items()
                                if k.startswith("train/shards/")}
    watch = CacheWatch(s3)
    # Bigger than the multipart threshold: downloaded as several ranged gets.
    aws(s3, tmp_path, "s3", "cp", "--only-show-errors", f"s3://train/{COLD}",
        str(tmp_path / "again.bin"))
    assert (tmp_path / "again.bin").read_bytes() == data
    watch.assert_all_hits()


def test_s3api_get_object_range_and_head(s3: Endpoint, tmp_path: Path) -> None:
    data = s3.files["train/big.bin"]
    out = tmp_path / "part.bin"
    meta = json.loads(aws(s3, tmp_path, "s3api", "get-object", "--bucket", "train", "--key",
                          "big.bin", "--range", "bytes=131000-262200", str(out)))
    assert out.read_bytes() == data[131000:262201]
    assert meta["ContentRange"] == f"bytes 131000-262200/{len(data)}"
    head = json.loads(aws(s3, tmp_path, "s3api", "head-object", "--bucket", "train", "--key",
                          "big.bin"))
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == meta["ETag"]


def test_presign_then_a_plain_http_get(s3: Endpoint, tmp_path: Path) -> None:
    env = aws_env(s3, tmp_path)
    # The cli (v1) presigns with SigV2 unless told otherwise; S3 wants SigV4.
    Path(env["AWS_CONFIG_FILE"]).write_text(
        "[default]\ns3 =\n  addressing_style = path\n  signature_version = s3v4\n")
    url = run([tool("aws"), "s3", "presign", "--expires-in", "600", "s3://train/exact.bin"],
              env, tmp_path).decode().strip()
    assert "X-Amz-Signature=" in url, url
    with urllib.request.urlopen(url, timeout=60) as reply:
        assert reply.read() == s3.files["train/exact.bin"]


def test_a_sigv2_presigned_url_is_refused(spoke_s3: Endpoint, tmp_path: Path) -> None:
    url = aws(spoke_s3, tmp_path, "s3", "presign", "s3://train/exact.bin").decode().strip()
    assert "Signature=" in url and "X-Amz-Signature=" not in url, url
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=60)
    with err.value as refused:
        assert refused.code in (400, 403), refused.code
        assert refused.headers["Content-Type"].startswith("application/xml")
        assert b"<Code>" in refused.read()
