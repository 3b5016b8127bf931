from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.support.servers import RunningServer


async def test_spoke_serves_hub_bytes_then_hits(
    spoke: RunningServer, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    for expected_cache in ("MISS", "HIT"):
        async with http.get(f"{spoke.url}/objects/ds/big.bin") as resp:
            assert resp.status == 200
            assert resp.headers["X-Cache"] == expected_cache
            assert await resp.read() == files["ds/big.bin"]
