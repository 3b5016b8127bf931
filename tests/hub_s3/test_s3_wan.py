"""What the issue's "done" asks: a dataset uploaded to an S3-compatible store, trained on
through hub → a 60 ms link (Toxiproxy) → spoke, byte-exact. All real, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import torch
from toxiproxy.exceptions import NotFound

from loadtest.wan import add_latency, create_hub_proxy, start_toxiproxy
from spoke.client.torch_dataset import ShardedSamples
from spoke.config import SpokeConfig
from tests.hub_s3.conftest import Bucket
from tests.support.servers import RunningServer, start_spoke

TOKENS = 1024  # int32 tokens: 4 KiB samples
SAMPLE = TOKENS * 4


@pytest.fixture(scope="module")
def toxiproxy_api() -> Iterator[str]:
    with start_toxiproxy() as url:
        yield url


async def test_a_dataset_in_the_bucket_trains_through_a_60ms_link_byte_exact(
    s3_hub: RunningServer, bucket: Bucket, toxiproxy_api: str, tmp_path: Path
) -> None:
    rng = random.Random(22)
    shards = {f"train/shard-{i:05d}.bin": rng.randbytes(SAMPLE * 24 + 100) for i in range(3)}
    for path, data in shards.items():
        await asyncio.to_thread(bucket.write, path, data)  # uploaded through the S3 API
    parts = urlsplit(s3_hub.url)
    assert parts.hostname is not None and parts.port is not None
    link = create_hub_proxy(toxiproxy_api, (parts.hostname, parts.port), name="s3_hub_wan")
    spoke: RunningServer | None = None
    try:
        add_latency(link.proxy, 60)
        spoke = await start_spoke(SpokeConfig(
            hub_url=f"http://{link.listen}", cache_dir=str(tmp_path / "cache"),
            capacity_bytes=64 << 20,
        ))
        url = spoke.url

        def epoch() -> list[torch.Tensor]:
            samples = ShardedSamples(url, prefix="train/", tokens_per_sample=TOKENS)
            assert len(samples) == 24 * len(shards)
            return samples.__getitems__(list(range(len(samples))))

        for _ in range(2):  # cold across the link, then from the spoke's cache
            got = await asyncio.to_thread(epoch)
            expected = [
                torch.frombuffer(bytearray(data[i * SAMPLE:(i + 1) * SAMPLE]),
                                 dtype=torch.int32).to(torch.int64)
                for _, data in sorted(shards.items()) for i in range(24)
            ]
            assert len(got) == len(expected)
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    finally:
        if spoke is not None:
            await spoke.stop()
        with contextlib.suppress(NotFound, requests.RequestException):
            link.proxy.destroy()
