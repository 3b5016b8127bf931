"""Shuffled training epochs next to a one-pass scan, through a real spoke, per policy.

    python -m loadtest.scan_epochs [--policies lru,arc,s3fifo,wtinylfu --epochs 6
        --train-chunks 256 --chunk-size 1MiB --cache-fraction 1.1 --scan-ratio 1]

The end-to-end check of :mod:`loadtest.simulate`'s trace (b) ("epochs + scan"): a hub
and, per eviction policy, a fresh spoke with an empty cache of ``--cache-fraction`` of
the training set. A training job reads every training chunk once per epoch, in a fresh
seeded shuffle; next to it a scan job reads ``--scan-ratio`` never-read chunks of other
data per training read (one pass overall: the scan dataset is epochs x ratio x the
training set). Every read is an HTTP range read of one whole chunk. The training job's
hits are counted per request from ``X-Cache`` (HIT; MISS and PARTIAL are misses), the
hub bytes per epoch from the spoke's ``GET /stats``. The same trace is replayed through
the simulator (the spoke's own policy classes, and OPT), so each measured row has its
prediction next to it.

The interleave is deterministic and is the simulator's: the training order is
:func:`loadtest.simulate.shuffled_epochs` with ``--seed``, and after the i-th training
read come scan reads up to round((i + 1) x ratio) in all (ratio 1 is exactly
:func:`loadtest.simulate.with_scan`). With ``--workers 1`` (the default) the reads go one
at a time in that order, and after a miss the next read waits until the spoke has stored
what it fetched (a spoke's answer ends before that), so the spoke sees the trace exactly
as the simulator replays it, and a run
repeats (the spoke runs with a fixed ``PYTHONHASHSEED``, which W-TinyLFU's sketch
hashes with). With ``--workers N`` N readers take the next read of the same order
concurrently: closer to a real loader, and the order the spoke sees is then only
nearly the trace's; also, fills in flight then hold room the policy does not see yet
(the cache evicts for them before they are inserted), which the simulator does not
model. The spoke's sequential read-ahead is off by default (``--seq-readahead``): the
scan reads each shard chunk by chunk, which would trigger it, and chunks it prefetches
are inserted, then hit once, which the simulator does not model. Epochs are separated by
a barrier (the /stats reads).

Every answer must be a 206 of the chunk's length, and every ``--verify-every``-th body
is compared with the generated file; the exit status is 1 if any read failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from loadtest.dataset import SAMPLE_BYTES, generate
from loadtest.lab import Lab
from loadtest.simulate import Req, Result, opt, policy_factories, shuffled_epochs, simulate
from protocol.headers import CACHE_HEADER
from protocol.sizes import format_size
from service.cli import positive, size_arg
from spoke.policy import POLICY_NAMES

TRAIN, SCAN = "train", "scan"


@dataclass(frozen=True)
class Geometry:
    """The workload: the training set, the epochs, the scan and the cache."""

    train_chunks: int = 256
    chunk_size: int = 1 << 20
    shard_chunks: int = 16
    epochs: int = 6
    scan_ratio: float = 1.0
    cache_fraction: float = 1.1
    seed: int = 1

    @property
    def train_bytes(self) -> int:
        return self.train_chunks * self.chunk_size

    @property
    def capacity(self) -> int:
        return int(self.train_bytes * self.cache_fraction)

    @property
    def scan_chunks(self) -> int:
        return round(self.train_chunks * self.epochs * self.scan_ratio)


@dataclass(frozen=True, slots=True)
class Read:
    """One whole-chunk range read of the trace; ``key`` is its key in the simulator."""

    job: str  # TRAIN or SCAN
    epoch: int  # 1-based: the training epoch the read falls in
    key: int  # training chunk i is i; scan chunk j is train_chunks + j
    path: str
    offset: int
    length: int


@dataclass
class Epoch:
    """What one epoch did through a spoke: per-request X-Cache counts and /stats deltas."""

    epoch: int
    train_reads: int = 0
    train_hits: int = 0
    train_partial: int = 0
    scan_reads: int = 0
    scan_hits: int = 0
    hub_bytes: int = 0
    evictions: int = 0
    stats_hits: int = 0
    stats_misses: int = 0
    errors: int = 0
    verified: int = 0
    seconds: float = 0.0

    @property
    def train_hit_ratio(self) -> float:
        return self.train_hits / self.train_reads if self.train_reads else 0.0


@dataclass
class Predicted:
    """The simulator's figures for the same trace, per epoch."""

    train_hit_ratio: list[float] = field(default_factory=list)
    hub_bytes: list[int] = field(default_factory=list)


def build_trace(geometry: Geometry, train_paths: Sequence[str],
                scan_paths: Sequence[str]) -> list[Read]:
    """The reads in order: training epochs, each training read followed by its scan reads."""
    n, per_shard, size = geometry.train_chunks, geometry.shard_chunks, geometry.chunk_size
    training = shuffled_epochs(n, geometry.epochs, seed=geometry.seed, label_epochs=True)
    trace: list[Read] = []
    scanned = 0
    for position, request in enumerate(training):
        key = request.key
        assert isinstance(key, int)
        epoch = int(request.job.partition("@")[2])
        trace.append(Read(TRAIN, epoch, key, train_paths[key // per_shard],
                          (key % per_shard) * size, size))
        due = min(geometry.scan_chunks, round((position + 1) * geometry.scan_ratio))
        while scanned < due:
            trace.append(Read(SCAN, epoch, n + scanned, scan_paths[scanned // per_shard],
                              (scanned % per_shard) * size, size))
            scanned += 1
    return trace


def _epoch_slices(trace: Sequence[Read]) -> list[list[Read]]:
    epochs: dict[int, list[Read]] = {}
    for read in trace:
        epochs.setdefault(read.epoch, []).append(read)
    return [epochs[e] for e in sorted(epochs)]


def predict(trace: Sequence[Read], geometry: Geometry,
            names: Sequence[str]) -> dict[str, Predicted]:
    """The simulator on the same trace: each policy in ``names``, and ``opt``."""
    requests = [Req(read.key, read.length, f"{read.job}@{read.epoch}") for read in trace]
    factories = policy_factories()
    results: dict[str, Result] = {
        name: simulate(factories[name], requests, geometry.capacity) for name in names
    }
    results["opt"] = opt(requests, geometry.capacity)
    predicted: dict[str, Predicted] = {}
    for name, result in results.items():
        rows = Predicted()
        for epoch in range(1, geometry.epochs + 1):
            parts = [result.jobs.get(f"{job}@{epoch}") for job in (TRAIN, SCAN)]
            train = parts[0]
            rows.train_hit_ratio.append(train.hit_ratio if train else 0.0)
            rows.hub_bytes.append(sum(p.total_bytes - p.hit_bytes for p in parts if p))
        predicted[name] = rows
    return predicted


async def _stats(http: aiohttp.ClientSession, spoke: str) -> dict[str, Any]:
    async with http.get(f"{spoke}/stats") as resp:
        resp.raise_for_status()
        stats: dict[str, Any] = await resp.json()
        return stats


async def _settled(http: aiohttp.ClientSession, spoke: str) -> None:
    """Until the spoke fetches and stores nothing: its policy has seen every insert."""
    while True:
        stats = await _stats(http, spoke)
        if stats["hub_fetches_in_flight"] == 0 and stats["chunks_storing"] == 0:
            return
        await asyncio.sleep(0.002)


def _source(root: str, read: Read) -> bytes:
    with open(os.path.join(root, read.path), "rb") as f:
        f.seek(read.offset)
        return f.read(read.length)


async def _read(http: aiohttp.ClientSession, spoke: str, read: Read) -> tuple[str, bytes | None]:
    """(X-Cache, body); body None when the answer was not a 206 of the chunk's length."""
    headers = {"Range": f"bytes={read.offset}-{read.offset + read.length - 1}"}
    try:
        async with http.get(f"{spoke}/objects/{read.path}", headers=headers) as resp:
            body = await resp.read()
            x_cache = resp.headers.get(CACHE_HEADER, "")
            ok = resp.status == 206 and len(body) == read.length
            return x_cache, body if ok else None
    except (aiohttp.ClientError, TimeoutError):
        return "ERROR", None


async def run_epochs(spoke: str, trace: Sequence[Read], root: str, workers: int,
                     verify_every: int) -> list[Epoch]:
    """Read ``trace`` through ``spoke``, epoch by epoch; X-Cache counts and /stats deltas."""
    rows: list[Epoch] = []
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=workers + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        position = 0
        for reads in _epoch_slices(trace):
            row = Epoch(reads[0].epoch)
            before = await _stats(http, spoke)
            started = time.perf_counter()
            jobs = iter(enumerate(reads, position))
            position += len(reads)

            async def worker(row: Epoch = row, jobs: Iterator[tuple[int, Read]] = jobs) -> None:
                for index, read in jobs:
                    x_cache, body = await _read(http, spoke, read)
                    hit = x_cache == "HIT"
                    if workers == 1 and not hit:
                        await _settled(http, spoke)  # exact replay: inserted before the next
                    if read.job == TRAIN:
                        row.train_reads += 1
                        row.train_hits += hit
                        row.train_partial += x_cache == "PARTIAL"
                    else:
                        row.scan_reads += 1
                        row.scan_hits += hit
                    if body is not None and index % verify_every == 0:
                        if body != _source(root, read):
                            body = None
                        else:
                            row.verified += 1
                    row.errors += body is None

            await asyncio.gather(*(worker() for _ in range(workers)))
            row.seconds = time.perf_counter() - started
            after = await _stats(http, spoke)
            row.hub_bytes = after["hub_bytes"] - before["hub_bytes"]
            row.evictions = after["evictions"] - before["evictions"]
            row.stats_hits = after["hits"] - before["hits"]
            row.stats_misses = after["misses"] - before["misses"]
            rows.append(row)
    return rows


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, for the children started inside."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def report(geometry: Geometry, workers: int, measured: dict[str, list[Epoch]],
           predicted: dict[str, Predicted]) -> str:
    """The Markdown tables: training hit % per epoch, then hub MB per epoch."""
    e = geometry.epochs
    order = "1 reader, in trace order" if workers == 1 else f"{workers} concurrent readers"
    lines = [
        f"{geometry.train_chunks} training chunks x {format_size(geometry.chunk_size)} "
        f"({format_size(geometry.train_bytes)}) read in {e} shuffled epochs (seed "
        f"{geometry.seed}); a one-pass scan of {geometry.scan_chunks} other chunks "
        f"({geometry.scan_ratio:g} per training read); cache "
        f"{100 * geometry.cache_fraction:.0f} % of the training set "
        f"({format_size(geometry.capacity)}, {geometry.capacity // geometry.chunk_size} "
        f"chunks); {order}.",
        "",
        "Training job's hit % per epoch (spoke: X-Cache HIT; sim: loadtest.simulate on the "
        "same trace):",
        "",
        "| policy | run | " + " | ".join(f"e{i}" for i in range(1, e + 1))
        + f" | mean e2..e{e} | of OPT |",
        "|---|---|" + "---:|" * (e + 2),
    ]
    best = _mean(predicted["opt"].train_hit_ratio[1:])

    def hit_row(name: str, run: str, ratios: Sequence[float]) -> str:
        mean = _mean(ratios[1:])
        share = f"{100 * mean / best:.0f} %" if best > 0 else "-"
        cells = " | ".join(_pct(r) for r in ratios)
        return f"| {name} | {run} | {cells} | {_pct(mean)} | {share} |"

    for name, rows in measured.items():
        lines.append(hit_row(name, "spoke", [r.train_hit_ratio for r in rows]))
        lines.append(hit_row(name, "sim", predicted[name].train_hit_ratio))
    lines.append(hit_row("opt", "sim", predicted["opt"].train_hit_ratio))
    lines += [
        "",
        "Hub MB per epoch, both jobs (spoke: /stats hub_bytes deltas; sim: misses x chunk "
        "size):",
        "",
        "| policy | run | " + " | ".join(f"e{i}" for i in range(1, e + 1)) + " | total |",
        "|---|---|" + "---:|" * (e + 1),
    ]

    def mb_row(name: str, run: str, values: Sequence[int]) -> str:
        cells = " | ".join(f"{v / 1e6:,.1f}" for v in values)
        return f"| {name} | {run} | {cells} | {sum(values) / 1e6:,.1f} |"

    for name, rows in measured.items():
        lines.append(mb_row(name, "spoke", [r.hub_bytes for r in rows]))
        lines.append(mb_row(name, "sim", predicted[name].hub_bytes))
    lines.append(mb_row("opt", "sim", predicted["opt"].hub_bytes))
    reads = sum(r.train_reads + r.scan_reads for rows in measured.values() for r in rows)
    errors = sum(r.errors for rows in measured.values() for r in rows)
    verified = sum(r.verified for rows in measured.values() for r in rows)
    partial = sum(r.train_partial for rows in measured.values() for r in rows)
    seconds = {name: sum(r.seconds for r in rows) for name, rows in measured.items()}
    timing = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
    lines += [
        "",
        f"{reads} reads, {errors} failed, {verified} bodies compared with the data: all equal"
        if not errors else f"{reads} reads, {errors} FAILED (wrong status, length or bytes)",
        f"training reads answered PARTIAL: {partial}; reading took {timing}",
    ]
    return "\n".join(lines)


def _policies(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.scan_epochs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="demo-data",
                        help="where the generated datasets are kept (reused across runs)")
    parser.add_argument("--policies", type=_policies, default=["lru", "arc", "s3fifo", "wtinylfu"])
    parser.add_argument("--train-chunks", type=positive(int), default=256,
                        help="chunks in the training set")
    parser.add_argument("--chunk-size", type=positive(size_arg), default=1 << 20)
    parser.add_argument("--shard-chunks", type=positive(int), default=16,
                        help="chunks per generated shard file")
    parser.add_argument("--epochs", type=positive(int), default=6)
    parser.add_argument("--scan-ratio", type=float, default=1.0,
                        help="scan chunks per training read (per epoch: ratio x training set)")
    parser.add_argument("--cache-fraction", type=positive(float), default=1.1,
                        help="spoke capacity as a fraction of the training set")
    parser.add_argument("--seed", type=int, default=1, help="seed of the epochs' shuffles")
    parser.add_argument("--workers", type=positive(int), default=1,
                        help="concurrent readers (1: the trace's exact order, deterministic)")
    parser.add_argument("--seq-readahead", type=int, default=0,
                        help="the spoke's --seq-readahead (0: off, as in the simulator)")
    parser.add_argument("--verify-every", type=positive(int), default=1,
                        help="compare every N-th body with the data")
    parser.add_argument("--hash-seed", default="0", help="PYTHONHASHSEED of the servers")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.chunk_size % SAMPLE_BYTES or args.scan_ratio < 0:
        parser.error(f"--chunk-size must be a multiple of {SAMPLE_BYTES} bytes and "
                     "--scan-ratio >= 0")
    geometry = Geometry(args.train_chunks, args.chunk_size, args.shard_chunks, args.epochs,
                        args.scan_ratio, args.cache_fraction, args.seed)
    root = os.path.join(args.data_dir, "scan-epochs")
    shard_bytes = geometry.shard_chunks * geometry.chunk_size
    train = generate(root, -(-geometry.train_chunks // geometry.shard_chunks), shard_bytes,
                     prefix=TRAIN, seed=1001)
    scan = generate(root, -(-geometry.scan_chunks // geometry.shard_chunks), shard_bytes,
                    prefix=SCAN, seed=2002)
    trace = build_trace(geometry, [s.path for s in train], [s.path for s in scan])
    predicted = predict(trace, geometry, args.policies)
    measured: dict[str, list[Epoch]] = {}
    with Lab() as lab:
        work = lab.temp_dir("hubspoke-scan-epochs-")
        lab.log_dir = work
        with _environment(PYTHONHASHSEED=str(args.hash_seed)):
            hub = lab.hub(root, "--chunk-size", str(geometry.chunk_size),
                          "--access-log", "off", "--log-level", "warning")
        for name in args.policies:
            with _environment(PYTHONHASHSEED=str(args.hash_seed)):
                spoke = lab.spoke(hub.url, os.path.join(work, name),
                                  "--capacity", str(geometry.capacity), "--policy", name,
                                  "--seq-readahead", str(args.seq_readahead),
                                  "--access-log", "off", "--log-level", "warning")
            try:
                measured[name] = asyncio.run(run_epochs(
                    spoke.url, trace, root, args.workers, args.verify_every))
                if any(r.errors for r in measured[name]):
                    tail = "\n".join(spoke.log[-20:])
                    print(f"{name}: reads failed; the spoke's log ends:\n{tail}", file=sys.stderr)
            finally:
                lab.stop(spoke)
            shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    print(report(geometry, args.workers, measured, predicted))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({
                "geometry": asdict(geometry),
                "workers": args.workers,
                "measured": {name: [asdict(r) for r in rows] for name, rows in measured.items()},
                "predicted": {name: asdict(p) for name, p in predicted.items()},
            }, f, indent=1)
    errors = sum(r.errors for rows in measured.values() for r in rows)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
