"""boto3 through the S3 endpoint: gets (whole, ranged), heads, list pagination (v2, v1),
download_file in multipart ranges, presigned URLs fetched by a plain HTTP client, errors,
anonymous reads and scoped keys."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.s3_clients.endpoints import (
    MANY,
    REGION,
    SCOPED_KEY,
    SCOPED_SECRET,
    CacheWatch,
    Endpoint,
)

COLD = "by-client/boto3/cold.bin"
_OPEN: list[Any] = []  # the clients made by the running test


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Each test's clients closed after it (their pooled sockets too: the warnings filter
    would otherwise fail whichever later test the garbage collector runs in)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(endpoint: Endpoint, key: str | None = None, secret: str | None = None,
           **config: Any) -> Any:
    """A boto3 S3 client of its own session (no profile, no config file), path-style."""
    key = key or endpoint.access_key
    secret = secret or endpoint.secret_key
    signed = key is not None
    session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret,
                                    region_name=REGION)
    settings = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                      signature_version="s3v4" if signed else UNSIGNED, **config)
    made = session.client("s3", endpoint_url=endpoint.url, config=settings)
    _OPEN.append(made)
    return made


def test_whole_and_ranged_get_object(s3: Endpoint) -> None:
    c = client(s3)
    data = s3.files[f"train/{COLD}"]
    got = c.get_object(Bucket="train", Key=COLD)
    assert got["Body"].read() == data
    assert got["ContentLength"] == len(data)
    assert got["ETag"].startswith('"') and got["ETag"].endswith('"')
    # Across chunk boundaries, the first byte, an open end and a suffix.
    for header, want in (("bytes=65530-131080", data[65530:131081]), ("bytes=0-0", data[:1]),
                         ("bytes=300000-", data[300000:]), ("bytes=-1000", data[-1000:])):
        part = c.get_object(Bucket="train", Key=COLD, Range=header)
        assert part["Body"].read() == want, header
        assert part["ResponseMetadata"]["HTTPStatusCode"] == s3.ranged_status
        first = len(data) - len(want) if header.startswith("bytes=-") else int(
            header[6:].split("-")[0])
        assert part["ContentRange"] == f"bytes {first}-{first + len(want) - 1}/{len(data)}"
        assert part["ContentLength"] == len(want)
        # A whole object's checksum on a range fails botocore 1.36+ (it checks it).
        sent = part["ResponseMetadata"]["HTTPHeaders"]
        assert not [h for h in sent if h.startswith("x-amz-checksum-")], sent
    watch = CacheWatch(s3)
    again = c.get_object(Bucket="train", Key=COLD, Range="bytes=1000-200000")
    assert again["Body"].read() == data[1000:200001]
    watch.assert_all_hits()


def test_empty_and_one_byte_objects(s3: Endpoint) -> None:
    c = client(s3)
    assert c.get_object(Bucket="train", Key="empty.bin")["Body"].read() == b""
    assert c.head_object(Bucket="train", Key="empty.bin")["ContentLength"] == 0
    assert c.get_object(Bucket="train", Key="one-byte.bin")["Body"].read() == s3.files[
        "train/one-byte.bin"]


def test_head_object_matches_get(s3: Endpoint) -> None:
    c = client(s3)
    head = c.head_object(Bucket="train", Key="big.bin")
    got = c.get_object(Bucket="train", Key="big.bin", Range="bytes=0-9")
    assert got["Body"].read() == s3.files["train/big.bin"][:10]
    assert head["ContentLength"] == len(s3.files["train/big.bin"])
    assert head["ETag"] == got["ETag"]
    assert head["LastModified"] == got["LastModified"]
    with pytest.raises(ClientError) as err:
        c.head_object(Bucket="train", Key="no-such.bin")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_conditional_get(spoke_s3: Endpoint) -> None:
    s3 = spoke_s3  # rclone's S3 ignores If-Match and If-None-Match
    c = client(s3)
    etag = c.head_object(Bucket="train", Key="exact.bin")["ETag"]
    same = c.get_object(Bucket="train", Key="exact.bin", IfMatch=etag, Range="bytes=0-99")
    assert same["Body"].read() == s3.files["train/exact.bin"][:100]
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="train", Key="exact.bin", IfMatch='"not-the-etag"')
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="train", Key="exact.bin", IfNoneMatch=etag)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304


def test_list_objects_v2_pages(s3: Endpoint) -> None:
    c = client(s3)
    pages = list(c.get_paginator("list_objects_v2").paginate(
        Bucket="train", Prefix="many/", PaginationConfig={"PageSize": 7}))
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert keys == sorted(f"many/k-{i:04d}.bin" for i in range(MANY))
    assert len(pages) == -(-MANY // 7)
    sizes = {o["Key"]: o["Size"] for page in pages for o in page["Contents"]}
    assert all(sizes[k] == len(s3.files[f"train/{k}"]) for k in keys)
    # start-after, and a delimiter rolling keys up into common prefixes.
    after = c.list_objects_v2(Bucket="train", Prefix="many/", StartAfter="many/k-0100.bin")
    assert [o["Key"] for o in after["Contents"]] == keys[101:]
    top = c.list_objects_v2(Bucket="train", Prefix="nested/", Delimiter="/")
    assert [o["Key"] for o in top["Contents"]] == ["nested/top.bin"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["nested/a/"]


def test_list_objects_v1_markers(s3: Endpoint) -> None:
    c = client(s3)
    keys: list[str] = []
    marker = ""
    for _ in range(MANY):
        page = c.list_objects(Bucket="train", Prefix="many/", MaxKeys=25, Marker=marker)
        keys += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        marker = page.get("NextMarker") or keys[-1]
    assert keys == sorted(f"many/k-{i:04d}.bin" for i in range(MANY))


def test_list_buckets_and_head_bucket(s3: Endpoint) -> None:
    c = client(s3)
    names = [b["Name"] for b in c.list_buckets()["Buckets"]]
    assert {"train", "other"} <= set(names)
    assert c.head_bucket(Bucket="train")["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(ClientError) as err:
        c.list_objects_v2(Bucket="no-such-bucket")
    assert err.value.response["Error"]["Code"] == "NoSuchBucket"
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="no-such-bucket", Key="x")
    assert err.value.response["Error"]["Code"] == "NoSuchBucket"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="train", Key="no/such/key.bin")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"


def test_download_file_in_multipart_ranges(s3: Endpoint, tmp_path: Path) -> None:
    c = client(s3)
    config = TransferConfig(multipart_threshold=256 << 10, multipart_chunksize=256 << 10,
                            max_concurrency=4)
    out = tmp_path / "big.bin"
    c.download_file("train", "big.bin", str(out), Config=config)
    assert out.read_bytes() == s3.files["train/big.bin"]
    watch = CacheWatch(s3)
    again = tmp_path / "again.bin"
    c.download_file("train", "big.bin", str(again), Config=config)
    assert again.read_bytes() == s3.files["train/big.bin"]
    watch.assert_all_hits()


def test_key_with_spaces_and_reserved_characters(s3: Endpoint) -> None:
    c = client(s3)
    key = "odd names/sp ace+plus=eq.bin"
    assert c.get_object(Bucket="train", Key=key)["Body"].read() == s3.files[f"train/{key}"]
    listed = c.list_objects_v2(Bucket="train", Prefix="odd names/")
    assert [o["Key"] for o in listed["Contents"]] == [key]


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read()


def test_presigned_url_fetched_with_a_plain_http_client(s3: Endpoint) -> None:
    c = client(s3)
    url = c.generate_presigned_url("get_object", Params={"Bucket": "train", "Key": "big.bin"},
                                   ExpiresIn=3600)
    assert "X-Amz-Signature=" in url
    data = s3.files["train/big.bin"]
    assert fetch(url) == (200, data)
    # The Range header is not signed: any range of a presigned object.
    assert fetch(url, {"Range": "bytes=70000-70999"}) == (s3.ranged_status, data[70000:71000])
    # A changed signature, key or expiry no longer holds.
    forged = url.replace("X-Amz-Signature=", "X-Amz-Signature=0")
    assert fetch(forged)[0] == 403
    other_key = url.replace("/train/big.bin", "/train/exact.bin")
    assert fetch(other_key)[0] == 403
    longer = url.replace("X-Amz-Expires=3600", "X-Amz-Expires=3601")
    assert fetch(longer)[0] == 403


def test_unsigned_request_is_refused_when_credentials_are_configured(
        spoke_s3: Endpoint) -> None:
    # (rclone answers 400.)
    status, body = fetch(f"{spoke_s3.url}/train/big.bin")
    assert status == 403
    assert b"<Error>" in body and b"<Code>" in body


def test_wrong_secret_is_signature_does_not_match(s3: Endpoint) -> None:
    c = client(s3, secret="not-the-secret")
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="train", Key="big.bin")
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_a_scoped_key_reads_its_prefix_only(spoke_s3: Endpoint) -> None:
    c = client(spoke_s3, SCOPED_KEY, SCOPED_SECRET)
    assert c.get_object(Bucket="other", Key="notes.csv")["Body"].read() == spoke_s3.files[
        "other/notes.csv"]
    # Even once the chunks are cached (by the all-prefixes key), train/ stays closed.
    client(spoke_s3).get_object(Bucket="train", Key="exact.bin")["Body"].read()
    with pytest.raises(ClientError) as err:
        c.get_object(Bucket="train", Key="exact.bin")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as err:
        c.list_objects_v2(Bucket="train")
    assert err.value.response["Error"]["Code"] == "AccessDenied"


def test_anonymous_reads_unsigned_and_signed(anonymous: Endpoint) -> None:
    unsigned = client(anonymous)
    data = anonymous.files["train/exact.bin"]
    assert unsigned.get_object(Bucket="train", Key="exact.bin")["Body"].read() == data
    assert [o["Key"] for o in unsigned.list_objects_v2(Bucket="train", Prefix="nested/a/")[
        "Contents"]] == ["nested/a/b/deep.bin", "nested/a/side.bin"]
    # Signatures are not checked without credentials, as a public bucket's are not.
    signed = client(anonymous, "anyone", "any-secret")
    assert signed.get_object(Bucket="train", Key="exact.bin", Range="bytes=5-9")[
        "Body"].read() == data[5:10]
    assert fetch(f"{anonymous.url}/train/exact.bin") == (200, data)


def test_s3_and_objects_share_one_cache(spoke_s3: Endpoint) -> None:
    """A chunk read through S3 is a HIT through /objects."""
    key = "train/by-client/shared/cold.bin"
    data = spoke_s3.files[key]
    assert client(spoke_s3).get_object(Bucket="train", Key=key[6:], Range="bytes=0-99999")[
        "Body"].read() == data[:100000]
    spoke_s3.stats()  # settled: the chunks are stored
    request = urllib.request.Request(f"{spoke_s3.spoke_http}/objects/{key}",
                                     headers={"Range": "bytes=0-65535"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.read() == data[:65536]
        assert reply.headers["X-Cache"] == "HIT"
