"""A data-loader pass: workers read shuffled fixed-size samples by HTTP range.

It is what a PyTorch map-style dataset over shard files does per ``__getitem__``,
minus the framework: it lets the demo and benchmarks measure samples/s, read
latency and, against a spoke, the hit ratio, with one sample per request.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from loadtest.dataset import SAMPLE_BYTES, Shard
from protocol.headers import CACHE_HEADER


@dataclass
class PassResult:
    samples: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    hits: int = 0
    errors: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.samples_per_s * SAMPLE_BYTES / 1e6

    def latency_ms(self, q: float) -> float:
        if not self.latencies_s:
            return 0.0
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.latencies_s) if self.latencies_s else 0.0


def epoch_order(shards: list[Shard], seed: int) -> list[tuple[str, int]]:
    """Every (shard path, sample index) once, shuffled with ``seed``."""
    order = [(s.path, i) for s in shards for i in range(s.samples)]
    random.Random(seed).shuffle(order)
    return order


async def register_plan(base_url: str, order: list[tuple[str, int]],
                        session: aiohttp.ClientSession) -> str:
    """Tell a spoke the read order to come (``POST /plans``); returns the plan id."""
    reads = [[path, index * SAMPLE_BYTES, SAMPLE_BYTES] for path, index in order]
    async with session.post(f"{base_url}/plans", json={"reads": reads}) as resp:
        resp.raise_for_status()
        plan_id: str = (await resp.json())["id"]
        return plan_id


async def run_pass(base_url: str, order: list[tuple[str, int]], workers: int,
                   session: aiohttp.ClientSession, plan: str | None = None) -> PassResult:
    """Read every sample of ``order`` with ``workers`` concurrent readers."""
    result = PassResult()
    queue = iter(order)
    started = time.perf_counter()

    async def worker() -> None:
        for path, index in queue:
            offset = index * SAMPLE_BYTES
            headers = {"Range": f"bytes={offset}-{offset + SAMPLE_BYTES - 1}"}
            if plan is not None:
                headers["X-Hubspoke-Plan"] = plan
            t0 = time.perf_counter()
            async with session.get(f"{base_url}/objects/{path}", headers=headers) as resp:
                body = await resp.read()
                ok = resp.status == 206 and len(body) == SAMPLE_BYTES
                result.hits += resp.headers.get(CACHE_HEADER) == "HIT"
            result.latencies_s.append(time.perf_counter() - t0)
            result.samples += ok
            result.errors += not ok

    await asyncio.gather(*(worker() for _ in range(workers)))
    result.seconds = time.perf_counter() - started
    return result
