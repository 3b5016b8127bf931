"""ListObjectsV2, ListObjects, ListBuckets, HeadBucket and GetBucketLocation through the
S3 front end, over the hub's listing."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError

from tests.s3.conftest import S3Front

Dataset = tuple[Path, dict[str, bytes]]
EXTRA = ["tree/a/1.bin", "tree/a/2.bin", "tree/b/1.bin", "tree/c.bin", "tree/d e/f+g.bin",
         "tree/z/deep/x.bin"]


@pytest.fixture
def tree(dataset: Dataset) -> list[str]:
    root, _ = dataset
    for path in EXTRA:
        os.makedirs(root / os.path.dirname(path), exist_ok=True)
        (root / path).write_bytes(path.encode())
    return sorted(p.split("/", 1)[1] for p in EXTRA)


def _all_v2(client: Any, **kwargs: Any) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        listed = len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
        assert page["KeyCount"] == listed
    return keys, prefixes, pages


def _all_v1(client: Any, **kwargs: Any) -> tuple[list[str], list[str], int]:
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    for page in client.get_paginator("list_objects").paginate(**kwargs):
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes, pages


async def test_v2_pages_every_key_once(front: S3Front, tree: list[str]) -> None:
    client = front.client()
    keys, prefixes, pages = await asyncio.to_thread(
        _all_v2, client, Bucket="tree", PaginationConfig={"PageSize": 2})
    assert keys == tree and prefixes == [] and pages == 3
    keys, prefixes, pages = await asyncio.to_thread(
        _all_v2, client, Bucket="tree", Delimiter="/", PaginationConfig={"PageSize": 2})
    assert keys == ["c.bin"]
    assert prefixes == ["a/", "b/", "d e/", "z/"]
    assert pages == 3
    keys, prefixes, _ = await asyncio.to_thread(
        _all_v2, client, Bucket="tree", Prefix="a/", Delimiter="/")
    assert keys == ["a/1.bin", "a/2.bin"] and prefixes == []
    keys, _, _ = await asyncio.to_thread(_all_v2, client, Bucket="tree", StartAfter="b/1.bin")
    assert keys == [k for k in tree if k > "b/1.bin"]


async def test_v2_fields(front: S3Front, tree: list[str], dataset: Dataset) -> None:
    page = await asyncio.to_thread(front.client().list_objects_v2, Bucket="ds", MaxKeys=1,
                                   Prefix="big")
    assert page["KeyCount"] == 1 and not page["IsTruncated"]
    entry = page["Contents"][0]
    assert entry["Key"] == "big.bin" and entry["Size"] == len(dataset[1]["ds/big.bin"])
    head = await asyncio.to_thread(front.client().head_object, Bucket="ds", Key="big.bin")
    assert entry["ETag"] == head["ETag"]
    page = await asyncio.to_thread(front.client().list_objects_v2, Bucket="ds", MaxKeys=0)
    assert page["KeyCount"] == 0 and page["IsTruncated"]


async def test_url_encoding(front: S3Front, tree: list[str], http: aiohttp.ClientSession) -> None:
    # boto3 asks for encoding-type=url itself and decodes the answer.
    keys, _, _ = await asyncio.to_thread(_all_v2, front.client(), Bucket="tree",
                                         Prefix="d e/")
    assert keys == ["d e/f+g.bin"]
    async with http.get(f"{front.url}/tree?list-type=2&prefix=d%20e/&encoding-type=url") as r:
        text = await r.text()
    assert "<Key>d%20e/f%2Bg.bin</Key>" in text and "<EncodingType>url</EncodingType>" in text


async def test_v1_markers(front: S3Front, tree: list[str]) -> None:
    client = front.client()
    keys, prefixes, pages = await asyncio.to_thread(
        _all_v1, client, Bucket="tree", PaginationConfig={"PageSize": 2})
    assert keys == tree and pages == 3
    keys, prefixes, pages = await asyncio.to_thread(
        _all_v1, client, Bucket="tree", Delimiter="/", PaginationConfig={"PageSize": 2})
    assert keys == ["c.bin"] and prefixes == ["a/", "b/", "d e/", "z/"] and pages == 3
    page = await asyncio.to_thread(client.list_objects, Bucket="tree", Delimiter="/", MaxKeys=1)
    assert page["IsTruncated"] and page["NextMarker"] == "a/"
    page = await asyncio.to_thread(client.list_objects, Bucket="tree", Marker="b/1.bin")
    assert [o["Key"] for o in page["Contents"]] == [k for k in tree if k > "b/1.bin"]


async def test_buckets(front: S3Front, tree: list[str]) -> None:
    client = front.client()
    listed = await asyncio.to_thread(client.list_buckets)
    assert [b["Name"] for b in listed["Buckets"]] == ["ds", "other", "tree"]
    head = await asyncio.to_thread(client.head_bucket, Bucket="tree")
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "us-east-1"
    location = await asyncio.to_thread(client.get_bucket_location, Bucket="ds")
    assert location["LocationConstraint"] is None
    for call, kwargs, status, code in [
        (client.head_bucket, {"Bucket": "nope"}, 404, "404"),
        (client.get_bucket_location, {"Bucket": "nope"}, 404, "NoSuchBucket"),
        (client.list_objects_v2, {"Bucket": "nope"}, 404, "NoSuchBucket"),
        (client.list_objects, {"Bucket": "nope"}, 404, "NoSuchBucket"),
    ]:
        with pytest.raises(ClientError) as raised:
            await asyncio.to_thread(call, **kwargs)
        error = raised.value.response
        assert (error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Code"]) == (
            status, code)
    empty = await asyncio.to_thread(client.list_objects_v2, Bucket="tree", Prefix="nothing/")
    assert empty["KeyCount"] == 0


@pytest.mark.parametrize("query", [
    "list-type=2&max-keys=abc", "list-type=2&max-keys=-1", "list-type=2&max-keys=99999999999",
    "list-type=2&max-keys=" + "9" * 5000, "list-type=2&continuation-token=garbage",
    "list-type=2&continuation-token=%ff%fe", "list-type=3", "encoding-type=base64",
    "prefix=a/../b", "prefix=%2e%2e/x", "prefix=a//b", "delimiter=ab", "marker=%ff",
    "prefix=a&prefix=b", "prefix=%00",
])
async def test_bad_list_parameters_are_invalid_argument(
    front: S3Front, http: aiohttp.ClientSession, query: str
) -> None:
    async with http.get(f"{front.url}/ds?{query}") as r:
        text = await r.text()
        assert r.status == 400, text
        assert r.content_type == "application/xml"
        assert "<Code>InvalidArgument</Code>" in text
        assert r.headers["x-amz-request-id"]


async def test_paging_asks_the_hub_for_the_listing_once(
    front: S3Front, tree: list[str], gated: Any
) -> None:
    calls: list[str] = []
    inner = gated.list

    def counting(prefix: str) -> Any:
        calls.append(prefix)
        return inner(prefix)

    gated.list = counting  # the hub runs in this process
    keys, _, pages = await asyncio.to_thread(
        _all_v2, front.client(), Bucket="tree", PaginationConfig={"PageSize": 1})
    assert keys == tree and pages == len(tree)
    assert calls == ["tree/"]
