"""Batched reads: many sample ranges in one multipart/byteranges round trip."""

from __future__ import annotations

import random
from pathlib import Path

import aiohttp

from spoke.client.clients import AsyncClient
from tests.support.http import metric
from tests.support.servers import RunningServer


async def test_a_batch_is_one_request_and_byte_exact(
    hub: RunningServer, spoke: RunningServer, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    _, files = dataset
    data = files["ds/big.bin"]
    rng = random.Random(3)
    ranges = [(rng.randrange(len(data)), rng.randrange(1, 5000)) for _ in range(300)]
    ranges += [(len(data) - 5, 100), (len(data) + 10, 7), (0, 0)]  # tail, past the end, empty
    for server in (hub, spoke):
        async with AsyncClient(server.url) as client:
            before = await metric(http, hub.url, "hub_requests_total")
            got = await client.read_many("ds/big.bin", ranges)
            after = await metric(http, hub.url, "hub_requests_total")
        assert got == [data[o:o + n] for o, n in ranges]
        if server is hub:
            # 303 ranges: two requests of at most 256 ranges, plus the metrics scrape.
            assert after - before == 3


async def test_the_torch_style_batch_of_samples_matches_single_reads(
    spoke: RunningServer, dataset: tuple[Path, dict[str, bytes]]
) -> None:
    _, files = dataset
    ranges = [(i * 16384, 16384) for i in (5, 0, 31, 2, 7, 7)]
    async with AsyncClient(spoke.url) as client:
        batch = await client.read_many("ds/big.bin", ranges)
        singles = [await client.read("ds/big.bin", o, n) for o, n in ranges]
    assert batch == singles == [files["ds/big.bin"][o:o + n] for o, n in ranges]
