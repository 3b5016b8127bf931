from __future__ import annotations

import asyncio
from pathlib import Path

from tests.s3.conftest import S3Front, get_object


async def test_get_object_whole_and_ranged(
    front: S3Front, dataset: tuple[Path, dict[str, bytes]]
) -> None:
    _, contents = dataset
    client = front.client()
    _, body = await get_object(client, Bucket="ds", Key="partial.bin")
    assert body == contents["ds/partial.bin"]
    _, body = await get_object(client, Bucket="ds", Key="big.bin", Range="bytes=100-70000")
    assert body == contents["ds/big.bin"][100:70001]
    listed = await asyncio.to_thread(client.list_objects_v2, Bucket="ds")
    assert [o["Key"] for o in listed["Contents"]] == sorted(
        p[3:] for p in contents if p.startswith("ds/"))
