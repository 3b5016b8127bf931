"""An outage must not cost cached data: a failed fill evicts nothing (found by the soak)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import GatedBackend, settled_stats


async def test_failed_fills_evict_nothing(
    make_spoke: SpokeFactory, gated: GatedBackend, dataset: tuple[Path, dict[str, bytes]],
    http: aiohttp.ClientSession,
) -> None:
    _, files = dataset
    spoke = await make_spoke(capacity_bytes=4 * CHUNK, fetch_attempts=1)

    async def read(i: int) -> tuple[int, str | None, bytes]:
        headers = {"Range": f"bytes={i * CHUNK}-{i * CHUNK + 99}"}
        async with http.get(f"{spoke.url}/objects/ds/big.bin", headers=headers) as resp:
            return resp.status, resp.headers.get("X-Cache"), await resp.read()

    for i in range(4):
        assert (await read(i))[0] == 206
    gated.fail_reads = True  # the hub answers, but cannot read its data
    for i in range(4, 8):
        assert (await read(i))[0] in (502, 503)
    stats = await settled_stats(http, spoke.url)
    assert (stats["evictions"], stats["used_bytes"]) == (0, 4 * CHUNK)
    for i in range(4):
        status, x_cache, body = await read(i)
        assert (status, x_cache) == (206, "HIT")
        assert body == files["ds/big.bin"][i * CHUNK:i * CHUNK + 100]


async def test_a_disk_that_refuses_writes_still_serves_the_bytes(
    make_spoke: SpokeFactory, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    import errno

    from spoke.handlers import CACHE

    _, files = dataset
    spoke = await make_spoke()
    store = spoke.app[CACHE].store

    def full(name: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    store.write = full  # type: ignore[method-assign]
    async with http.get(f"{spoke.url}/objects/ds/partial.bin") as resp:
        assert resp.status == 200 and await resp.read() == files["ds/partial.bin"]
    stats = await settled_stats(http, spoke.url)
    assert (stats["uncached_fills"], stats["used_bytes"], stats["cached_chunks"]) == (6, 0, 0)
