"""The soak: a spoke under load and WAN faults for minutes; proves nothing leaks or is lost.

    python -m loadtest.soak --minutes 10 --out reports/soak

It generates a dataset three times the spoke's capacity (so the spoke evicts all
the time), starts a hub, Toxiproxy with a 60 ms latency toxic in front of it and a
spoke with an empty cache, all on 127.0.0.1. Then, for ``--minutes``, many
loaders read it while a fault script (``loadtest/faults.py``) toggles the link:
latency spikes, connection resets and a 30 s outage (proxy disabled). Run as
root, the cache sits on a tmpfs of fixed size, and the script also fills that
disk for a while (``loadtest/diskfull.py``).

The load comes from an asyncio/aiohttp generator in this process, not Locust:
the checks need every request's phase, chunk, ``X-Cache``, status and bytes, and
"known cached" chunks read during the outage; a plain event loop gives that
without gevent and costs less CPU on a small machine, where the spoke, the hub
and the Toxiproxy stand-in share the cores with the load. Users:

* loaders: each picks a shard set and reads all its 16 KiB samples in a fresh
  shuffled order per epoch, with a few ``HEAD``s;
* sequential readers: chunk-aligned 4 MiB reads, shard after shard;
* hot readers: random samples from a few fixed chunks, all the time, so there
  are always cached chunks being read when an outage starts;
* a straddler, during outages only: reads that start in a cached chunk and run
  into an uncached one, of a shard nobody else reads; just before each outage its
  cache is purged and that one chunk is read, so the next one is surely missing.

Every ``--interval`` seconds it records the spoke's RSS and open fds (psutil),
temp files in the cache's ``tmp/``, used bytes vs capacity (``/stats`` and on disk),
hit ratio, p50/p99 latency and errors, into ``soak.csv`` and ``soak.png``; then it
prints the pass criteria with PASS/FAIL and exits 1 if any failed:

* no wrong bytes: every body is checked against xxh3-64 digests of each 16 KiB
  sample of the generated files, computed here beforehand;
* a response marked ``X-Cache: HIT`` never fails (status, length, bytes, stream);
* known cached data survives an outage: while the hub is unreachable no fill can
  complete, so nothing may leave the cache; a chunk served HIT once the outage
  has settled (1 s) is known cached, and every later read of it in that outage
  must succeed;
* requests in flight during an outage fail, if at all, only with 503/504;
* a partly cached read in an outage gets a 503/504 before any byte, never a 206
  that is then cut;
* no connection is ever cut (or left unanswered) before a status line;
* with the disk full, every read is still answered, correctly (served uncached);
* RSS stays below ``--rss-max-mb`` throughout, faults included;
* RSS and open fds flat: the least-squares slope of their 30 s floors over the
  second half, under normal load (see :func:`floor_slope_per_min`);
* no temp files in the cache once the load stopped, nor after SIGTERM;
* used bytes (``/stats``, every 0.5 s) and bytes on disk never above capacity;
* the spoke stays up and exits 0 on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import xxhash

from loadtest.dataset import SAMPLE_BYTES, Shard, generate
from loadtest.diskfull import DiskFiller, can_mount, small_filesystem
from loadtest.faults import DISK_FULL, NORMAL, OUTAGE, Applied, FaultInjector, plan
from loadtest.lab import Lab
from loadtest.meter import memory, open_fds
from loadtest.procs import Process
from loadtest.quantiles import quantile
from protocol.headers import CACHE_HEADER
from protocol.sizes import parse_size

UNAVAILABLE = (503, 504)  # what the spoke answers for uncached data when the hub is away
# Fills in flight when the link goes down may still land (and evict) for a moment;
# after this, nothing can enter the cache until the link is back.
SETTLE_S = 1.0
PRE_OUTAGE_S = 1.0  # hot chunks HIT this shortly before an outage: an info figure
FAST_SAMPLE_S = 0.5  # how often used bytes, RSS and fds are read between samples
MAX_EXAMPLES = 8  # failure examples kept per kind
FLOOR_BUCKET_S = 30.0  # RSS and fd floors are minima over this long (see floor_slope_per_min)
MIN_BUCKETS = 3  # fewer floors than this in the second half: no slope worth judging
QUIESCE_S = 30.0  # at most this long to wait for in-flight fills after the load stops
# The cache's tmpfs holds the capacity plus this much: the index, and fills being stored.
DISK_HEADROOM_BYTES = 128 << 20
FRESH_OBJECTS = 64  # objects first read while the disk is full: each needs a manifest saved
FRESH_BYTES = 256 << 10
FRESH_PAUSE_S = 0.25
STRADDLE_CHUNK = 1  # the straddle shard's chunk left cached before an outage
STRADDLE_SPAN = 8 << 10  # a straddling read's bytes on each side of the chunk boundary
STRADDLE_PAUSE_S = 0.05
MB = 1 << 20  # the soak's memory unit (its figures have always been /proc's kB / 1024)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    p.add_argument("--out", default="reports/soak", help="directory for CSV, PNG, logs")
    p.add_argument("--capacity", type=parse_size, default=256 << 20, help="spoke capacity")
    p.add_argument("--dataset-factor", type=float, default=3.0,
                   help="dataset size as a multiple of the capacity")
    p.add_argument("--shard-size", type=parse_size, default=16 << 20)
    p.add_argument("--chunk-size", type=parse_size, default=4 << 20)
    p.add_argument("--data-dir", help="dataset directory to reuse (default: a temp dir)")
    p.add_argument("--users", type=int, default=32, help="loader users")
    p.add_argument("--shards-per-user", type=int, default=4)
    p.add_argument("--sequential-users", type=int, default=2)
    p.add_argument("--hot-users", type=int, default=2)
    p.add_argument("--hot-chunks", type=int, default=4)
    p.add_argument("--head-fraction", type=float, default=0.01)
    p.add_argument("--latency-ms", type=int, default=60)
    p.add_argument("--outage-s", type=float, default=30.0)
    p.add_argument("--disk-full", choices=("auto", "on", "off"), default="auto",
                   help="a full-disk phase (the cache on a tmpfs: needs root); auto: if root")
    p.add_argument("--disk-full-s", type=float, default=15.0)
    p.add_argument("--rss-max-mb", type=float, default=256.0,
                   help="the spoke's anonymous RSS may never exceed this, faults included")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--rss-slope-max", type=float, default=1.0, help="MB/min, second half")
    # The fd floor wanders by ±8 between 30 s buckets with the connections open (hub
    # pool, chunk files), about ±0.7 fds/min of slope noise over 7 buckets; a leak
    # of one fd per fault or per thousand requests is far above 2.
    p.add_argument("--fd-slope-max", type=float, default=2.0, help="fds/min, second half")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    if args.shard_size < (STRADDLE_CHUNK + 2) * args.chunk_size:
        p.error(f"--shard-size must hold at least {STRADDLE_CHUNK + 2} chunks (the straddler's)")
    if args.disk_full == "on" and not can_mount():
        p.error("--disk-full on needs root (it mounts a tmpfs for the cache)")
    args.disk_full = args.disk_full == "on" or (args.disk_full == "auto" and can_mount())
    return args


# ---------------------------------------------------------------------------- reference


@dataclass(frozen=True, slots=True)
class Reference:
    """What every byte of the dataset should be: xxh3-64 of each sample, per shard."""

    shards: list[Shard]
    sample_digests: dict[str, list[int]]

    def check(self, path: str, start: int, body: bytes) -> bool:
        digests = self.sample_digests[path]
        first = start // SAMPLE_BYTES
        view = memoryview(body)
        for k in range(len(body) // SAMPLE_BYTES):
            piece = view[k * SAMPLE_BYTES:(k + 1) * SAMPLE_BYTES]
            if xxhash.xxh3_64_intdigest(piece) != digests[first + k]:
                return False
        return True


def build_reference(root: str, shards: list[Shard]) -> Reference:
    digests: dict[str, list[int]] = {}
    for shard in shards:
        with open(os.path.join(root, shard.path), "rb") as f:
            data = f.read()
        digests[shard.path] = [
            xxhash.xxh3_64_intdigest(data[i:i + SAMPLE_BYTES])
            for i in range(0, shard.size, SAMPLE_BYTES)
        ]
    return Reference(shards, digests)


# ---------------------------------------------------------------------------- recording


@dataclass(slots=True)
class Result:
    kind: str  # sample | sequential | hot | head
    chunk: tuple[str, int] | None
    status: int | None
    x_cache: str | None
    problem: str | None  # None: a complete, correct response
    started: float
    ended: float
    phase: str = NORMAL
    detail: str = ""  # the start of an error response's body (problem+json), for the report
    cut: bool = False  # the connection failed (closed, reset, timed out) during the request

    @property
    def latency_s(self) -> float:
        return self.ended - self.started


@dataclass
class Totals:
    requests: int = 0
    failures: int = 0
    verified_reads: int = 0
    verified_bytes: int = 0
    wrong_bytes: int = 0
    hit_reads: int = 0
    hit_failures: int = 0
    outages: int = 0
    outage_requests: int = 0  # requests in flight at some point of an outage
    outage_unavailable: int = 0  # ... that failed with 503/504
    outage_other_failures: int = 0  # ... that failed any other way
    known_cached_chunks: int = 0  # chunks served HIT in an outage after it settled
    known_cached_reads: int = 0  # later reads of those chunks in the same outage
    known_cached_failures: int = 0
    hot_before_reads: int = 0  # outage reads of hot chunks HIT just before it began
    hot_before_failures: int = 0
    recovery_s: list[float] = field(default_factory=list)  # outage end -> first good fill
    cut_before_status: int = 0  # connections that ended, or hung, before a status line
    cut_after_head: int = 0  # answers whose head came but whose body did not
    straddle_reads: int = 0  # partly cached reads in an outage, after it settled
    straddle_unavailable: int = 0  # ... answered 503/504 before any byte
    straddle_complete: int = 0  # ... answered in full (the tail was cached after all)
    straddle_other: int = 0  # ... anything else: a cut, a wrong status
    disk_full_reads: int = 0  # data reads in flight while the disk was full
    disk_full_failures: int = 0
    failures_by: Counter[str] = field(default_factory=Counter)  # "phase: problem"


@dataclass
class OutageState:
    """What one outage taught: which chunks are known to be cached during it."""

    fault: Applied
    known: dict[tuple[str, int], float] = field(default_factory=dict)  # chunk -> HIT time
    hot_before: set[tuple[str, int]] = field(default_factory=set)
    recovered: bool = False


class Recorder:
    """Counts every result against the criteria; keeps per-interval results for the monitor."""

    def __init__(self, faults: FaultInjector) -> None:
        self.faults = faults
        self.totals = Totals()
        self.window: list[Result] = []
        self.last_hot_hit: dict[tuple[str, int], float] = {}
        self.outages: dict[float, OutageState] = {}  # by start time
        # A few examples of each kind of failure, for the report (bounded).
        self.examples: dict[str, list[str]] = {}

    def record(self, r: Result) -> None:
        t = self.totals
        r.phase = self.faults.phase_during(r.started, r.ended)
        t.requests += 1
        self.window.append(r)
        failed = r.problem is not None
        t.failures += failed
        if failed:
            key = f"{r.phase}: {r.problem}"
            t.failures_by[key] += 1
            self._example(key, r)
        if r.problem == "wrong bytes":
            t.wrong_bytes += 1
        if r.cut:
            if r.status is None:
                t.cut_before_status += 1
                self._example("cut before a status", r)
            else:
                t.cut_after_head += 1
        if r.phase == DISK_FULL and r.kind != "head":
            t.disk_full_reads += 1
            t.disk_full_failures += failed
        if r.x_cache == "HIT":
            t.hit_reads += 1
            t.hit_failures += failed
            if failed:
                self._example("X-Cache HIT but failed", r)
            elif r.kind == "hot" and r.chunk is not None:
                self.last_hot_hit[r.chunk] = r.started
        outage = self.faults.overlapping(r.started, r.ended, OUTAGE)
        if outage is not None:
            self._record_outage(r, self._outage(outage), failed)
        self._note_recovery(r, failed)

    def _outage(self, fault: Applied) -> OutageState:
        state = self.outages.get(fault.started)
        if state is None:
            # Hot chunks served HIT just before the link went down (an info figure:
            # normal fills may still have evicted them in that last moment).
            hot_before = {c for c, t in self.last_hot_hit.items()
                          if t >= fault.started - PRE_OUTAGE_S}
            state = self.outages[fault.started] = OutageState(fault, hot_before=hot_before)
            self.totals.outages += 1
        return state

    def _record_outage(self, r: Result, state: OutageState, failed: bool) -> None:
        t = self.totals
        t.outage_requests += 1
        if failed and r.status in UNAVAILABLE and r.problem == f"status {r.status}":
            t.outage_unavailable += 1
        elif failed:
            t.outage_other_failures += 1
            self._example("outage: failed other than 503/504", r, state.fault.started)
        fault = state.fault
        inside = fault.started <= r.started and (fault.ended is None or r.started <= fault.ended)
        if r.chunk is None or not inside:
            return
        if r.kind == "straddle":
            self._record_straddle(r, failed)
            return
        if r.chunk in state.hot_before:
            t.hot_before_reads += 1
            t.hot_before_failures += failed
        # While the hub is unreachable no fill can complete, so nothing may leave the
        # cache: a chunk served HIT once the outage settled is known cached, and
        # every later read of it in this outage must succeed.
        known_at = state.known.get(r.chunk)
        if known_at is not None and r.started > known_at:
            t.known_cached_reads += 1
            if failed:
                t.known_cached_failures += 1
                self._example("outage: known-cached chunk failed", r, fault.started)
        elif not failed and r.x_cache == "HIT" and r.started >= fault.started + SETTLE_S:
            state.known[r.chunk] = r.started
            t.known_cached_chunks += 1

    def _record_straddle(self, r: Result, failed: bool) -> None:
        t = self.totals
        t.straddle_reads += 1
        if not failed:
            t.straddle_complete += 1
        elif r.status in UNAVAILABLE and r.problem == f"status {r.status}":
            t.straddle_unavailable += 1
        else:
            t.straddle_other += 1
            self._example("outage: partly cached read neither 503/504 nor complete", r)

    def _note_recovery(self, r: Result, failed: bool) -> None:
        """Time from an outage's end to the first successful fill across the WAN."""
        if failed or r.x_cache != "MISS":
            return
        for state in self.outages.values():
            ended = state.fault.ended
            if not state.recovered and ended is not None and r.started >= ended:
                state.recovered = True
                self.totals.recovery_s.append(r.ended - ended)

    def _example(self, key: str, r: Result, since: float | None = None) -> None:
        examples = self.examples.setdefault(key, [])
        if len(examples) < MAX_EXAMPLES:
            at = f"+{r.started - since:.2f}s into the outage" if since else f"t={r.started:.1f}"
            examples.append(f"{at} {r.kind} {r.chunk} status={r.status} X-Cache={r.x_cache} "
                            f"{r.problem}: {r.detail}")

    def take_window(self) -> list[Result]:
        window, self.window = self.window, []
        return window


# ---------------------------------------------------------------------------- load


@dataclass
class Context:
    spoke_url: str
    session: aiohttp.ClientSession
    reference: Reference
    recorder: Recorder
    chunk_size: int
    deadline: float

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def read(self, shard: Shard, start: int, length: int, kind: str) -> None:
        """One ranged GET, checked and recorded; never raises for a failed request."""
        t0 = time.monotonic()
        status = x_cache = problem = None
        detail = ""
        cut = False
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        try:
            async with self.session.get(self._url(shard), headers=headers) as resp:
                status, x_cache = resp.status, resp.headers.get(CACHE_HEADER)
                body = await resp.read()
                problem = self._check(resp, body, shard, start, length)
                if resp.status != 206:
                    detail = body[:300].decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem, detail, cut = type(exc).__name__, str(exc)[:300], True
        self.recorder.record(Result(kind, (shard.path, start // self.chunk_size), status,
                                    x_cache, problem, t0, time.monotonic(), detail=detail,
                                    cut=cut))

    def _check(self, resp: aiohttp.ClientResponse, body: bytes, shard: Shard, start: int,
               length: int) -> str | None:
        if resp.status != 206:
            return f"status {resp.status}"
        if resp.headers.get("Content-Range") != f"bytes {start}-{start + length - 1}/{shard.size}":
            return "bad Content-Range"
        if len(body) != length:
            return "short body"
        totals = self.recorder.totals
        totals.verified_reads += 1
        totals.verified_bytes += length
        return None if self.reference.check(shard.path, start, body) else "wrong bytes"

    async def head(self, shard: Shard) -> None:
        t0 = time.monotonic()
        status = x_cache = problem = None
        cut = False
        try:
            async with self.session.head(self._url(shard)) as resp:
                status, x_cache = resp.status, resp.headers.get(CACHE_HEADER)
                if resp.status != 200:
                    problem = f"status {resp.status}"
                elif resp.headers.get("Content-Length") != str(shard.size):
                    problem = "bad Content-Length"
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem, cut = type(exc).__name__, True
        self.recorder.record(Result("head", None, status, x_cache, problem, t0,
                                    time.monotonic(), cut=cut))

    def _url(self, shard: Shard) -> str:
        return f"{self.spoke_url}/objects/{quote(shard.path)}"


async def loader(ctx: Context, shards: list[Shard], rng: random.Random,
                 head_fraction: float) -> None:
    """A data-loader worker: every sample of its shards once per epoch, shuffled."""
    while ctx.running():
        order = [(s, i) for s in shards for i in range(s.samples)]
        rng.shuffle(order)
        for shard, index in order:
            if not ctx.running():
                return
            if rng.random() < head_fraction:
                await ctx.head(shard)
            await ctx.read(shard, index * SAMPLE_BYTES, SAMPLE_BYTES, "sample")


async def sequential(ctx: Context, shards: list[Shard], first: int) -> None:
    """Chunk-aligned reads of whole chunks, shard after shard (a scan)."""
    i = first
    while ctx.running():
        shard = shards[i % len(shards)]
        for start in range(0, shard.size, ctx.chunk_size):
            if not ctx.running():
                return
            await ctx.read(shard, start, min(ctx.chunk_size, shard.size - start), "sequential")
        i += 1


async def hot(ctx: Context, chunks: list[tuple[Shard, int]], rng: random.Random) -> None:
    """Samples of a few fixed chunks, all the time: they stay cached, and are known to be."""
    per_chunk = ctx.chunk_size // SAMPLE_BYTES
    while ctx.running():
        shard, chunk = rng.choice(chunks)
        index = chunk * per_chunk + rng.randrange(per_chunk)
        if index < shard.samples:
            await ctx.read(shard, index * SAMPLE_BYTES, SAMPLE_BYTES, "hot")
        # Hot readers keep the chunks warm; they need not compete for the CPU.
        await asyncio.sleep(0.01)


async def straddler(ctx: Context, shard: Shard) -> None:
    """In outages only: reads from the end of the chunk left cached into the next one."""
    boundary = (STRADDLE_CHUNK + 1) * ctx.chunk_size
    faults = ctx.recorder.faults
    while ctx.running():
        if faults.phase_at(time.monotonic()) == OUTAGE:
            await ctx.read(shard, boundary - STRADDLE_SPAN, 2 * STRADDLE_SPAN, "straddle")
        await asyncio.sleep(STRADDLE_PAUSE_S)


async def newcomer(ctx: Context, fresh: list[Shard]) -> None:
    """While the disk is full: whole reads of objects never read before, one by one.

    The spoke must save each one's manifest, on a disk that refuses it.
    """
    unread = iter(fresh)
    faults = ctx.recorder.faults
    while ctx.running():
        if faults.phase_at(time.monotonic()) == DISK_FULL:
            shard = next(unread, None)
            if shard is None:
                return
            await ctx.read(shard, 0, shard.size, "fresh")
        await asyncio.sleep(FRESH_PAUSE_S)


async def leave_partly_cached(ctx: Context, shard: Shard) -> None:
    """Purge ``shard`` from the cache, then cache its chunk ``STRADDLE_CHUNK`` alone.

    Runs just before each outage: the straddler's reads then start in a cached
    chunk and end in one that is surely not cached (nobody else reads the shard,
    and a single read does not start read-ahead). The chunk may still be being
    stored when the link goes down; storing needs no hub. A failure here is
    recorded and the outage goes ahead: the straddler's figures then show it.
    """
    try:
        await _purge_then_cache_one_chunk(ctx, shard)
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
        ctx.recorder.totals.failures_by[f"preparing the straddle: {exc}"] += 1


async def _purge_then_cache_one_chunk(ctx: Context, shard: Shard) -> None:
    url = f"{ctx.spoke_url}/cache/{quote(shard.path)}"
    async with ctx.session.delete(url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"purging {shard.path} answered {resp.status}")
    start = STRADDLE_CHUNK * ctx.chunk_size
    headers = {"Range": f"bytes={start}-{start + ctx.chunk_size - 1}"}
    async with ctx.session.get(ctx._url(shard), headers=headers) as resp:
        await resp.read()
        if resp.status != 206:
            raise RuntimeError(f"caching {shard.path} chunk {STRADDLE_CHUNK}: {resp.status}")


def hot_chunks(shards: list[Shard], chunk_size: int, count: int) -> list[tuple[Shard, int]]:
    chunks_per_shard = max(1, shards[0].size // chunk_size)
    return [(shards[i // chunks_per_shard], i % chunks_per_shard) for i in range(count)]


# ---------------------------------------------------------------------------- monitor


@dataclass
class Sample:
    t_s: float
    phase: str
    rss_mb: float
    anon_mb: float  # the part of RSS that is the process's own memory (RssAnon)
    fds: int
    rss_floor_mb: float  # the lowest RSS seen in the interval (sampled every 0.5 s)
    fds_floor: int  # the fewest open fds seen in the interval
    fill_peak_mb: float  # the most chunk memory held by fills in the interval (/stats)
    tmp_files: int
    used_bytes: int
    disk_bytes: int
    capacity_bytes: int
    evictions: int
    requests: int
    errors: int
    hit_ratio: float  # X-Cache HIT share of data reads in the interval
    stats_hit_ratio: float  # chunk hits / lookups in the interval, from /stats
    p50_ms: float
    p99_ms: float


def count_files(path: str) -> int:
    try:
        return sum(1 for _ in os.scandir(path))
    except FileNotFoundError:
        return 0


def disk_bytes(chunks_dir: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(chunks_dir):
        for name in files:
            with suppress(FileNotFoundError):  # evicted between listing and stat
                total += os.stat(os.path.join(root, name)).st_size
    return total


def quantile_ms(values: list[float], q: float) -> float:
    return 1000 * quantile(values, q, empty=math.nan)


@dataclass
class Monitor:
    ctx: Context
    spoke: Process
    cache_dir: str
    interval_s: float
    run_started: float
    samples: list[Sample] = field(default_factory=list)
    max_used_bytes: int = 0
    max_disk_bytes: int = 0
    max_anon_mb: float = 0.0
    spoke_died: bool = False
    _prev_stats: dict[str, int] = field(default_factory=dict)
    _rss_floor: float = math.inf
    _fill_peak: float = 0.0
    _fds_floor: int = 1 << 30

    async def stats(self) -> dict[str, int]:
        async with self.ctx.session.get(f"{self.ctx.spoke_url}/stats") as resp:
            stats: dict[str, int] = await resp.json()
            return stats

    async def run(self) -> None:
        next_sample = time.monotonic() + self.interval_s
        while self.ctx.running():
            if self.spoke.proc.poll() is not None:
                self.spoke_died = True
                return
            try:
                stats = await self.stats()
            except (aiohttp.ClientError, TimeoutError) as exc:
                # /stats is local and should always answer; note it, keep watching.
                self.ctx.recorder.totals.failures_by[f"monitor: /stats {type(exc).__name__}"] += 1
                await asyncio.sleep(FAST_SAMPLE_S)
                continue
            self.max_used_bytes = max(self.max_used_bytes, stats["used_bytes"])
            self._fill_peak = max(self._fill_peak, stats["fill_buffer_bytes"] / MB)
            # RSS swings by tens of MB with the 4 MiB chunk buffers in flight; the
            # floor between swings is what a leak would lift.
            mem = memory(self.spoke.pid)
            self._rss_floor = min(self._rss_floor, mem.rss / MB)
            self.max_anon_mb = max(self.max_anon_mb, mem.anon / MB)
            self._fds_floor = min(self._fds_floor, open_fds(self.spoke.pid))
            if time.monotonic() >= next_sample:
                await self.sample(stats)
                next_sample += self.interval_s
            await asyncio.sleep(FAST_SAMPLE_S)

    async def sample(self, stats: dict[str, int]) -> Sample:
        pid = self.spoke.pid
        disk = await asyncio.to_thread(disk_bytes, os.path.join(self.cache_dir, "chunks"))
        self.max_disk_bytes = max(self.max_disk_bytes, disk)
        window = self.ctx.recorder.take_window()
        reads = [r for r in window if r.kind != "head" and r.problem is None]
        prev = self._prev_stats or {"hits": 0, "misses": 0}
        lookups = stats["hits"] - prev["hits"] + stats["misses"] - prev["misses"]
        self._prev_stats = stats
        now = time.monotonic()
        mem, fds = memory(pid), open_fds(pid)
        rss = mem.rss / MB
        sample = Sample(
            t_s=round(now - self.run_started, 1), phase=self.ctx.recorder.faults.phase_at(now),
            rss_mb=rss, anon_mb=mem.anon / MB, fds=fds,
            rss_floor_mb=min(self._rss_floor, rss), fds_floor=min(self._fds_floor, fds),
            fill_peak_mb=max(self._fill_peak, stats["fill_buffer_bytes"] / MB),
            tmp_files=count_files(os.path.join(self.cache_dir, "tmp")),
            used_bytes=stats["used_bytes"], disk_bytes=disk,
            capacity_bytes=stats["capacity_bytes"], evictions=stats["evictions"],
            requests=len(window), errors=sum(r.problem is not None for r in window),
            hit_ratio=sum(r.x_cache == "HIT" for r in reads) / len(reads) if reads else math.nan,
            stats_hit_ratio=(stats["hits"] - prev["hits"]) / lookups if lookups else math.nan,
            p50_ms=quantile_ms([r.latency_s for r in reads], 0.50),
            p99_ms=quantile_ms([r.latency_s for r in reads], 0.99),
        )
        self.samples.append(sample)
        self._rss_floor, self._fds_floor, self._fill_peak = math.inf, 1 << 30, 0.0
        print(f"t={sample.t_s:6.0f}s {sample.phase:13s} rss {sample.rss_mb:6.1f} MB "
              f"(anon {sample.anon_mb:6.1f}, fills {sample.fill_peak_mb:5.0f}) "
              f"fds {sample.fds:4d} tmp {sample.tmp_files:3d} used "
              f"{sample.used_bytes / 2**20:6.0f}/{sample.capacity_bytes / 2**20:.0f} MiB "
              f"hit {sample.hit_ratio:5.1%} p99 {sample.p99_ms:7.1f} ms "
              f"req {sample.requests:5d} err {sample.errors}", flush=True)
        return sample


# ---------------------------------------------------------------------------- the run


@dataclass
class Setup:
    hub: Process
    spoke: Process
    proxy: Any
    cache_dir: str
    reference: Reference
    capacity: int
    disk: DiskFiller | None  # fills the cache's filesystem; None: no disk-full phase
    shards: list[Shard]
    fresh: list[Shard]  # objects nobody reads until the disk is full


@contextmanager
def soak_setup(args: argparse.Namespace, log_dir: str) -> Iterator[Setup]:
    """Dataset, hub, Toxiproxy (latency), spoke; everything stopped by PID at exit."""
    with Lab(log_dir=log_dir) as lab:
        data_dir = args.data_dir or lab.temp_dir("hubspoke-soak-data-")
        hub_root = os.path.join(data_dir, "hub")
        shard_count = max(2, math.ceil(args.dataset_factor * args.capacity / args.shard_size))
        print(f"generating {shard_count} shards of {args.shard_size >> 20} MiB ...", flush=True)
        shards = generate(hub_root, shard_count, args.shard_size)
        fresh = generate(hub_root, FRESH_OBJECTS, FRESH_BYTES, prefix="fresh")
        reference = build_reference(hub_root, shards + fresh)
        cache_root = lab.temp_dir("hubspoke-soak-cache-")
        disk = None
        if args.disk_full:
            lab.enter(small_filesystem(cache_root, args.capacity + DISK_HEADROOM_BYTES))
            disk = DiskFiller(cache_root)
        cache_dir = os.path.join(cache_root, "cache")
        os.mkdir(cache_dir)
        quiet = ["--access-log", "off"]  # a line per request would fill the disk in a soak
        hub = lab.hub(hub_root, "--chunk-size", str(args.chunk_size), *quiet)
        link = lab.link(hub.url, latency_ms=args.latency_ms)
        spoke = lab.spoke(link.url, cache_dir, "--capacity", str(args.capacity), *quiet)
        yield Setup(hub, spoke, link.proxy, cache_dir, reference, args.capacity, disk,
                    shards, fresh)


async def run_load(args: argparse.Namespace, setup: Setup) -> tuple[Monitor, Context]:
    duration = args.minutes * 60
    windows = plan(duration, args.outage_s, args.disk_full_s if setup.disk else 0.0)
    faults = FaultInjector(setup.proxy, disk=setup.disk)
    print("faults: " + ", ".join(f"{w.kind} {w.start_s:.0f}-{w.end_s:.0f}s" for w in windows))
    if setup.disk is None:
        print("no disk-full phase: it needs root, to mount a tmpfs for the cache")
    users = args.users + args.sequential_users + args.hot_users
    timeout = aiohttp.ClientTimeout(total=60, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=users + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.monotonic()
        ctx = Context(setup.spoke.url, session, setup.reference, Recorder(faults),
                      args.chunk_size, started + duration)
        await _check_listing(ctx)
        monitor = Monitor(ctx, setup.spoke, setup.cache_dir, args.interval, started)
        rng = random.Random(args.seed)
        # The last shard is the straddler's alone (see leave_partly_cached).
        *shards, straddle_shard = setup.shards
        faults.before_outage = lambda: leave_partly_cached(ctx, straddle_shard)
        tasks = [loader(ctx, rng.sample(shards, min(args.shards_per_user, len(shards))),
                        random.Random(rng.random()), args.head_fraction)
                 for _ in range(args.users)]
        tasks += [sequential(ctx, shards, i * len(shards) // max(1, args.sequential_users))
                  for i in range(args.sequential_users)]
        chunks = hot_chunks(shards, args.chunk_size, args.hot_chunks)
        tasks += [hot(ctx, chunks, random.Random(rng.random())) for _ in range(args.hot_users)]
        tasks.append(straddler(ctx, straddle_shard))
        tasks.append(newcomer(ctx, setup.fresh))
        tasks += [faults.run(windows, started, ctx.deadline), monitor.run()]
        # Every task ends by the deadline; the margin covers requests in flight then.
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=duration + 120)
    return monitor, ctx


async def _check_listing(ctx: Context) -> None:
    """The spoke's /list must name the generated shards (the layout the loaders use)."""
    async with ctx.session.get(f"{ctx.spoke_url}/list/") as resp:
        listing = await resp.json()
    listed = {o["path"]: o["size"] for o in listing["objects"]}
    for shard in ctx.reference.shards:
        if listed.get(shard.path) != shard.size:
            raise RuntimeError(f"/list does not show {shard.path} of {shard.size} bytes")


def wait_for_temp_files(cache_dir: str, timeout_s: float) -> int:
    """Temp files in the cache after in-flight fills had ``timeout_s`` to finish."""
    tmp = os.path.join(cache_dir, "tmp")
    deadline = time.monotonic() + timeout_s
    while count_files(tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    return count_files(tmp)


# ---------------------------------------------------------------------------- verdict


def least_squares_slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return math.nan
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else math.nan


def second_half(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.t_s >= samples[-1].t_s / 2] if samples else []


def slope_per_min(samples: list[Sample], attr: str) -> float:
    """Least-squares slope of ``attr`` per minute over the second half, every sample."""
    return least_squares_slope([(s.t_s / 60, float(getattr(s, attr)))
                                for s in second_half(samples)])


def floor_slope_per_min(samples: list[Sample], attr: str, bucket_s: float,
                        interval_s: float) -> tuple[float, int]:
    """Slope per minute of the floor of ``attr`` (its minimum per ``bucket_s``), and
    how many buckets it was fitted on, over the second half under normal load.

    RSS swings by tens of MB with the 4 MiB chunk buffers in flight, and fds with
    the connections open; a leak lifts the floor between swings. Samples during
    faults and recoveries are left out, so an outage's quiet spell does not pass
    for a trend; a leak that faults cause still shows, as a higher floor in the
    normal spells after them. Buckets with under half their samples are dropped
    (fewer readings, a higher minimum).
    """
    floors: dict[int, list[float]] = {}
    for s in second_half(samples):
        value = float(getattr(s, attr))
        if s.phase == NORMAL and math.isfinite(value):
            floors.setdefault(int(s.t_s // bucket_s), []).append(value)
    enough = bucket_s / interval_s / 2
    points = [((k + 0.5) * bucket_s / 60, min(v)) for k, v in sorted(floors.items())
              if len(v) >= enough]
    return least_squares_slope(points), len(points)


def outage_evictions(samples: list[Sample], faults: FaultInjector, run_started: float) -> int:
    """Evictions counted while the hub was unreachable (after the settle time)."""
    total = 0
    for fault in faults.applied:
        if fault.kind != OUTAGE or fault.ended is None:
            continue
        lo, hi = fault.started + SETTLE_S - run_started, fault.ended - run_started
        inside = [s.evictions for s in samples if lo <= s.t_s <= hi]
        total += max(inside) - min(inside) if inside else 0
    return total


@dataclass
class Criterion:
    name: str
    passed: bool
    figure: str


@dataclass
class Ending:
    tmp_idle: int = 0  # temp files once the load stopped and fills settled
    tmp_after_stop: int = 0  # temp files after the spoke stopped (SIGTERM)
    spoke_exit: int | None = None


def judge(args: argparse.Namespace, monitor: Monitor, totals: Totals, ending: Ending,
          capacity: int) -> list[Criterion]:
    return [*_judge_data(totals), *_judge_faults(args, monitor, totals),
            *_judge_resources(args, monitor, ending, capacity)]


def _judge_data(totals: Totals) -> list[Criterion]:
    return [
        Criterion("no wrong bytes ever served",
                  totals.wrong_bytes == 0 and totals.verified_reads > 0,
                  f"{totals.wrong_bytes} wrong of {totals.verified_reads:,} reads verified "
                  f"({totals.verified_bytes / 1e9:.1f} GB)"),
        Criterion("a read answered X-Cache: HIT never fails",
                  totals.hit_failures == 0 and totals.hit_reads > 0,
                  f"{totals.hit_failures} failed of {totals.hit_reads:,} HIT reads"),
        Criterion("no connection cut before a status",
                  totals.cut_before_status == 0 and totals.requests > 0,
                  f"{totals.cut_before_status} of {totals.requests:,} requests "
                  f"({totals.cut_after_head} cut after their head, in any phase)"),
    ]


def _judge_faults(args: argparse.Namespace, monitor: Monitor,
                  totals: Totals) -> list[Criterion]:
    criteria = [
        Criterion("outage: reads of chunks known cached succeed",
                  totals.outages > 0 and totals.known_cached_reads > 0
                  and totals.known_cached_failures == 0,
                  f"{totals.outages} outage(s); {totals.known_cached_failures:,} failed of "
                  f"{totals.known_cached_reads:,} later reads of {totals.known_cached_chunks} "
                  f"chunks served HIT in the outage"),
        Criterion("outage: uncached reads fail only with 503/504",
                  totals.outages > 0 and totals.outage_other_failures == 0,
                  f"{totals.outage_unavailable:,} answered 503/504, "
                  f"{totals.outage_other_failures} failed otherwise, of "
                  f"{totals.outage_requests:,} requests"),
        Criterion("outage: partly cached reads get 503/504 before any byte",
                  totals.straddle_unavailable > 0 and totals.straddle_other == 0,
                  f"{totals.straddle_unavailable:,} answered 503/504, "
                  f"{totals.straddle_complete} in full, {totals.straddle_other} otherwise "
                  f"(cut or wrong), of {totals.straddle_reads:,}"),
    ]
    if args.disk_full:
        criteria.append(Criterion(
            "disk full: every read answered, correctly",
            totals.disk_full_reads > 0 and totals.disk_full_failures == 0,
            f"{totals.disk_full_failures} failed of {totals.disk_full_reads:,} reads"))
    criteria.append(Criterion(
        f"memory held under {args.rss_max_mb:g} MB throughout, faults included",
        0 < monitor.max_anon_mb < args.rss_max_mb,
        f"max anonymous RSS {monitor.max_anon_mb:.0f} MB (mapped chunk files not counted)"))
    return criteria


def _judge_resources(args: argparse.Namespace, monitor: Monitor, ending: Ending,
                     capacity: int) -> list[Criterion]:
    bucket_s = max(FLOOR_BUCKET_S, 5 * args.interval)
    rss, rss_n = floor_slope_per_min(monitor.samples, "rss_floor_mb", bucket_s, args.interval)
    fds, fds_n = floor_slope_per_min(monitor.samples, "fds_floor", bucket_s, args.interval)
    how = f"{bucket_s:g} s floors, {{}} buckets in the second half under normal load"
    if min(rss_n, fds_n) < MIN_BUCKETS:
        how += f"; under {MIN_BUCKETS}: too short a run to judge, run ≥ 5 min"
    return [
        Criterion(f"RSS flat after warm-up (< {args.rss_slope_max} MB/min)",
                  rss < args.rss_slope_max and rss_n >= MIN_BUCKETS,
                  f"slope {rss:+.2f} MB/min ({how.format(rss_n)})"),
        Criterion(f"open fds flat after warm-up (< {args.fd_slope_max} fds/min)",
                  fds < args.fd_slope_max and fds_n >= MIN_BUCKETS,
                  f"slope {fds:+.2f} fds/min ({how.format(fds_n)})"),
        Criterion("no temp files left", ending.tmp_idle == 0 and ending.tmp_after_stop == 0,
                  f"{ending.tmp_idle} once idle, {ending.tmp_after_stop} after SIGTERM"),
        Criterion("used bytes never above capacity",
                  monitor.max_used_bytes <= capacity and monitor.max_disk_bytes <= capacity,
                  f"max /stats {monitor.max_used_bytes / 2**20:.1f} MiB, on disk "
                  f"{monitor.max_disk_bytes / 2**20:.1f} MiB, capacity {capacity / 2**20:.0f} MiB"),
        Criterion("spoke stayed up and stopped cleanly",
                  not monitor.spoke_died and ending.spoke_exit == 0,
                  f"exit code {ending.spoke_exit} on SIGTERM"),
    ]


def print_table(criteria: list[Criterion]) -> None:
    width = max(len(c.name) for c in criteria)
    print(f"\n| {'criterion':{width}} | result | figure |")
    print(f"|{'-' * (width + 2)}|--------|--------|")
    for c in criteria:
        print(f"| {c.name:{width}} | {'PASS' if c.passed else 'FAIL':6} | {c.figure} |")


def print_info(totals: Totals, monitor: Monitor) -> None:
    print(f"\nrequests {totals.requests:,}, failed {totals.failures:,}; by phase and cause:")
    for key, count in sorted(totals.failures_by.items()):
        print(f"  {key}: {count:,}")
    for key, examples in sorted(monitor.ctx.recorder.examples.items()):
        if not key.endswith("status 503") and not key.endswith("status 504"):
            print(f"  e.g. {key}: " + "\n       ".join(examples[:3]))
    steady = [s for s in monitor.samples if s.phase == NORMAL and not math.isnan(s.hit_ratio)]
    if steady:
        print(f"normal-phase medians: hit ratio {_median([s.hit_ratio for s in steady]):.1%}, "
              f"p99 {_median([s.p99_ms for s in steady]):.0f} ms, "
              f"{_median([s.requests for s in steady]) / monitor.interval_s:.0f} req/s")
    faults = monitor.ctx.recorder.faults
    if monitor.samples:
        last = monitor.samples[-1]
        print(f"evictions {last.evictions:,} (of which while the hub was unreachable: "
              f"{outage_evictions(monitor.samples, faults, monitor.run_started)}); "
              f"RSS {monitor.samples[0].rss_mb:.1f} -> {last.rss_mb:.1f} MB; "
              f"fds {monitor.samples[0].fds} -> {last.fds}")
        print(f"raw least-squares slopes over the second half (every sample): RSS "
              f"{slope_per_min(monitor.samples, 'rss_mb'):+.2f} MB/min, "
              f"fds {slope_per_min(monitor.samples, 'fds'):+.2f} fds/min")
    print(f"outages: hot chunks HIT < {PRE_OUTAGE_S:g} s before one began, then read in it: "
          f"{totals.hot_before_failures:,} failed of {totals.hot_before_reads:,}; first good "
          f"fill after the link came back: "
          + (", ".join(f"{s:.1f} s" for s in totals.recovery_s) or "-"))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else math.nan


# ---------------------------------------------------------------------------- outputs


def write_csv(path: str, samples: list[Sample]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(Sample.__dataclass_fields__))
        writer.writeheader()
        for s in samples:
            writer.writerow(asdict(s))


FAULT_COLOURS = {"latency_spike": "tab:orange", "reset_peer": "tab:purple", "outage": "tab:red",
                 "disk_full": "tab:brown"}


def plot(path: str, samples: list[Sample], faults: FaultInjector, run_started: float) -> None:
    """Five panels over time, fault windows shaded; written as a PNG (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")  # must precede pyplot
    import matplotlib.pyplot as plt

    t = [s.t_s for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(11, 13), sharex=True)
    for draw, ax in zip((_plot_memory, _plot_bytes, _plot_hits, _plot_latency, _plot_errors),
                        axes, strict=True):
        draw(ax, t, samples)
    for fault in faults.applied:
        end = fault.ended if fault.ended is not None else fault.started
        for ax in axes:
            ax.axvspan(fault.started - run_started, end - run_started, alpha=0.15,
                       color=FAULT_COLOURS.get(fault.kind, "grey"))
    axes[0].set_title("hubspoke soak; shaded: " + ", ".join(
        f"{kind} ({colour.removeprefix('tab:')})" for kind, colour in FAULT_COLOURS.items()))
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_memory(ax: Any, t: list[float], samples: list[Sample]) -> None:
    ax.plot(t, [s.rss_mb for s in samples], label="RSS", color="tab:blue", alpha=0.4)
    ax.plot(t, [s.rss_floor_mb for s in samples], label="RSS floor", color="tab:blue")
    ax.plot(t, [s.anon_mb for s in samples], label="anonymous RSS", color="tab:cyan")
    ax.set_ylabel("spoke RSS MB")
    ax.legend(loc="lower left")
    fds = ax.twinx()
    fds.plot(t, [s.fds for s in samples], color="tab:green", alpha=0.4)
    fds.plot(t, [s.fds_floor for s in samples], color="tab:green", label="open fds (floor)")
    fds.set_ylabel("open fds")
    fds.legend(loc="lower right")


def _plot_bytes(ax: Any, t: list[float], samples: list[Sample]) -> None:
    ax.plot(t, [s.used_bytes / 2**20 for s in samples], label="used (/stats)")
    ax.plot(t, [s.disk_bytes / 2**20 for s in samples], label="on disk", linestyle=":")
    ax.plot(t, [s.capacity_bytes / 2**20 for s in samples], label="capacity", color="black")
    ax.set_ylabel("MiB")
    ax.legend(loc="lower right")


def _plot_hits(ax: Any, t: list[float], samples: list[Sample]) -> None:
    ax.plot(t, [s.hit_ratio for s in samples], label="X-Cache HIT share of good reads")
    ax.plot(t, [s.stats_hit_ratio for s in samples], label="chunk hit ratio (/stats)")
    ax.set_ylabel("hit ratio")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")


def _plot_latency(ax: Any, t: list[float], samples: list[Sample]) -> None:
    ax.plot(t, [s.p50_ms for s in samples], label="p50")
    ax.plot(t, [s.p99_ms for s in samples], label="p99")
    ax.set_yscale("log")
    ax.set_ylabel("read latency ms")
    ax.legend(loc="upper right")


def _plot_errors(ax: Any, t: list[float], samples: list[Sample]) -> None:
    ax.plot(t, [s.errors for s in samples], label="failed requests", color="tab:red")
    ax.plot(t, [s.tmp_files for s in samples], label="temp files", color="tab:gray")
    ax.set_yscale("symlog")
    ax.set_ylabel("count per sample")
    ax.legend(loc="upper right")


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    ending = Ending()
    with soak_setup(args, log_dir) as setup:
        print(f"hub {setup.hub.url} -> toxiproxy ({args.latency_ms} ms) -> spoke "
              f"{setup.spoke.url} (pid {setup.spoke.pid}), capacity "
              f"{setup.capacity >> 20} MiB, dataset "
              f"{sum(s.size for s in setup.reference.shards) >> 20} MiB; "
              f"{args.minutes:g} min", flush=True)
        monitor, ctx = asyncio.run(run_load(args, setup))
        ending.tmp_idle = wait_for_temp_files(setup.cache_dir, QUIESCE_S)
        ending.spoke_exit = setup.spoke.stop(signal.SIGTERM)
        ending.tmp_after_stop = count_files(os.path.join(setup.cache_dir, "tmp"))
        capacity = setup.capacity
    totals = ctx.recorder.totals
    write_csv(os.path.join(out, "soak.csv"), monitor.samples)
    plot(os.path.join(out, "soak.png"), monitor.samples, ctx.recorder.faults, monitor.run_started)
    criteria = judge(args, monitor, totals, ending, capacity)
    print_info(totals, monitor)
    print_table(criteria)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"criteria": [asdict(c) for c in criteria],
                   "totals": {**asdict(totals), "failures_by": dict(totals.failures_by)},
                   "failure_examples": ctx.recorder.examples,
                   "faults": [asdict(a) for a in ctx.recorder.faults.applied]}, f, indent=2)
    print(f"\nwrote {out}/soak.csv, {out}/soak.png, {out}/summary.json; logs in {log_dir}")
    return 0 if all(c.passed for c in criteria) else 1


if __name__ == "__main__":
    sys.exit(main())
