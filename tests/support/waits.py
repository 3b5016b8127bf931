"""Bounded waits for a state a server reaches on its own (a stored chunk, a finished
warm job), instead of fixed sleeps that race on a loaded machine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.support.http import fetch, stats

POLL_S = 0.01


async def wait_for_stats(
    http: aiohttp.ClientSession, url: str, ready: Callable[[dict[str, Any]], bool],
    timeout_s: float = 10.0, headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The first ``/stats`` of the spoke at ``url`` that ``ready`` accepts; fails after
    ``timeout_s``, showing the last one."""
    doc: dict[str, Any] | None = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                doc = await stats(http, url, headers)
                if ready(doc):
                    return doc
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"/stats never got there in {timeout_s} s: {doc}") from None


def nothing_in_flight(doc: dict[str, Any]) -> bool:
    """No chunk is being fetched from the hub, nor being stored."""
    return bool(doc["hub_fetches_in_flight"] == 0 and doc["chunks_storing"] == 0)


async def settled_stats(
    http: aiohttp.ClientSession, spoke_url: str, timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The spoke's /stats once no chunk is being fetched or stored.

    An answer ends when its bytes are verified, and its chunks land on disk just
    after; a test that checks what is stored waits for this first, and checks this
    snapshot (the one that shows nothing in flight), not a later one.
    """
    return await wait_for_stats(http, spoke_url, nothing_in_flight, timeout_s, headers)


async def wait_warm(
    http: aiohttp.ClientSession, url: str, job_id: str, token: str | None = None,
) -> dict[str, object]:
    """Warm job ``job_id`` once it has finished, as ``token`` (if any) sees it (10 s at most)."""
    headers = None if token is None else {"Authorization": f"Bearer {token}"}
    for _ in range(400):
        status, _, body = await fetch(http, f"{url}/warm/{job_id}", headers)
        assert status == 200, body
        job: dict[str, object] = json.loads(body)
        if job["state"] != "running":
            return job
        await asyncio.sleep(0.025)
    raise AssertionError(f"warm job {job_id} still running")
