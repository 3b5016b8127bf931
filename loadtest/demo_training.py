"""The demo's training loop in miniature: loader workers feed a "GPU" that takes a batch
per step, and every second is recorded.

Workers read shuffled 16 KiB samples by HTTP range (as :mod:`loadtest.loader` does)
into a bounded queue; the GPU takes ``batch`` samples at a time and computes for
``step_s`` (simulated: it waits that long). When reads keep up, samples/s is the
GPU's own rate and it is busy all the time; when they do not (a cold cache behind a
narrow link), it waits for data, and both drop: the seed's experiment, in seconds.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtest.dataset import SAMPLE_BYTES
from loadtest.quantiles import quantile
from protocol.headers import CACHE_HEADER

# Samples the workers may hold ready ahead of the GPU, in batches (a DataLoader's
# prefetch_factor).
PREFETCH_BATCHES = 2
FAST_READ_S = 0.005  # the seed's bar for a read served from NVMe


@dataclass
class Second:
    """One second of a phase."""

    t: int  # seconds since the phase started
    samples: int = 0  # consumed by the GPU
    reads: int = 0
    hits: int = 0  # reads answered X-Cache: HIT
    latencies_s: list[float] = field(default_factory=list)
    busy_s: float = 0.0  # GPU compute time in this second
    hub_bytes: int | None = None  # the hub's egress in this second

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.reads if self.reads else None

    def p99_ms(self) -> float | None:
        return 1000 * quantile(self.latencies_s, 0.99) if self.latencies_s else None


@dataclass
class Phase:
    name: str
    started: float = 0.0
    seconds: float = 0.0
    samples: int = 0
    errors: int = 0
    busy_s: float = 0.0
    series: list[Second] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def gpu_busy(self) -> float:
        return self.busy_s / self.seconds if self.seconds else 0.0

    def latencies(self) -> list[float]:
        return [x for s in self.series for x in s.latencies_s]

    @property
    def hit_ratio(self) -> float | None:
        reads = sum(s.reads for s in self.series)
        return sum(s.hits for s in self.series) / reads if reads else None

    def fast_reads(self) -> float:
        """Share of reads answered within :data:`FAST_READ_S`."""
        lat = self.latencies()
        return sum(x < FAST_READ_S for x in lat) / len(lat) if lat else 0.0

    def second(self, now: float) -> Second:
        t = max(0, int(now - self.started))
        while len(self.series) <= t:
            self.series.append(Second(len(self.series)))
        return self.series[t]


Progress = Callable[[Phase, int, int], None]


async def train(
    name: str, base_url: str | Sequence[str], order: list[tuple[str, int]],
    session: aiohttp.ClientSession,
    *, workers: int, batch: int, step_s: float, plan: str | None = None,
    hub_egress: Callable[[], Awaitable[int | None]] | None = None,
    progress: Progress | None = None,
) -> Phase:
    """One epoch over ``order`` through ``base_url``, the GPU stepping ``step_s`` per batch.
    Several base URLs (a tier's spokes) each serve an equal share of the loader's workers,
    as the nodes of a cluster would."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    phase = Phase(name, started=time.perf_counter())
    queue: asyncio.Queue[bool] = asyncio.Queue(maxsize=PREFETCH_BATCHES * batch)
    todo = iter(order)

    async def reader(url: str) -> None:
        for path, index in todo:
            offset = index * SAMPLE_BYTES
            headers = {"Range": f"bytes={offset}-{offset + SAMPLE_BYTES - 1}"}
            if plan is not None:
                headers["X-Hubspoke-Plan"] = plan
            t0 = time.perf_counter()
            try:
                async with session.get(f"{url}/objects/{path}", headers=headers) as resp:
                    body = await resp.read()
                    ok = resp.status == 206 and len(body) == SAMPLE_BYTES
                    hit = resp.headers.get(CACHE_HEADER) == "HIT"
            except (TimeoutError, aiohttp.ClientError):
                ok, hit = False, False
            now = time.perf_counter()
            sec = phase.second(now)
            sec.reads += 1
            sec.hits += hit
            sec.latencies_s.append(now - t0)
            phase.errors += not ok
            await queue.put(ok)

    async def gpu() -> None:
        left = len(order)
        while left:
            take = min(batch, left)
            good = 0
            for _ in range(take):
                good += await queue.get()
            left -= take
            t0 = time.perf_counter()
            await asyncio.sleep(step_s * take / batch)  # the step's compute
            now = time.perf_counter()
            _spread_busy(phase, t0, now)
            phase.second(now).samples += good
            phase.samples += good
            if progress is not None:
                progress(phase, len(order) - left, len(order))

    seen: list[int | None] = [None]  # the hub's egress counter, as last read

    async def egress_until(now: float) -> None:
        """Count the hub's egress since the last reading in the second of ``now``."""
        assert hub_egress is not None
        reading = await hub_egress()
        last, seen[0] = seen[0], reading
        if reading is not None and last is not None:
            sec = phase.second(now)
            sec.hub_bytes = (sec.hub_bytes or 0) + reading - last

    async def egress() -> None:
        while True:
            await asyncio.sleep(1.0 - (time.perf_counter() - phase.started) % 1.0)
            await egress_until(time.perf_counter() - 0.5)

    if hub_egress is not None:
        seen[0] = await hub_egress()
    meter = asyncio.ensure_future(egress() if hub_egress is not None else asyncio.sleep(0))
    try:
        await asyncio.gather(gpu(), *(reader(urls[i % len(urls)]) for i in range(workers)))
    finally:
        meter.cancel()
        await asyncio.gather(meter, return_exceptions=True)
    phase.seconds = time.perf_counter() - phase.started
    if hub_egress is not None:  # the phase's last, partial second
        await egress_until(phase.started + max(0.0, phase.seconds - 1e-6))
    return phase


def _spread_busy(phase: Phase, t0: float, t1: float) -> None:
    """Count GPU time ``[t0, t1)`` in the seconds it fell in."""
    phase.busy_s += t1 - t0
    while t0 < t1:
        edge = phase.started + math.floor(t0 - phase.started) + 1
        stop = min(edge, t1)
        phase.second(t0).busy_s += stop - t0
        t0 = stop
