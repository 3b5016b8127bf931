"""The per-client cap on requests in flight, on a real hub held behind a gate."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hub.config import HubConfig
from service.limits import LIMIT, InflightLimit
from tests.conftest import CHUNK
from tests.security.conftest import Dataset, call, problem
from tests.support.servers import GatedBackend, start_hub


def test_slots_are_per_client_and_given_back() -> None:
    limit = InflightLimit(2)
    assert limit.acquire("a") and limit.acquire("a") and not limit.acquire("a")
    assert limit.acquire("b")  # another address has its own slots
    limit.release("a")
    assert limit.acquire("a")
    for client in ("a", "a", "b"):
        limit.release(client)
    assert limit.rejected == 1 and limit.series("x")[1].read() == 0


async def test_requests_over_the_cap_get_429_and_are_counted(
    dataset: Dataset, gated: GatedBackend, http: aiohttp.ClientSession
) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_inflight_per_client=2), gated
    )
    try:
        gated.gate.clear()
        held = [asyncio.create_task(call(http, f"{hub.url}/objects/ds/small.bin"))
                for _ in range(2)]
        for _ in held:  # both are inside the handler, blocked on the backend
            await asyncio.to_thread(gated.waiting.acquire, timeout=10)
        response = await call(http, f"{hub.url}/objects/ds/small.bin")
        problem(response, 429)
        assert response[1]["Retry-After"] == "1"
        gated.gate.set()
        assert [status for status, _, _ in await asyncio.gather(*held)] == [200, 200]
        status, _, body = await call(http, f"{hub.url}/metrics")
        assert status == 200 and b"hub_limit_inflight_rejected_total 1.0" in body
        # The server releases a slot just after the client has the whole answer.
        statuses = []
        for _ in range(50):
            statuses.append((await call(http, f"{hub.url}/objects/ds/small.bin"))[0])
            if statuses[-1] == 200:
                break
            await asyncio.sleep(0.02)
        assert statuses[-1] == 200 and set(statuses) <= {200, 429}
    finally:
        gated.gate.set()
        await hub.stop()


@pytest.mark.parametrize("value", [0, -1])
async def test_zero_turns_the_cap_off(dataset: Dataset, value: int) -> None:
    hub = await start_hub(
        HubConfig(root=str(dataset[0]), chunk_size=CHUNK, max_inflight_per_client=value)
    )
    try:
        assert LIMIT not in hub.app
    finally:
        await hub.stop()
