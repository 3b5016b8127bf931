"""The seed's training experiment: DataLoaders of R ranks through a spoke over a WAN.

    python -m loadtest.training [--quick] --out DIR

A hub over a generated dataset of 4096-token samples (16 KiB, in shard files), a
Toxiproxy link (60 ms and a bandwidth cap per connection), and one cold spoke per
phase. R rank processes each run a DataLoader (``num_workers`` processes, batch 24)
and a fixed step (a sleep standing in for the GPU), each epoch started together.
Each rank makes its dataset, its sampler and its loader, then sleeps ``--setup-ms``
(0 by default; standing in for building the model, which real jobs do between
making the loader and the first step), in every phase alike; the epoch's clock
starts at the loader's first ask for indices.

Phases:

- ``local``: the same loop over the same shard files read from the local disk
  (``os.pread``, page cache warm), no network: the compute-bound reference;
- ``plan``: a cold spoke that holds the whole dataset, :class:`PlannedSampler`;
  epoch 0 is ``cold``, epoch 1 ``warm`` (same loaders, same spoke);
- ``noplan``: the same with ``DistributedSampler(shuffle=True)``;
- ``plan_shard_aware``: as ``plan``, with ``PlannedSampler(shard_aware=True)``;
- ``shard_aware``: a spoke holding half the dataset (the dataset is twice the cache),
  ``PlannedSampler(shard_aware=True)``, beside ``uniform`` (a plain permutation with a
  plan) and, but in ``--quick``, ``noplan`` (``DistributedSampler``) on other such
  spokes: the chunk hit ratio each keeps;
- ``half_cache``: the done-means check, on a second hub whose chunk is one sample:
  ``PlannedSampler`` with the cache at half the dataset, hub bytes per epoch.

Writes ``DIR/summary.json`` (per phase and epoch: samples/s, util = step time over
wall time, read p50/p99, chunk hit ratio, hub egress, the batch from which the epoch
is steady, the time a rank waited for its first batch and for all the others; for the
first epoch, the time from making the sampler to the clock's start) and
``DIR/timeline.png`` (per batch, cold to warm). Everything listens on 127.0.0.1 and
every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from multiprocessing.synchronize import Barrier
from typing import Any

import requests
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from loadtest.dataset import SAMPLE_BYTES, TOKENS_PER_SAMPLE, generate
from loadtest.lab import Lab
from loadtest.quantiles import quantile
from protocol.sizes import parse_size
from spoke.client.torch_dataset import PlannedSampler, ShardedSamples

BATCH = 24
STEADY_WINDOW = 10  # batches: steady when every such run of them averages STEADY_UTIL
STEADY_UTIL = 0.9
READ_WINDOW = 10  # batches whose reads make a point of the plot's read percentiles


@dataclass(frozen=True)
class Setup:
    ranks: int
    workers: int
    step_s: float
    dataset_bytes: int
    shard_bytes: int
    chunk_size: int
    latency_ms: int
    bandwidth_kb_s: int
    half_cache_bytes: int  # the one-chunk-sample dataset of the half-cache check
    half_cache_epochs: int
    window: int  # shard-aware window, in chunks
    # The job's setup between making its loader and its first epoch (a sleep standing
    # in for building the model, as the step's does for the GPU); every phase has it.
    setup_s: float = 0.0
    # Samplers on the dataset twice the cache: "noplan" (a plain shuffle) adds a phase.
    twice: tuple[str, ...] = ("shard_aware", "uniform", "noplan")


FULL = Setup(ranks=4, workers=2, step_s=0.12, dataset_bytes=256 << 20, shard_bytes=32 << 20,
             chunk_size=1 << 20, latency_ms=60, bandwidth_kb_s=25_000,
             half_cache_bytes=32 << 20, half_cache_epochs=4, window=8)
QUICK = Setup(ranks=2, workers=2, step_s=0.12, dataset_bytes=48 << 20, shard_bytes=8 << 20,
              chunk_size=1 << 20, latency_ms=60, bandwidth_kb_s=25_000,
              half_cache_bytes=12 << 20, half_cache_epochs=3, window=4,
              twice=("shard_aware", "uniform"))


# --------------------------------------------------------------------------- the ranks


class LocalSamples(Dataset[tuple[torch.Tensor, float]]):
    """The local reference: sample ``i`` of the same shard files, read with ``pread``."""

    def __init__(self, root: str, paths: Sequence[str]) -> None:
        self.files = [os.path.join(root, p) for p in paths]
        counts = [os.path.getsize(f) // SAMPLE_BYTES for f in self.files]
        self.starts = [0]
        for count in counts:
            self.starts.append(self.starts[-1] + count)
        self._fds: dict[str, int] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, float]]:
        started = time.perf_counter()
        out = []
        for index in indices:
            shard = bisect.bisect_right(self.starts, index) - 1
            path = self.files[shard]
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            data = os.pread(fd, SAMPLE_BYTES, (index - self.starts[shard]) * SAMPLE_BYTES)
            out.append(torch.frombuffer(bytearray(data), dtype=torch.int32).to(torch.int64))
        took = time.perf_counter() - started
        return [(t, took) for t in out]


class TimedSamples(ShardedSamples):
    """ShardedSamples whose batches say how long their reads took (in the worker)."""

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, float]]:  # type: ignore[override]
        started = time.perf_counter()
        out = super().__getitems__(indices)
        took = time.perf_counter() - started
        return [(t, took) for t in out]


class Gate(Sampler[int]):
    """Holds each epoch's first index until every rank is there, and notes the time.

    The loader asks for its first indices once its workers are started, so the epoch's
    clock starts with workers starting (their start-up is inside it, as for the local
    phase), after the rank's setup; a :class:`PlannedSampler` inside booked its first
    plan when it was made, before the loader and the setup.
    """

    def __init__(self, inner: Sampler[int], barrier: Barrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.started = 0.0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[int]:
        self.barrier.wait()
        self.started = time.time()
        yield from self.inner


def collate(items: list[tuple[torch.Tensor, float]]) -> tuple[torch.Tensor, float]:
    return torch.stack([t for t, _ in items]), items[0][1]


@dataclass(frozen=True)
class RankJob:
    phase: str
    rank: int
    ranks: int
    workers: int
    step_s: float
    epochs: int
    source: str  # a spoke URL, or "local:" + the dataset root
    paths: tuple[str, ...]
    sampler: str  # "plan", "shard_aware" or "shuffle"
    seed: int
    window: int
    chunk_size: int
    setup_s: float
    out: str


def run_rank(job: RankJob, barrier: Barrier) -> None:
    """One rank: a DataLoader over the dataset and a fixed step per batch, each epoch
    started with the other ranks; writes its batches to ``job.out``."""
    torch.set_num_threads(1)
    dataset: Dataset[Any]
    sampler: Sampler[int]
    if job.source.startswith("local:"):
        dataset = LocalSamples(job.source.removeprefix("local:"), job.paths)
    else:
        dataset = TimedSamples(job.source, paths=list(job.paths))
    if job.sampler == "shuffle" or isinstance(dataset, LocalSamples):
        sampler = DistributedSampler(dataset, num_replicas=job.ranks, rank=job.rank,
                                     shuffle=True, seed=job.seed)
    else:
        assert isinstance(dataset, ShardedSamples)
        sampler = PlannedSampler(dataset, seed=job.seed, rank=job.rank, world_size=job.ranks,
                                 shard_aware=job.sampler == "shard_aware", window=job.window,
                                 chunk_size=job.chunk_size, job=f"training-{job.phase}")
    made = time.time()  # a PlannedSampler has booked epoch 0's plan by now
    gate = Gate(sampler, barrier)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=gate, num_workers=job.workers,
                        persistent_workers=job.workers > 0, collate_fn=collate)
    time.sleep(job.setup_s)  # the model
    batches: list[dict[str, float]] = []
    epochs: list[dict[str, float]] = []
    for epoch in range(job.epochs):
        gate.set_epoch(epoch)
        start = last = 0.0
        # Workers come up (in the first epoch) before the gate opens on their first ask.
        for i, (batch, read_s) in enumerate(loader):
            got = time.time()
            if i == 0:
                start = last = gate.started
            time.sleep(job.step_s)  # the GPU
            end = time.time()
            batches.append({"epoch": epoch, "batch": i, "end": end, "wall_s": end - last,
                            "wait_s": got - last, "step_s": end - got, "read_s": read_s,
                            "samples": float(batch.shape[0])})
            last = end
        epochs.append({"epoch": epoch, "start": start, "end": last})
    with open(job.out, "w") as f:
        json.dump({"batches": batches, "epochs": epochs, "sampler_made": made}, f)


# --------------------------------------------------------------------------- measuring


class StatsPoller:
    """``/stats`` of a spoke every ``period_s`` in a thread, with the time of each."""

    def __init__(self, url: str | None, period_s: float = 0.05) -> None:
        self.url = url
        self.period_s = period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatsPoller:
        if self.url is not None:
            self._poll()
        return self

    def start(self) -> None:
        if self.url is not None:
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        if self.url is not None:
            self._stop.set()
            self._thread.join()
            self._poll()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._poll()

    def _poll(self) -> None:
        doc = requests.get(f"{self.url}/stats", timeout=30).json()
        self.samples.append((time.time(), doc))

    def at(self, when: float, key: str) -> float:
        """``key`` as of the last poll at or before ``when``."""
        if not self.samples:
            return 0.0
        i = bisect.bisect_right([t for t, _ in self.samples], when) - 1
        return float(self.samples[max(0, i)][1].get(key, 0))

    def between(self, start: float, end: float) -> dict[str, float]:
        hits = self.at(end, "hits") - self.at(start, "hits")
        lookups = hits + self.at(end, "misses") - self.at(start, "misses")
        return {"hub_bytes": self.at(end, "hub_bytes") - self.at(start, "hub_bytes"),
                "hit_ratio": hits / lookups if lookups else 1.0}


def hub_bytes_sent(hub_url: str) -> int:
    for line in requests.get(f"{hub_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("hub_bytes_sent_total"):
            return int(float(line.split()[-1]))
    raise RuntimeError(f"{hub_url}/metrics has no hub_bytes_sent_total")


def steady_from(batches: list[dict[str, float]]) -> int:
    """The first batch from which every run of ``STEADY_WINDOW`` batches averages a
    utilisation of ``STEADY_UTIL`` or better (one slow batch on a shared machine is
    noise; a run of them is a stall)."""
    utils = [b["step_s"] / b["wall_s"] for b in batches]
    steady = len(utils)
    for i in range(len(utils) - STEADY_WINDOW, -1, -1):
        if statistics.fmean(utils[i:i + STEADY_WINDOW]) < STEADY_UTIL:
            break
        steady = i
    return steady


def summarise(ranks: list[dict[str, Any]], poller: StatsPoller) -> list[dict[str, Any]]:
    """Per epoch: figures over all ranks, and the per-batch timeline (batch i of every rank)."""
    out = []
    for epoch in range(len(ranks[0]["epochs"])):
        spans = [r["epochs"][epoch] for r in ranks]
        start = min(s["start"] for s in spans)
        end = max(s["end"] for s in spans)
        per_rank = [[b for b in r["batches"] if b["epoch"] == epoch] for r in ranks]
        samples = sum(b["samples"] for bs in per_rank for b in bs)
        step = [sum(b["step_s"] for b in bs) for bs in per_rank]
        walls = [s["end"] - s["start"] for s in spans]
        reads = [b["read_s"] for bs in per_rank for b in bs]
        timeline = []
        previous_end = start
        for i in range(min(len(bs) for bs in per_rank)):
            row = [bs[i] for bs in per_rank]
            batch_end = max(b["end"] for b in row)
            wall = statistics.fmean(b["wall_s"] for b in row)
            timeline.append({
                "batch": i,
                "samples_per_s": sum(b["samples"] for b in row) / wall,
                "util": statistics.fmean(b["step_s"] / b["wall_s"] for b in row),
                "read_ms": [1000 * b["read_s"] for b in row],
                **poller.between(previous_end, batch_end),
            })
            previous_end = batch_end
        steady = max(steady_from(bs) for bs in per_rank)
        # Where a cold epoch loses: its first batch (the loader's first reads want most
        # of a uniformly shuffled plan at once), or the batches after.
        waits = [[b["wait_s"] for b in bs] for bs in per_rank]
        out.append({
            "samples_per_s": samples / (end - start),
            "util": statistics.fmean(s / w for s, w in zip(step, walls, strict=True)),
            "first_batch_wait_s": statistics.fmean(w[0] for w in waits if w),
            "later_batches_wait_s": statistics.fmean(sum(w[1:]) for w in waits),
            "read_p50_ms": 1000 * quantile(reads, 0.50),
            "read_p99_ms": 1000 * quantile(reads, 0.99),
            "steady_from_batch": steady,
            # From making the sampler to the epoch's clock starting (the loader's first
            # ask, workers up): the head start a plan booked at construction gets.
            **({"sampler_to_start_s": statistics.fmean(
                s["start"] - r["sampler_made"] for s, r in zip(spans, ranks, strict=True))}
               if epoch == 0 else {}),
            "batches": min(len(bs) for bs in per_rank),
            **poller.between(start, end),
            "timeline": timeline,
        })
    return out


# --------------------------------------------------------------------------- the run


def run_phase(name: str, setup: Setup, source: str, paths: list[str], sampler: str,
              epochs: int, out_dir: str, spoke_url: str | None,
              ranks: int | None = None) -> list[dict[str, Any]]:
    """R rank processes (forked, before the poller's thread starts; each DataLoader
    forks its workers) through ``epochs`` epochs; their batches, summarised."""
    ranks = ranks or setup.ranks
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(ranks)
    jobs = [RankJob(name, r, ranks, setup.workers, setup.step_s, epochs, source,
                    tuple(paths), sampler, 17, setup.window, setup.chunk_size, setup.setup_s,
                    os.path.join(out_dir, f"{name}-rank{r}.json")) for r in range(ranks)]
    procs = [ctx.Process(target=run_rank, args=(job, barrier), name=f"{name}-{job.rank}")
             for job in jobs]
    with StatsPoller(spoke_url) as poller:
        for p in procs:
            p.start()
        poller.start()
        try:
            for p in procs:
                p.join()
        finally:
            for p in procs:  # an error in one rank leaves the others at the barrier
                if p.is_alive() and p.pid is not None:
                    p.terminate()
                    p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"phase {name}: a rank failed ({[p.exitcode for p in procs]})")
    results = []
    for job in jobs:
        with open(job.out) as f:
            results.append(json.load(f))
    return summarise(results, poller)


def joined(*epochs: dict[str, Any]) -> list[dict[str, Any]]:
    """The epochs' timelines one after the other, batches numbered on (``x``)."""
    rows = [row for epoch in epochs for row in epoch["timeline"]]
    return [{**row, "x": x} for x, row in enumerate(rows)]


def brief(epoch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in epoch.items() if k != "timeline"}


PHASES = ("local", "plan", "noplan", "twice", "half")


def run(setup: Setup, out_dir: str, log: Callable[[str], None] = print,
        phases: Sequence[str] = PHASES, spoke_args: Sequence[str] = ()) -> dict[str, Any]:
    os.makedirs(out_dir, exist_ok=True)
    logs = os.path.join(out_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    summary: dict[str, Any] = {"setup": asdict(setup), "batch_size": BATCH,
                               "tokens_per_sample": TOKENS_PER_SAMPLE,
                               "sample_bytes": SAMPLE_BYTES}
    timelines: dict[str, list[dict[str, Any]]] = {}
    with Lab(log_dir=logs) as lab:
        root = lab.temp_dir("hubspoke-training-")
        shards = generate(root, max(1, setup.dataset_bytes // setup.shard_bytes),
                          setup.shard_bytes, prefix="train")
        paths = [s.path for s in shards]
        dataset_bytes = sum(s.samples for s in shards) * SAMPLE_BYTES
        summary["dataset_bytes"] = dataset_bytes
        hub = lab.hub(root, "--chunk-size", str(setup.chunk_size))
        link = lab.link(hub.url, latency_ms=setup.latency_ms,
                        bandwidth_kb_s=setup.bandwidth_kb_s)

        def spoke(capacity: int) -> str:
            return lab.spoke(link.url, lab.temp_dir("hubspoke-training-cache-"),
                             "--capacity", str(capacity), *spoke_args).url

        log("local ...")  # always: the other phases are measured against it
        local = run_phase("local", setup, f"local:{root}", paths, "shuffle", 1, out_dir, None)
        summary["local"] = {**brief(local[0]),
                            "what": "the same DataLoader loop over the same shard files, "
                                    "read with os.pread from the local disk (page cache warm)"}
        timelines["local"] = joined(local[0])

        fits = 2 * dataset_bytes
        for name, sampler in (("plan", "plan"), ("noplan", "shuffle"),
                              ("plan_shard_aware", "shard_aware")):
            if name.split("_")[0] not in phases:
                continue
            log(f"{name} (cold, then warm) ...")
            url = spoke(fits)
            before = hub_bytes_sent(hub.url)
            cold, warm = run_phase(name, setup, url, paths, sampler, 2, out_dir, url)
            egress = hub_bytes_sent(hub.url) - before
            summary[name] = {"cold": brief(cold), "warm": brief(warm),
                             "hub_egress_bytes": egress, "capacity_bytes": fits}
            timelines[name] = joined(cold, warm)
        if "plan" in summary:
            summary["hub_egress_bytes"] = summary["plan"]["hub_egress_bytes"]

        half = dataset_bytes // 2
        twice = {"capacity_bytes": half, "dataset_bytes": dataset_bytes}
        for name in setup.twice if "twice" in phases else ():
            summary["twice_the_cache"] = twice
            log(f"dataset twice the cache, {name} ...")
            url = spoke(half)
            before = hub_bytes_sent(hub.url)
            sampler = {"shard_aware": "shard_aware", "uniform": "plan"}.get(name, "shuffle")
            epochs = run_phase(f"twice-{name}", setup, url, paths, sampler, 2, out_dir, url)
            summary["twice_the_cache"][name] = {
                "epochs": [brief(e) for e in epochs],
                "hub_egress_bytes": hub_bytes_sent(hub.url) - before}
            timelines[f"2x cache, {name}"] = joined(*epochs)

        if "half" in phases:
            log("half cache, one-chunk samples ...")
            summary["half_cache"] = half_cache(lab, setup, out_dir)

    summary["targets"] = targets(summary)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out_dir, "timeline.json"), "w") as f:
        json.dump(timelines, f)
    plot(timelines, os.path.join(out_dir, "timeline.png"))
    return summary


def half_cache(lab: Lab, setup: Setup, out_dir: str) -> dict[str, Any]:
    """PlannedSampler, cache at half a dataset of one-chunk samples: hub bytes per epoch."""
    root = lab.temp_dir("hubspoke-training-small-")
    shards = generate(root, 4, setup.half_cache_bytes // 4, prefix="small", seed=99)
    paths = [s.path for s in shards]
    dataset_bytes = sum(s.samples for s in shards) * SAMPLE_BYTES
    hub = lab.hub(root, "--chunk-size", str(SAMPLE_BYTES))
    link = lab.link(hub.url, latency_ms=setup.latency_ms, bandwidth_kb_s=setup.bandwidth_kb_s,
                    name="hub-small")
    capacity = dataset_bytes // 2
    url = lab.spoke(link.url, lab.temp_dir("hubspoke-training-cache-"),
                    "--capacity", str(capacity)).url
    quick = replace(setup, step_s=setup.step_s / 4)  # bytes are the point here, not time
    before = hub_bytes_sent(hub.url)
    epochs = run_phase("half-cache", quick, url, paths, "plan", setup.half_cache_epochs,
                       out_dir, url)
    return {"dataset_bytes": dataset_bytes, "capacity_bytes": capacity,
            "chunk_bytes": SAMPLE_BYTES, "hub_egress_bytes": hub_bytes_sent(hub.url) - before,
            # Per epoch from /stats polled every 50 ms: a boundary's fetches may land either side.
            "hub_bytes_per_epoch": [e["hub_bytes"] for e in epochs],
            "hit_ratio_per_epoch": [e["hit_ratio"] for e in epochs],
            "later_epochs_fraction_of_dataset": [e["hub_bytes"] / dataset_bytes
                                                 for e in epochs[1:]]}


def targets(s: dict[str, Any]) -> dict[str, Any]:
    if "plan" not in s:
        return {}
    local, cold, warm = s["local"], s["plan"]["cold"], s["plan"]["warm"]
    return {
        "cold_util_with_plan_at_least_0.95": cold["util"] >= 0.95,
        "cold_util_with_shard_aware_plan_at_least_0.95":
            s.get("plan_shard_aware", {}).get("cold", {}).get("util", 0) >= 0.95,
        "warm_within_2pct_of_local": warm["samples_per_s"] >= 0.98 * local["samples_per_s"],
        "steady_within_10_batches": cold["steady_from_batch"] <= 10,
        "hub_egress_equals_dataset_when_it_fits": s["plan"]["hub_egress_bytes"]
        == s["dataset_bytes"],
    }


def plot(timelines: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        ("samples/s", lambda r: r["samples_per_s"]), ("util", lambda r: r["util"]),
        (f"read p50 ms ({READ_WINDOW} batches)", lambda r: quantile(r["window_ms"], 0.5)),
        (f"read p99 ms ({READ_WINDOW} batches)", lambda r: quantile(r["window_ms"], 0.99)),
        ("chunk hit ratio", lambda r: r["hit_ratio"]),
        ("hub MB", lambda r: r["hub_bytes"] / 1e6)]
    for rows in timelines.values():  # each batch's reads and those of the batches before
        for i, row in enumerate(rows):
            row["window_ms"] = [ms for r in rows[max(0, i - READ_WINDOW + 1):i + 1]
                                for ms in r["read_ms"]]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 * len(panels)), sharex=True)
    for ax, (label, value) in zip(axes, panels, strict=True):
        for name, rows in timelines.items():
            ax.plot([r["x"] for r in rows], [value(r) for r in rows], label=name,
                    linewidth=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=4)
    axes[-1].set_xlabel("batch (epoch 0, cold, then epoch 1, warm)")
    fig.suptitle("hubspoke training: per batch, cold to warm")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for summary.json and plots")
    parser.add_argument("--quick", action="store_true", help="2 ranks, a smaller dataset")
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--workers", type=int, help="DataLoader workers per rank")
    parser.add_argument("--step-ms", type=float, help="the fixed step time")
    parser.add_argument("--dataset-size", type=parse_size)
    parser.add_argument("--shard-size", type=parse_size)
    parser.add_argument("--chunk-size", type=parse_size)
    parser.add_argument("--latency-ms", type=int)
    parser.add_argument("--bandwidth-kb-s", type=int, help="cap per connection, KB/s")
    parser.add_argument("--half-cache-size", type=parse_size)
    parser.add_argument("--setup-ms", type=float,
                        help="the job's setup (the model) between its loader and epoch 0")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"a subset of {','.join(PHASES)} (local always runs)")
    parser.add_argument("--spoke-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for every spoke of the big dataset "
                             "(repeat it; e.g. --spoke-arg=--fetch-concurrency=32)")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    overrides = {"ranks": args.ranks, "workers": args.workers,
                 "step_s": None if args.step_ms is None else args.step_ms / 1000,
                 "dataset_bytes": args.dataset_size, "shard_bytes": args.shard_size,
                 "chunk_size": args.chunk_size, "latency_ms": args.latency_ms,
                 "bandwidth_kb_s": args.bandwidth_kb_s, "half_cache_bytes": args.half_cache_size,
                 "setup_s": None if args.setup_ms is None else args.setup_ms / 1000}
    setup = replace(setup, **{k: v for k, v in overrides.items() if v is not None})
    started = time.time()
    phases = [p for p in args.phases.split(",") if p]
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}; choose from {','.join(PHASES)}")
    summary = run(setup, args.out, log=lambda m: print(m, file=sys.stderr, flush=True),
                  phases=phases, spoke_args=args.spoke_arg)
    shown = {k: summary[k] for k in ("local", "plan", "noplan", "targets") if k in summary}
    print(json.dumps(shown, indent=2))
    print(f"took {time.time() - started:.0f} s; {args.out}/summary.json, "
          f"{args.out}/timeline.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
