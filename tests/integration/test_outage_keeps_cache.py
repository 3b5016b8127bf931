"""An outage must not cost cached data (a failed fill evicts nothing, found by the soak),
and a read the hub cannot complete gets a 503 before its head, not a head and a cut."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import CHUNK, SpokeFactory
from tests.support.raw_http import raw_get
from tests.support.servers import GatedBackend, RunningServer
from tests.support.waits import settled_stats


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

    from spoke.serve.handlers import CACHE

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


# -- an answer the hub cannot complete gets a status before its head, not a cut ------

BIG = "ds/big.bin"  # 40 chunks + 7 bytes


def ranges(*pairs: tuple[int, int]) -> str:
    """A Range field of inclusive (first, last) byte pairs."""
    return "Range: bytes=" + ",".join(f"{a}-{b}" for a, b in pairs)


# (cached chunks before the outage, the Range read during it)
PARTLY_CACHED_READS = {
    # One range from a cached chunk into an uncached one.
    "single": ([0], ranges((100, 2 * CHUNK - 1))),
    # multipart/byteranges: the first range cached, the second not.
    "multipart": ([0], ranges((0, 99), (5 * CHUNK, 5 * CHUNK + 99))),
    # A range worth a sendfile, whose cached chunks would go that way unprimed.
    "sendfile": ([0, 1, 2, 3, 4], ranges((0, 6 * CHUNK - 1))),
    # An open-ended range: the client asked for all the rest.
    "open-ended": ([30, 38, 39, 40], f"Range: bytes={30 * CHUNK}-"),
}


@pytest.mark.parametrize("through_aiohttp", [False, True], ids=["fast-path", "aiohttp"])
@pytest.mark.parametrize("case", list(PARTLY_CACHED_READS))
@pytest.mark.parametrize("breaker", ["closed", "open"])
async def test_a_read_running_into_an_uncached_chunk_during_an_outage_gets_503(
    hub: RunningServer, make_spoke: SpokeFactory, http: aiohttp.ClientSession,
    case: str, through_aiohttp: bool, breaker: str,
) -> None:
    cached, field = PARTLY_CACHED_READS[case]
    # A breaker that stays open once it opens, or one that never opens.
    threshold = 1 if breaker == "open" else 1000
    spoke = await make_spoke(meta_ttl_s=60.0, fetch_attempts=2, breaker_threshold=threshold,
                             breaker_reset_s=60.0)
    for index in cached:
        answer = await raw_get(spoke.url, f"/objects/{BIG}",
                               ranges((index * CHUNK, index * CHUNK + 9)))
        assert answer.status == 206 and answer.complete, answer.describe()
    await settled_stats(http, spoke.url)
    await hub.stop()
    if breaker == "open":
        tripped = await raw_get(spoke.url, f"/objects/{BIG}", ranges((20 * CHUNK, 20 * CHUNK)))
        assert tripped.status == 503, tripped.describe()
        assert (await settled_stats(http, spoke.url))["breaker_state"] == "open"

    answer = await raw_get(spoke.url, f"/objects/{BIG}", field, through_aiohttp=through_aiohttp)
    assert answer.status == 503, answer.describe()
    assert answer.complete, answer.describe()  # an answer, not a cut connection
    assert int(answer.headers["retry-after"]) >= 1
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert json.loads(answer.body)["status"] == 503
    # What is cached still comes.
    again = await raw_get(spoke.url, f"/objects/{BIG}",
                          ranges((cached[0] * CHUNK, cached[0] * CHUNK + 9)),
                          through_aiohttp=through_aiohttp)
    assert (again.status, again.headers["x-cache"], again.complete) == (206, "HIT", True)
