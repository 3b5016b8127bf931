"""The reference experiment, replayed as a data loader runs it.

N workers read shuffled fixed-size samples (4096 uint32 tokens = 16 KiB, one HTTP range
request each, as a map-style dataset's ``__getitem__`` does) from shard files, epoch after
epoch (each epoch a new shuffle of every sample; the workers drain at the epoch boundary,
as a ``DataLoader`` does). Every request is timed; every second the spoke's ``/stats`` is
read for the hub egress. The result is a per-second time series (samples/s, hit ratio from
``X-Cache``, p50/p99 read latency, hub egress bytes) and per-epoch figures.

Used by ``python -m loadtest.bench``; on its own::

    python -m loadtest.replay --url http://127.0.0.1:8701 --root DIR --prefix dataset \\
        [--stats-url http://127.0.0.1:8701] [--workers 32 --epochs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import aiohttp

from loadtest.dataset import SAMPLE_BYTES, Shard
from loadtest.loader import epoch_order
from protocol.headers import CACHE_HEADER


@dataclass
class Second:
    """One second of a replay (bucketed by request completion time)."""

    t: float  # seconds since the replay started (this bucket covers [t, t+1))
    epoch: int  # the epoch most requests of this second belonged to (1-based)
    epoch_t: int  # whole seconds since that epoch started
    seconds: float  # the bucket's width: 1, or less for the last one of a run
    samples: int
    samples_per_s: float
    hit_ratio: float | None  # fraction of requests answered X-Cache: HIT (None: no header)
    p50_ms: float
    p99_ms: float
    hub_bytes: int | None  # hub egress in this bucket (None: not measured)
    errors: int


@dataclass
class Epoch:
    epoch: int
    samples: int
    seconds: float
    hits: int
    errors: int
    p50_ms: float
    p99_ms: float
    hub_bytes: int | None

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


@dataclass
class ReplayResult:
    label: str
    workers: int
    sample_bytes: int
    samples: int = 0
    seconds: float = 0.0
    errors: int = 0
    truncated: bool = False  # stopped at the deadline before the last epoch ended
    epochs: list[Epoch] = field(default_factory=list)
    series: list[Second] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["samples_per_s"] = self.samples_per_s
        for e, d in zip(self.epochs, out["epochs"], strict=True):
            d["samples_per_s"] = e.samples_per_s
        return out


def percentile_ms(values: list[float], q: float) -> float:
    """Nearest-rank percentile of seconds, in ms (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return 1000 * ordered[rank - 1]


async def _hub_bytes(session: aiohttp.ClientSession, stats_url: str) -> int | None:
    try:
        async with session.get(f"{stats_url}/stats") as resp:
            stats = await resp.json()
            return int(stats["hub_bytes"])
    except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
        return None


async def replay(
    base_url: str, shards: list[Shard], *, workers: int, epochs: int, seed: int = 1,
    label: str = "", stats_url: str | None = None, deadline_s: float = 600.0,
    connector_limit: int | None = None, first_epoch: int = 1,
) -> ReplayResult:
    """Run ``epochs`` shuffled epochs over ``shards`` at ``base_url`` with ``workers`` readers.

    Epoch ``e`` reads the shuffle seeded by ``seed * 1000 + e``; ``first_epoch`` lets a
    caller run epochs one at a time (interleaved with another server) and
    :func:`concat` the parts.

    ``stats_url`` (a spoke) is polled once a second for ``hub_bytes``. The replay stops
    at ``deadline_s`` (``truncated`` is then set), so a slow server cannot hang a run.
    """
    result = ReplayResult(label or base_url, workers, SAMPLE_BYTES)
    # (completion time, latency, hit or None, ok, epoch)
    events: list[tuple[float, float, bool | None, bool, int]] = []
    egress: list[tuple[float, int]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=connector_limit or workers + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        deadline = started + deadline_s
        stop = asyncio.Event()

        async def poll_egress() -> None:
            assert stats_url is not None
            while not stop.is_set():
                value = await _hub_bytes(session, stats_url)
                if value is not None:
                    egress.append((time.perf_counter() - started, value))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)

        if stats_url:
            # A first reading at t = 0, so the first second has a delta.
            first = await _hub_bytes(session, stats_url)
            if first is not None:
                egress.append((0.0, first))
        poller = asyncio.create_task(poll_egress()) if stats_url else None

        async def worker(order: Iterator[tuple[str, int]], epoch: int) -> None:
            for path, index in order:
                if time.perf_counter() > deadline:
                    result.truncated = True
                    return
                offset = index * SAMPLE_BYTES
                headers = {"Range": f"bytes={offset}-{offset + SAMPLE_BYTES - 1}"}
                t0 = time.perf_counter()
                hit: bool | None = None
                try:
                    async with session.get(f"{base_url}/objects/{path}",
                                           headers=headers) as resp:
                        body = await resp.read()
                        ok = resp.status == 206 and len(body) == SAMPLE_BYTES
                        x_cache = resp.headers.get(CACHE_HEADER)
                        if x_cache is not None:
                            hit = x_cache == "HIT"
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                t1 = time.perf_counter()
                events.append((t1 - started, t1 - t0, hit, ok, epoch))

        try:
            for epoch in range(first_epoch, first_epoch + epochs):
                order = iter(epoch_order(shards, seed * 1000 + epoch))
                e_start = time.perf_counter()
                e_bytes0 = await _hub_bytes(session, stats_url) if stats_url else None
                await asyncio.gather(*(worker(order, epoch) for _ in range(workers)))
                e_end = time.perf_counter()
                e_events = [ev for ev in events if ev[4] == epoch]
                lat = [ev[1] for ev in e_events]
                e_bytes1 = await _hub_bytes(session, stats_url) if stats_url else None
                result.epochs.append(Epoch(
                    epoch=epoch, samples=sum(ev[3] for ev in e_events),
                    seconds=e_end - e_start, hits=sum(bool(ev[2]) for ev in e_events),
                    errors=sum(not ev[3] for ev in e_events),
                    p50_ms=percentile_ms(lat, 0.50), p99_ms=percentile_ms(lat, 0.99),
                    hub_bytes=(e_bytes1 - e_bytes0) if (e_bytes0 is not None
                                                        and e_bytes1 is not None) else None,
                ))
                if result.truncated:
                    break
        finally:
            stop.set()
            if poller is not None:
                await poller
        result.seconds = time.perf_counter() - started
        if stats_url:
            last = await _hub_bytes(session, stats_url)
            if last is not None:
                egress.append((time.perf_counter() - started, last))
    result.samples = sum(ev[3] for ev in events)
    result.errors = sum(not ev[3] for ev in events)
    result.series = bucket(events, egress, result.seconds)
    return result


def concat(parts: list[ReplayResult], label: str = "") -> ReplayResult:
    """One result from consecutive parts, on the parts' own (active) time axis."""
    out = ReplayResult(label or parts[0].label, parts[0].workers, parts[0].sample_bytes)
    offset = 0.0
    for part in parts:
        out.samples += part.samples
        out.errors += part.errors
        out.truncated = out.truncated or part.truncated
        out.epochs.extend(part.epochs)
        out.series.extend(Second(**{**asdict(sec), "t": sec.t + offset}) for sec in part.series)
        offset += part.seconds
    out.seconds = offset
    return out


def bucket(events: list[tuple[float, float, bool | None, bool, int]],
           egress: list[tuple[float, int]], seconds: float) -> list[Second]:
    """Per-second rows; a last, partial second is kept if it lasted at least 0.2 s."""
    n = max(1, math.ceil(seconds))
    if n > 1 and seconds - (n - 1) < 0.2:
        n -= 1
    per: list[list[tuple[float, float, bool | None, bool, int]]] = [[] for _ in range(n)]
    for ev in events:
        i = int(ev[0])
        if i < n:
            per[i].append(ev)
    rows = []
    starts: dict[int, float] = {}
    for ev in events:  # when each epoch's first request was sent
        starts[ev[4]] = min(starts.get(ev[4], ev[0] - ev[1]), ev[0] - ev[1])
    epoch = min(starts, default=0)  # a second with no answers belongs to the epoch before
    for t, evs in enumerate(per):
        lat = [ev[1] for ev in evs]
        flagged = [ev[2] for ev in evs if ev[2] is not None]
        epochs = [ev[4] for ev in evs]
        epoch = max(set(epochs), key=epochs.count) if epochs else epoch
        width = max(1e-3, min(1.0, seconds - t))
        rows.append(Second(
            seconds=width, samples_per_s=sum(ev[3] for ev in evs) / width,
            t=float(t), epoch=epoch, epoch_t=max(0, round(t - starts.get(epoch, 0.0))),
            samples=sum(ev[3] for ev in evs),
            hit_ratio=(sum(flagged) / len(flagged)) if flagged else None,
            p50_ms=percentile_ms(lat, 0.50), p99_ms=percentile_ms(lat, 0.99),
            hub_bytes=_egress_between(egress, t, t + width),
            errors=sum(not ev[3] for ev in evs),
        ))
    return rows


def _egress_between(egress: list[tuple[float, int]], t0: float, t1: float) -> int | None:
    """Hub bytes counted between t0 and t1, interpolated linearly between readings."""
    if len(egress) < 2 or t1 > egress[-1][0] + 0.05:
        return None

    def at(t: float) -> float:
        if t <= egress[0][0]:
            return egress[0][1]
        for (ta, va), (tb, vb) in itertools.pairwise(egress):
            if ta <= t <= tb:
                return va + (vb - va) * ((t - ta) / (tb - ta) if tb > ta else 1.0)
        return egress[-1][1]

    return max(0, round(at(t1) - at(t0)))


def rolling(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` entries (fewer at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


@dataclass
class ReplaySummary:
    local_samples_per_s: float  # hub direct, mean over its epochs after the first
    cold_samples_per_s: float  # spoke, first epoch (the cache fills during it)
    warm_samples_per_s: float  # spoke, mean over the epochs after the first
    warm_over_local: float
    time_to_95pct_s: float | None  # first second whose 3 s trailing mean ≥ 0.95 × local
    # The same against local's rate in the same epoch (epochs alternate between the
    # sides, so this pairs runs made under the same background load).
    time_to_95pct_same_epoch_s: float | None
    first_epoch_s: float
    within_first_epoch: bool
    hit_ratio_after_warmup: float | None  # X-Cache HIT fraction of the epochs after the first
    time_to_hit95_s: float | None  # end of the first second whose hit ratio is ≥ 95 %
    hub_bytes_first_epoch: int | None
    hub_bytes_after_warmup: int | None
    dataset_bytes: int


def summarize(local: ReplayResult, spoke: ReplayResult, dataset_bytes: int) -> ReplaySummary:
    def steady(r: ReplayResult) -> float:
        later = r.epochs[1:] or r.epochs
        samples = sum(e.samples for e in later)
        seconds = sum(e.seconds for e in later)
        return samples / seconds if seconds else 0.0

    local_rate = steady(local)
    warm = steady(spoke)
    first = spoke.epochs[0] if spoke.epochs else None
    smoothed = rolling([s.samples_per_s for s in spoke.series], 3)
    t95 = next((s.t + s.seconds for s, v in zip(spoke.series, smoothed, strict=True)
                if v >= 0.95 * local_rate), None)
    local_by_epoch = {e.epoch: e.samples_per_s for e in local.epochs}
    t95_same = next((s.t + s.seconds for s, v in zip(spoke.series, smoothed, strict=True)
                     if v >= 0.95 * local_by_epoch.get(s.epoch, local_rate)), None)
    later = spoke.epochs[1:]
    later_samples = sum(e.samples + e.errors for e in later)
    hub_later = [e.hub_bytes for e in later]
    return ReplaySummary(
        local_samples_per_s=local_rate,
        cold_samples_per_s=first.samples_per_s if first else 0.0,
        warm_samples_per_s=warm,
        warm_over_local=warm / local_rate if local_rate else 0.0,
        time_to_95pct_s=t95,
        time_to_95pct_same_epoch_s=t95_same,
        first_epoch_s=first.seconds if first else 0.0,
        within_first_epoch=t95 is not None and first is not None and t95 <= first.seconds,
        hit_ratio_after_warmup=(sum(e.hits for e in later) / later_samples
                                if later_samples else None),
        time_to_hit95_s=next((s.t + s.seconds for s in spoke.series
                              if s.hit_ratio is not None and s.hit_ratio >= 0.95), None),
        hub_bytes_first_epoch=first.hub_bytes if first else None,
        hub_bytes_after_warmup=(sum(h for h in hub_later if h is not None)
                                if later and all(h is not None for h in hub_later) else None),
        dataset_bytes=dataset_bytes,
    )


def plot(local: ReplayResult, spoke: ReplayResult, summary: ReplaySummary, path: str,
         title: str = "") -> None:
    """The warm-up curve (samples/s, hit ratio, p99, hub egress) beside the local baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1.4, 1.4]})
    ax = axes[0]
    # Each bucket covers [t, t + 1): plot it at its middle.
    xs_l = [s.t + s.seconds / 2 for s in local.series]
    xs_s = [s.t + s.seconds / 2 for s in spoke.series]
    ax.plot(xs_l, [s.samples_per_s for s in local.series], color="tab:gray", lw=1.5,
            label="hub direct (data local)")
    ax.plot(xs_s, [s.samples_per_s for s in spoke.series], color="tab:blue", lw=2,
            label="spoke, cold start through 60 ms")
    ax.axhline(summary.local_samples_per_s, color="tab:gray", ls="--", lw=1)
    ax.axhline(0.95 * summary.local_samples_per_s, color="tab:green", ls=":", lw=1,
               label="95 % of local")
    t = 0.0
    for e in spoke.epochs[:-1]:
        t += e.seconds
        ax.axvline(t, color="tab:blue", ls=":", lw=0.8)
    if summary.time_to_95pct_s is not None:
        ax.axvline(summary.time_to_95pct_s, color="tab:green", lw=1)
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or "Training replay: cold spoke warming up vs data local")

    ax2 = axes[1]
    ax2.plot(xs_s, [100 * (s.hit_ratio or 0) for s in spoke.series], color="tab:orange",
             label="hit ratio % (X-Cache)")
    ax2.set_ylabel("hit %")
    ax2.set_ylim(0, 105)
    ax2b = ax2.twinx()
    ax2b.bar(xs_s, [(s.hub_bytes or 0) / 1e6 / s.seconds for s in spoke.series],
             color="tab:red",
             alpha=0.35, width=0.8, label="hub egress MB/s")
    ax2b.set_ylabel("hub MB/s")
    ax2.legend(loc="center right", fontsize=8)
    ax2b.legend(loc="upper right", fontsize=8)

    ax3 = axes[2]
    ax3.plot(xs_l, [s.p99_ms for s in local.series], color="tab:gray", label="local p99")
    ax3.plot(xs_s, [s.p99_ms for s in spoke.series], color="tab:blue", label="spoke p99")
    ax3.plot(xs_s, [s.p50_ms for s in spoke.series], color="tab:blue", ls="--",
             label="spoke p50")
    ax3.set_yscale("log")
    ax3.set_ylabel("read ms")
    ax3.set_xlabel("seconds since start")
    ax3.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="hub or spoke base URL")
    parser.add_argument("--root", required=True, help="the hub's root (to list shard sizes)")
    parser.add_argument("--prefix", default="dataset")
    parser.add_argument("--stats-url", help="a spoke to poll for hub egress")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=600.0)
    args = parser.parse_args()
    folder = os.path.join(args.root, args.prefix)
    shards = [Shard(f"{args.prefix}/{name}", os.path.getsize(os.path.join(folder, name)))
              for name in sorted(os.listdir(folder)) if name.endswith(".bin")]
    result = asyncio.run(replay(args.url, shards, workers=args.workers, epochs=args.epochs,
                                stats_url=args.stats_url, deadline_s=args.deadline))
    print(json.dumps(result.to_json(), indent=1))


if __name__ == "__main__":
    main()
