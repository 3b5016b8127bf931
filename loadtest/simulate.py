"""Replay synthetic training traces through the spoke's eviction policies and Belady's OPT.

    python -m loadtest.simulate            # the full run (minutes: the +plan replays dominate)
    python -m loadtest.simulate --quick    # smaller traces, for CI (seconds)

Every policy is the project's own class, built by :func:`spoke.policy.make_policy` (LRU,
ARC, S3-FIFO; W-TinyLFU from :mod:`spoke.policy.tinylfu`): each as the spoke runs it by
default, behind :class:`spoke.policy.admission.ReuseAdmission` (rows ``arc``, ...), and
bare, admitting every miss as the textbook algorithm does (``--admission all``, rows
``arc/all``, ...). They are driven exactly as
``spoke.cache.engine.ChunkCache`` drives it: on a hit ``touch(key)``; on a miss ``admit(key)``,
then ``evict(key)`` while the fill would not fit, then ``insert(key, size)``. The
simulator owns the bytes, as the cache does, and checks after every request that no
policy holds more bytes than the capacity (:class:`CapacityError` otherwise).

OPT is Belady's offline algorithm with the next uses precomputed from the trace: evict
the residents whose next use is furthest, and admit an incoming chunk only if room can be
made by evicting residents all needed later than it (so a chunk never read again is never
admitted). With equal sizes that is optimal; with a partial last chunk per object it is
the usual "furthest next use" heuristic. A heap with lazy invalidation keeps it
O(n log n).

The traces are lists of ``(key, size, job)`` (:class:`Req`); ``simulate`` and ``opt`` also
take plain ``(key, size)`` pairs. Everything is seeded: the same seed gives the same
traces and the same table. Only the standard library (and
:mod:`spoke`'s policies) is used. A policy under development -- a plan-aware one, say -- is
plugged in as any ``capacity -> policy`` callable; one that knows the read plan can be
handed it by a closure::

    from loadtest.simulate import CHUNK, opt, shuffled_epochs, simulate
    trace = shuffled_epochs(10_000, epochs=4, seed=1)
    capacity = 5_000 * CHUNK
    print(simulate(lambda c: PlanAware(c, plan=trace), trace, capacity), opt(trace, capacity))

The ``+plan`` rows run the spoke's own plan engine: a :class:`PlanBook` with each job's plan
(all its epochs at once, or one epoch ahead for ``c/epoch``), its cursor learnt from the
replayed reads, :class:`PlanAwarePolicy` over the named policy (:class:`BookReplay`). On
the noisy traces ``oracle+plan`` is the bound for any cursor: the planned reads' true
positions known (not the off-plan reads: the policy learns those as with the engine).
After the full table come each policy's share of OPT and the targets
with their worst case.

The table's hit ratios leave out a warm-up (the first epoch of the epoch traces); its
"last-epoch" column shows the last epoch alone, since ARC, S3-FIFO and W-TinyLFU take
several epochs to settle. After the table, :func:`scan_summary` gives the training job's
hit ratio on trace (b) as a fraction of OPT's: the policy issue's target is >= 0.9 at 110 %
without a plan.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import os
import random
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from protocol.manifest import Manifest
from spoke.cache.keys import ChunkKey
from spoke.policy import DEFAULT_ADMISSION, POLICY_NAMES, EvictionPolicy, make_policy
from spoke.policy.plan_aware import PlanAwarePolicy
from spoke.prefetch.plans import PlanBook, PlannedRead

__all__ = [
    "CHUNK",
    "OFF_PLAN",
    "PLANNED_KINDS",
    "BookReplay",
    "Built",
    "CapacityError",
    "PolicyFactory",
    "Req",
    "Result",
    "Row",
    "Scenario",
    "SimulationError",
    "TracePlan",
    "build",
    "by_job",
    "chunk_sizes",
    "growing_epochs",
    "hot_set_with_scan",
    "job_switch",
    "last_epoch",
    "loop_trace",
    "lru_shuffle_hit_ratio",
    "merge",
    "multi_job_epochs",
    "next_uses",
    "noisy_epochs",
    "opt",
    "plans_of",
    "policy_factories",
    "run_case",
    "run_scenarios",
    "scan_summary",
    "scenarios",
    "share_table",
    "shuffled_epochs",
    "simulate",
    "simulate_with_book",
    "simulate_with_plan",
    "table",
    "targets",
    "training_share_of_opt",
    "with_scan",
    "zipf_objects",
]

CHUNK = 4 << 20  # the hub's default chunk size (hub.config.DEFAULT_CHUNK_SIZE)
OFF_PLAN = "~off"  # a job's label suffix for its reads its plan did not list


class Req(NamedTuple):
    """One chunk read: its cache key, its size in bytes and the job that reads it."""

    key: Hashable
    size: int
    job: str = ""


TraceItem = tuple[Hashable, int] | tuple[Hashable, int, str]
Trace = Sequence[TraceItem]
PolicyFactory = Callable[[int], EvictionPolicy[Any]]


class SimulationError(RuntimeError):
    """A policy broke the caller protocol (evicted a non-resident key, lost a key...)."""


class CapacityError(SimulationError):
    """A policy (or OPT) held more bytes than the capacity, or could not make room."""


@dataclass(frozen=True)
class Result:
    """Hits and requests, counted and in bytes; ``jobs`` splits them by the trace's job."""

    hits: int
    requests: int
    hit_bytes: int
    total_bytes: int
    jobs: Mapping[str, Result] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def byte_hit_ratio(self) -> float:
        return self.hit_bytes / self.total_bytes if self.total_bytes else 0.0


class _Tally:
    """Per-job counters [hits, requests, hit bytes, bytes], for requests past the warm-up."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, job: str, hit: bool, size: int) -> None:
        counts = self.counts.get(job)
        if counts is None:
            counts = self.counts[job] = [0, 0, 0, 0]
        counts[1] += 1
        counts[3] += size
        if hit:
            counts[0] += 1
            counts[2] += size

    def result(self) -> Result:
        jobs = {
            job: Result(hits, requests, hit_bytes, total_bytes)
            for job, (hits, requests, hit_bytes, total_bytes) in sorted(self.counts.items())
        }
        return Result(
            hits=sum(r.hits for r in jobs.values()),
            requests=sum(r.requests for r in jobs.values()),
            hit_bytes=sum(r.hit_bytes for r in jobs.values()),
            total_bytes=sum(r.total_bytes for r in jobs.values()),
            jobs=jobs,
        )


def _unpack(item: TraceItem) -> tuple[Hashable, int, str]:
    if len(item) == 2:
        return item[0], item[1], ""
    return item[0], item[1], item[2]


def _check_capacity(capacity_bytes: int) -> None:
    if capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")


def simulate(
    policy_factory: PolicyFactory,
    trace: Trace,
    capacity_bytes: int,
    *,
    warmup: int = 0,
    tick: Callable[[int], None] | None = None,
    bypass_ok: bool = False,
) -> Result:
    """Replay ``trace`` through a new ``policy_factory(capacity_bytes)``.

    Requests before index ``warmup`` are replayed but not counted. A chunk larger than
    the whole cache is served and not stored. Raises :class:`CapacityError` as soon as
    the policy's resident bytes exceed ``capacity_bytes`` (or disagree with the bytes the
    simulator placed), and :class:`SimulationError` if the policy's idea of what is
    resident departs from the simulator's. ``tick(index)`` runs before each request (a
    plan's cursor follows the replay with it); with ``bypass_ok`` a policy may decline a
    newcomer by evicting nothing (the chunk is served and not stored), as the spoke allows.
    """
    _check_capacity(capacity_bytes)
    policy = policy_factory(capacity_bytes)
    resident: dict[Hashable, int] = {}  # key -> size: the bytes the "cache" holds
    used = 0
    tally = _Tally()
    for index, item in enumerate(trace):
        if tick is not None:
            tick(index)
        key, size, job = _unpack(item)
        hit = key in resident
        if hit != (key in policy):
            raise SimulationError(
                f"request {index}: {key!r} resident for the simulator: {hit}, "
                f"for {policy.name}: {not hit}"
            )
        if hit:
            policy.touch(key)
        elif size <= capacity_bytes:
            policy.admit(key)
            admitted = True
            while used + size > capacity_bytes:
                victim = policy.evict(key)
                if victim is None and bypass_ok:
                    admitted = False
                    break
                if victim is None:
                    raise CapacityError(
                        f"request {index}: {policy.name} is over capacity "
                        f"({used} + {size} > {capacity_bytes} bytes) yet evicted nothing"
                    )
                victim_size = resident.pop(victim, None)
                if victim_size is None:
                    raise SimulationError(
                        f"request {index}: {policy.name} evicted non-resident {victim!r}"
                    )
                used -= victim_size
            if admitted:
                policy.insert(key, size)
                resident[key] = size
                used += size
        held = policy.resident_bytes
        if held > capacity_bytes or held != used or len(policy) != len(resident):
            raise CapacityError(
                f"request {index}: {policy.name} holds {held} bytes in {len(policy)} entries "
                f"(capacity {capacity_bytes}); the simulator placed {used} bytes "
                f"in {len(resident)} entries"
            )
        if index >= warmup:
            tally.add(job, hit, size)
    return tally.result()


def next_uses(keys: Sequence[Hashable]) -> list[int]:
    """For each position, the position of the next request of the same key.

    A key never requested again gets ``len(keys) + position``: beyond the trace, and
    distinct, so that no two heap entries of :func:`opt` ever compare equal.
    """
    n = len(keys)
    following = [0] * n
    last: dict[Hashable, int] = {}
    for position in range(n - 1, -1, -1):
        key = keys[position]
        following[position] = last.get(key, n + position)
        last[key] = position
    return following


def opt(trace: Trace, capacity_bytes: int, *, warmup: int = 0) -> Result:
    """Belady's OPT over ``trace`` (see the module docstring); counted like :func:`simulate`."""
    _check_capacity(capacity_bytes)
    items = [_unpack(item) for item in trace]
    n = len(items)
    following = next_uses([key for key, _, _ in items])
    resident: dict[Hashable, tuple[int, int]] = {}  # key -> (next use, size)
    heap: list[tuple[int, Hashable]] = []  # (-next use, key); stale unless it matches resident
    used = 0
    tally = _Tally()
    for index, (key, size, job) in enumerate(items):
        upcoming = following[index]
        entry = resident.get(key)
        hit = entry is not None
        if entry is not None:
            resident[key] = (upcoming, entry[1])
            heapq.heappush(heap, (-upcoming, key))
        elif upcoming < n and size <= capacity_bytes:  # worth keeping: it is read again
            victims: list[tuple[int, Hashable]] = []
            need = used + size - capacity_bytes
            while need > 0 and heap:
                negated, candidate = heap[0]
                current = resident.get(candidate)
                if current is None or current[0] != -negated:
                    heapq.heappop(heap)  # stale
                    continue
                if -negated < upcoming:
                    break  # every remaining resident is needed sooner than the incoming key
                victims.append(heapq.heappop(heap))
                need -= current[1]
            if need > 0:  # decline: put the candidates back
                for candidate_entry in victims:
                    heapq.heappush(heap, candidate_entry)
            else:
                for _, victim in victims:
                    used -= resident.pop(victim)[1]
                resident[key] = (upcoming, size)
                heapq.heappush(heap, (-upcoming, key))
                used += size
        if used > capacity_bytes:
            raise CapacityError(f"request {index}: OPT holds {used} > {capacity_bytes} bytes")
        if index >= warmup:
            tally.add(job, hit, size)
    return tally.result()


# --- traces ----------------------------------------------------------------------------


def chunk_sizes(
    n_chunks: int, rng: random.Random, *, partial: bool, max_object_chunks: int = 8
) -> list[int]:
    """Sizes of ``n_chunks`` chunks of a dataset of objects (files, shards).

    Without ``partial`` every chunk is a full :data:`CHUNK`. With it, objects of 1 to
    ``max_object_chunks`` chunks are laid end to end and each one's last chunk is a
    partial one of 1 byte to a full chunk.
    """
    if not partial:
        return [CHUNK] * n_chunks
    sizes: list[int] = []
    while len(sizes) < n_chunks:
        count = min(rng.randint(1, max_object_chunks), n_chunks - len(sizes))
        sizes.extend([CHUNK] * (count - 1))
        sizes.append(rng.randint(1, CHUNK))
    return sizes


def shuffled_epochs(
    n_chunks: int,
    epochs: int,
    *,
    seed: int,
    job: str = "train",
    key_base: int = 0,
    partial: bool = False,
    label_epochs: bool = False,
) -> list[Req]:
    """A training job: each epoch reads every chunk once, in a fresh random permutation.

    Keys are ``key_base .. key_base + n_chunks - 1``. With ``label_epochs`` the job of a
    request in epoch e (1-based) is ``f"{job}@{e}"``, so that results split by epoch.
    """
    rng = random.Random(seed)
    sizes = chunk_sizes(n_chunks, rng, partial=partial)
    keys = list(range(key_base, key_base + n_chunks))
    trace: list[Req] = []
    for epoch in range(1, epochs + 1):
        rng.shuffle(keys)
        label = f"{job}@{epoch}" if label_epochs else job
        trace.extend(Req(key, sizes[key - key_base], label) for key in keys)
    return trace


def with_scan(training: Sequence[Req], *, key_base: int, job: str = "scan") -> list[Req]:
    """``training`` interleaved 1:1 with a one-pass scan of as many never-repeated chunks.

    The scan's keys are ``key_base, key_base + 1, ...``; they must not overlap the training
    keys.
    """
    trace: list[Req] = []
    for offset, request in enumerate(training):
        trace.append(request)
        trace.append(Req(key_base + offset, CHUNK, job))
    return trace


def multi_job_epochs(
    jobs: Sequence[tuple[str, int, int]],
    *,
    seed: int,
    partial: bool = True,
    label_epochs: bool = False,
) -> tuple[list[Req], int]:
    """Several training jobs, each with its own dataset, sharing one cache.

    ``jobs`` is ``(name, n_chunks, epochs)`` per job. The jobs run concurrently: the next
    request comes from a job drawn with probability proportional to its remaining
    requests, so each job's reads are spread over the whole trace (a job with a small
    dataset and many epochs re-reads its chunks sooner). Returns the trace and the
    position by which every job has finished its first epoch (a natural warm-up).
    """
    rng = random.Random(seed)
    streams: list[list[Req]] = []
    key_base = 0
    for name, n_chunks, epochs in jobs:
        stream = shuffled_epochs(
            n_chunks,
            epochs,
            seed=rng.randrange(2**32),
            job=name,
            key_base=key_base,
            partial=partial,
            label_epochs=label_epochs,
        )
        streams.append(stream)
        key_base += n_chunks
    remaining = [len(stream) for stream in streams]
    cursors = [0] * len(streams)
    first_epoch_done = [0] * len(streams)
    trace: list[Req] = []
    for _ in range(sum(remaining)):
        (pick,) = rng.choices(range(len(streams)), weights=remaining)
        trace.append(streams[pick][cursors[pick]])
        cursors[pick] += 1
        remaining[pick] -= 1
        if cursors[pick] == jobs[pick][1]:
            first_epoch_done[pick] = len(trace)
    return trace, max(first_epoch_done)


def hot_set_with_scan(n_hot: int, rounds: int, *, seed: int) -> list[Req]:
    """A working set re-read in rounds, interleaved 1:1 with a one-pass scan.

    Each round reads the ``n_hot`` hot chunks (keys ``0 .. n_hot - 1``, job "hot") in a
    fresh random order; after every hot read comes a never-repeated scan chunk (keys from
    ``n_hot`` up, job "scan"). Between two reads of a hot chunk lie about ``2 * n_hot``
    distinct chunks, half of them never read again: a scan-resistant policy keeps the
    hot set in a cache of ``1.5 * n_hot`` chunks, LRU does not.
    """
    rng = random.Random(seed)
    hot = list(range(n_hot))
    scan = n_hot
    trace: list[Req] = []
    for _ in range(rounds):
        rng.shuffle(hot)
        for key in hot:
            trace.append(Req(key, CHUNK, "hot"))
            trace.append(Req(scan, CHUNK, "scan"))
            scan += 1
    return trace


def zipf_objects(
    n_objects: int,
    alpha: float,
    n_requests: int,
    *,
    seed: int,
    job: str = "zipf",
    max_object_chunks: int = 8,
) -> tuple[list[Req], int]:
    """Reads of whole objects of a shared corpus, object popularity Zipf(``alpha``).

    Objects have 1 to ``max_object_chunks`` chunks, the last one partial; popularity
    ranks are a random permutation of the objects; a read requests all of an object's
    chunks in order. Whole objects are read until the trace holds at least ``n_requests``
    chunk requests. Returns the trace and the corpus size in bytes.
    """
    rng = random.Random(seed)
    objects: list[list[Req]] = []
    key = 0
    for _ in range(n_objects):
        count = rng.randint(1, max_object_chunks)
        chunks = [Req(key + i, CHUNK, job) for i in range(count - 1)]
        chunks.append(Req(key + count - 1, rng.randint(1, CHUNK), job))
        objects.append(chunks)
        key += count
    corpus_bytes = sum(request.size for chunks in objects for request in chunks)
    ranked = list(range(n_objects))
    rng.shuffle(ranked)
    cumulative: list[float] = []
    total = 0.0
    for rank in range(1, n_objects + 1):
        total += rank**-alpha
        cumulative.append(total)
    trace: list[Req] = []
    while len(trace) < n_requests:
        for rank in rng.choices(range(n_objects), cum_weights=cumulative, k=256):
            trace.extend(objects[ranked[rank]])
            if len(trace) >= n_requests:
                break
    return trace, corpus_bytes



def loop_trace(n_chunks: int, loops: int, *, job: str = "loop") -> list[Req]:
    """A sequential loop: chunks ``0 .. n_chunks - 1`` in order, ``loops`` times (labels
    ``job@loop``). LRU misses every read once the cache is smaller than the loop; OPT
    keeps a fixed part of it."""
    return [Req(key, CHUNK, f"{job}@{loop}") for loop in range(1, loops + 1)
            for key in range(n_chunks)]


def job_switch(n_chunks: int, first_epochs: int, epochs: int, *, seed: int,
               then: str = "shuffled") -> tuple[list[Req], int]:
    """A job that ends, then another on a dataset of its own (keys from ``10 * n_chunks``
    on, the same size): ``first_epochs`` shuffled epochs of the first, then ``epochs`` of
    the next, ``"shuffled"`` or read in order (``"loop"``). Returns the trace and where the
    next job's second epoch starts (its first is warm-up). A cache that keeps the first
    job's chunks for good hits nothing after the switch."""
    first = shuffled_epochs(n_chunks, first_epochs, seed=seed, job="done", label_epochs=True)
    base = 10 * n_chunks
    if then == "loop":
        after = [Req(key + base, CHUNK, f"next@{loop}")
                 for loop in range(1, epochs + 1) for key in range(n_chunks)]
    else:
        after = shuffled_epochs(n_chunks, epochs, seed=seed + 1, job="next", key_base=base,
                                label_epochs=True)
    return first + after, len(first) + n_chunks


def growing_epochs(n_chunks: int, epochs: int, growth: float, *, seed: int,
                   job: str = "train") -> list[Req]:
    """Shuffled epochs over a dataset that grows: epoch e reads the first
    ``n_chunks * (1 + growth * (e - 1))`` chunks (new shards appended as they land)."""
    rng = random.Random(seed)
    trace: list[Req] = []
    for epoch in range(1, epochs + 1):
        keys = list(range(int(n_chunks * (1 + growth * (epoch - 1)))))
        rng.shuffle(keys)
        trace.extend(Req(key, CHUNK, f"{job}@{epoch}") for key in keys)
    return trace


def noisy_epochs(
    n_chunks: int, epochs: int, *, seed: int, noise: float, reorder: int, job: str = "train",
    strays: str = "local",
) -> tuple[list[Req], list[list[Hashable]]]:
    """Shuffled epochs read the way a DataLoader reads a registered plan, and the plan.

    Each read is displaced by up to ``reorder`` places (workers and their prefetch
    queues), and a share ``noise`` of all reads are off-plan: half of them a chunk of a
    small evaluation set no plan mentions (keys from ``n_chunks`` on, a tenth as many),
    half a chunk of the dataset: with ``strays="local"`` one of the last ``reorder``
    chunks read (a retry, a sample read twice), with ``"random"`` any chunk at random
    (which no online policy can foresee: OPT hits them, a plan cannot).
    Returns the trace and the plan: each epoch's keys in registered order.
    """
    rng = random.Random(seed)
    keys = list(range(n_chunks))
    extra = max(1, n_chunks // 10)
    stray_odds = noise / (1 - noise)  # strays per planned read, for a share ``noise``
    trace: list[Req] = []
    plan: list[list[Hashable]] = []
    for epoch in range(1, epochs + 1):
        rng.shuffle(keys)
        plan.append(list(keys))
        label, off_label = f"{job}@{epoch}", f"{job}{OFF_PLAN}@{epoch}"
        order = sorted(range(n_chunks), key=lambda i: i + rng.uniform(0, reorder))
        for i in order:
            while rng.random() < stray_odds / (1 + stray_odds):
                if rng.random() < 0.5:
                    stray = n_chunks + rng.randrange(extra)
                elif strays == "random" or not trace:
                    stray = rng.randrange(n_chunks)
                else:
                    stray = trace[-1 - rng.randrange(min(len(trace), max(1, reorder)))].key
                trace.append(Req(stray, CHUNK, off_label))
            trace.append(Req(keys[i], CHUNK, label))
    return trace, plan


# --- scenarios and the table ------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A trace to build (deterministically, from ``kind`` and ``params``) and the caches to try.

    ``capacities`` are fractions of the dataset's bytes (for the scan trace, of the training
    dataset; for the Zipf traces, of the corpus).
    """

    label: str
    description: str
    # "epochs", "scan", "jobs", "zipf", "loop", "growing", "noisy", "jobs-epoch" or "switch"
    kind: str
    params: tuple[tuple[str, Any], ...]
    capacities: tuple[float, ...]


@dataclass(frozen=True)
class Built:
    """A scenario's trace, its dataset size and how many leading requests are warm-up."""

    trace: list[Req]
    dataset_bytes: int
    warmup: int
    # Each planned job's registered plan, epoch by epoch; None: the trace's own reads
    # of every job but "scan" (the plan told the truth).
    plans: dict[str, list[list[Hashable]]] | None = None
    registration: str = "whole"  # "whole": one plan of every epoch; "epoch": one ahead


def build(scenario: Scenario) -> Built:
    """The trace of ``scenario``; training requests are labelled ``job@epoch``."""
    p = dict(scenario.params)
    if scenario.kind in ("epochs", "scan"):
        n = p["n_chunks"]
        trace = shuffled_epochs(n, p["epochs"], seed=p["seed"], label_epochs=True)
        if scenario.kind == "epochs":
            return Built(trace, n * CHUNK, n)
        return Built(with_scan(trace, key_base=n), n * CHUNK, 2 * n)
    if scenario.kind == "jobs":
        trace, warmup = multi_job_epochs(p["jobs"], seed=p["seed"], label_epochs=True)
        return Built(trace, sum({r.key: r.size for r in trace}.values()), warmup)
    if scenario.kind == "zipf":
        trace, corpus = zipf_objects(p["n_objects"], p["alpha"], p["n_requests"], seed=p["seed"])
        return Built(trace, corpus, 0)
    if scenario.kind == "loop":
        n = p["n_chunks"]
        return Built(loop_trace(n, p["epochs"]), n * CHUNK, n)
    if scenario.kind == "growing":
        n = p["n_chunks"]
        trace = growing_epochs(n, p["epochs"], p["growth"], seed=p["seed"])
        return Built(trace, len({r.key for r in trace}) * CHUNK, n)
    if scenario.kind == "noisy":
        n = p["n_chunks"]
        trace, plan = noisy_epochs(n, p["epochs"], seed=p["seed"], noise=p["noise"],
                                   reorder=p["reorder"], strays=p["strays"])
        first = next(i for i, r in enumerate(trace) if r.job.endswith("@2"))
        return Built(trace, n * CHUNK, first, plans={"train": plan})
    if scenario.kind == "switch":
        n = p["n_chunks"]
        trace, warmup = job_switch(n, p["first_epochs"], p["epochs"], seed=p["seed"],
                                   then=p["then"])
        return Built(trace, n * CHUNK, warmup)
    if scenario.kind == "jobs-epoch":
        trace, warmup = multi_job_epochs(p["jobs"], seed=p["seed"], label_epochs=True)
        return Built(trace, sum({r.key: r.size for r in trace}.values()), warmup,
                     registration="epoch")
    raise ValueError(f"unknown scenario kind {scenario.kind!r}")


def scenarios(*, quick: bool = False, seed: int = 1) -> list[Scenario]:
    """The traces of the report: (a) epochs, (b) epochs + scan, (c) 3 jobs, (c/epoch) the
    same registering one epoch ahead, (d) Zipf, (e) a loop, (f) a growing dataset, (g)
    a noisy plan, (h) a job that ends and another that starts."""
    n = 2_000 if quick else 12_000  # chunks in the training dataset
    small = 1_000 if quick else 12_000  # the same, for the traces (e)-(h)
    epochs = 4 if quick else 10
    fractions = (0.25, 0.5, 0.9, 1.1)
    jobs = (("job0", n // 2, 4), ("job1", 3 * n // 10, 6), ("job2", n // 5, 9))
    n_objects, n_requests = n // 4, 6 * n
    per_job = ", ".join(f"{name} {chunks} chunks x {count}" for name, chunks, count in jobs)
    return [
        Scenario(
            "a",
            f"shuffled epochs: {n} chunks x {epochs} epochs, 4 MiB chunks",
            "epochs",
            (("n_chunks", n), ("epochs", epochs), ("seed", seed)),
            (0.1, *fractions),
        ),
        Scenario(
            "b",
            f"(a)'s job interleaved 1:1 with a one-pass scan of {n * epochs} other chunks",
            "scan",
            (("n_chunks", n), ("epochs", epochs), ("seed", seed + 1)),
            fractions,
        ),
        Scenario(
            "c",
            f"3 concurrent jobs, one cache: {per_job}; partial last chunks",
            "jobs",
            (("jobs", jobs), ("seed", seed + 2)),
            (0.1, 0.25, 0.5, 0.9),
        ),
        Scenario(
            "c/epoch",
            "(c), each job registering one epoch at a time, one epoch ahead",
            "jobs-epoch",
            (("jobs", jobs), ("seed", seed + 2)),
            (0.1, 0.25) if quick else (0.1, 0.25, 0.5, 0.9),
        ),
        *(
            Scenario(
                f"d {alpha}",
                f"Zipf {alpha} over {n_objects} objects of 1-8 chunks (partial last), "
                f"whole-object reads, {n_requests} chunk requests",
                "zipf",
                (
                    ("n_objects", n_objects),
                    ("n_requests", n_requests),
                    ("alpha", alpha),
                    ("seed", seed + 3),
                ),
                (0.1, 0.25),
            )
            for alpha in (0.8, 1.0)
        ),
        Scenario(
            "e",
            f"a sequential loop over {small} chunks, {epochs} times",
            "loop",
            (("n_chunks", small), ("epochs", epochs)),
            (0.05, 0.1, 0.25),
        ),
        Scenario(
            "f",
            f"shuffled epochs over a growing dataset: {small // 2} chunks, 25 % more each "
            f"epoch, {epochs} epochs",
            "growing",
            (("n_chunks", small // 2), ("epochs", epochs), ("growth", 0.25),
             ("seed", seed + 4)),
            (0.25, 0.5),
        ),
        Scenario(
            "g",
            f"a job as a DataLoader reads its plan: 10 % of reads off-plan (an eval set; "
            f"retries), each read up to 64 places out of order; {small} chunks x {epochs} "
            f"epochs",
            "noisy",
            (("n_chunks", small), ("epochs", epochs), ("noise", 0.1), ("reorder", 64),
             ("strays", "local"), ("seed", seed + 5)),
            (0.1, 0.25, 0.5, 0.9),
        ),
        Scenario(
            "g/random",
            "(g), the off-plan reads of the dataset at random (a bound: OPT foresees them)",
            "noisy",
            (("n_chunks", small), ("epochs", epochs), ("noise", 0.1), ("reorder", 64),
             ("strays", "random"), ("seed", seed + 5)),
            (0.1, 0.25) if quick else (0.1, 0.25, 0.5, 0.9),
        ),
        *(
            Scenario(
                label,
                f"a job of {small} chunks x 3 shuffled epochs ends; another of {small} other "
                f"chunks reads them {how}, {epochs} times",
                "switch",
                (("n_chunks", small), ("first_epochs", 3), ("epochs", epochs),
                 ("then", then), ("seed", seed + 6)),
                (0.1, 0.5, 0.9),
            )
            for label, then, how in (("h", "shuffled", "shuffled"), ("h/loop", "loop", "in order"))
        ),
    ]


TEXTBOOK = "/all"  # the suffix of the rows that admit every miss (--admission all)


def policy_factories() -> dict[str, PolicyFactory]:
    """The project's policies by name, built with :func:`spoke.policy.make_policy`: as the
    spoke runs them by default (``arc``), then admitting every miss (``arc/all``)."""

    def factory(name: str, admission: str) -> PolicyFactory:
        return lambda capacity: make_policy(name, capacity, admission)

    spoke = {name: factory(name, DEFAULT_ADMISSION) for name in POLICY_NAMES}
    textbook = {name + TEXTBOOK: factory(name, "all") for name in POLICY_NAMES}
    return spoke | textbook


def merge(results: Iterable[Result]) -> Result:
    """The sum of ``results`` (without a per-job split)."""
    parts = list(results)
    return Result(
        hits=sum(r.hits for r in parts),
        requests=sum(r.requests for r in parts),
        hit_bytes=sum(r.hit_bytes for r in parts),
        total_bytes=sum(r.total_bytes for r in parts),
    )


def by_job(result: Result) -> dict[str, Result]:
    """``result.jobs`` with the epochs of each job (labels ``job@epoch``) added up."""
    groups: dict[str, list[Result]] = {}
    for label, part in result.jobs.items():
        groups.setdefault(label.partition("@")[0], []).append(part)
    return {job: merge(parts) for job, parts in groups.items()}


def last_epoch(result: Result) -> Result | None:
    """The requests of each job's last epoch (labels ``job@epoch``); None without labels."""
    last: dict[str, tuple[int, Result]] = {}
    for label, part in result.jobs.items():
        job, at, epoch = label.partition("@")
        if at and (job not in last or int(epoch) > last[job][0]):
            last[job] = (int(epoch), part)
    return merge(part for _, part in last.values()) if last else None


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    fraction: float
    policy: str
    result: Result
    optimum: Result


class TracePlan:
    """What a loader's read plan tells the spoke, replayed: ``next_use(key)``.

    Holds the future requests of the planned jobs (every job but ``unplanned``); the
    cursor follows the replay (``tick``). Same semantics as the spoke's
    :meth:`spoke.prefetch.plans.ReadPlan.next_use`: requests until the key's next planned read
    after the current one, ``inf`` when none.
    """

    def __init__(self, trace: Trace, unplanned: frozenset[str] = frozenset({"scan"})) -> None:
        self.cursor = 0
        self._positions: dict[Hashable, list[int]] = {}
        for index, item in enumerate(trace):
            key, _, job = _unpack(item)
            name = job.partition("@")[0]
            if name not in unplanned and not name.endswith(OFF_PLAN):
                self._positions.setdefault(key, []).append(index)

    def tick(self, index: int) -> None:
        self.cursor = index

    def __call__(self, key: Hashable) -> float:
        positions = self._positions.get(key)
        if not positions:
            return math.inf
        i = bisect.bisect_right(positions, self.cursor)
        return math.inf if i == len(positions) else float(positions[i] - self.cursor)


def simulate_with_plan(name: str, trace: Trace, capacity: int, *, warmup: int) -> Result:
    """Policy ``name`` wrapped in the spoke's plan-aware eviction, with an oracle's plan
    (the trace's own future of its planned reads, :class:`TracePlan`): what a perfect
    cursor would give, off-plan reads unforeseen."""
    plan = TracePlan(trace)

    def factory(capacity_bytes: int) -> EvictionPolicy[Any]:
        return PlanAwarePolicy(make_policy(name, capacity_bytes, DEFAULT_ADMISSION), plan)

    return simulate(factory, trace, capacity, warmup=warmup, tick=plan.tick, bypass_ok=True)


def plans_of(trace: Sequence[Req], unplanned: frozenset[str] = frozenset({"scan"})
             ) -> dict[str, list[list[Hashable]]]:
    """Each job's reads, epoch by epoch (labels ``job@epoch``): the plan of a job whose
    loader told the spoke the truth."""
    plans: dict[str, dict[int, list[Hashable]]] = {}
    for request in trace:
        job, _, epoch = request.job.partition("@")
        if job not in unplanned and not job.endswith(OFF_PLAN):
            plans.setdefault(job, {}).setdefault(int(epoch or 1), []).append(request.key)
    return {job: [epochs[e] for e in sorted(epochs)] for job, epochs in plans.items()}


class BookReplay:
    """The spoke's own plan engine, driven by a replay: a :class:`PlanBook` holding each
    job's plan, each planned job's reads observed as the spoke observes them (each chunk
    is one object of one chunk, so a read is its key), the book's ``next_use`` handed to
    :class:`PlanAwarePolicy`.

    With ``registration="whole"`` a job registers all its epochs as one plan before its
    first read; with ``"epoch"`` it registers each epoch as a plan of its own, one epoch
    ahead (epochs 1 and 2 first, epoch e + 1 when it starts epoch e, dropping e - 1), as
    ``PlannedSampler`` does.
    """

    def __init__(self, built: Built) -> None:
        self.trace = built.trace
        self.plans = built.plans if built.plans is not None else plans_of(built.trace)
        self.registration = built.registration
        self.book = PlanBook()
        sizes = {r.key: r.size for r in built.trace}
        self._paths = {key: f"k{key}" for key in sizes}
        self._manifests = {
            path: Manifest(path=path, size=sizes[key], etag='"1"', chunk_size=CHUNK,
                           digest_alg="sha256", digests=(bytes(32),))
            for key, path in self._paths.items()
        }
        self._names = {key: ChunkKey.of(self._manifests[path], 0).name
                       for key, path in self._paths.items()}
        self._sizes = sizes
        self._live: dict[tuple[str, int], str] = {}  # (job, epoch) -> plan id
        self._epoch: dict[str, int] = {}  # job -> the epoch it reads
        if self.registration == "whole":
            for job, epochs in self.plans.items():
                self._register(job, 0, [key for epoch in epochs for key in epoch])
        else:
            for job, epochs in self.plans.items():
                for number in (1, 2):
                    if number <= len(epochs):
                        self._register(job, number, epochs[number - 1])

    def _register(self, job: str, epoch: int, keys: list[Hashable]) -> None:
        reads = [PlannedRead(self._paths[key], 0, self._sizes[key]) for key in keys]
        self._live[(job, epoch)] = self.book.add(reads, self._manifests, job=job).id

    def next_use(self, key: Any) -> float:
        return self.book.next_use(self._names.get(key))

    def tick(self, index: int) -> None:
        request = self.trace[index]
        job, _, label = request.job.partition("@")
        job = job.removesuffix(OFF_PLAN)  # an off-plan read carries its job's plan id
        epochs = self.plans.get(job)
        if epochs is None:
            return
        epoch = int(label or 1)
        if self.registration == "whole":
            plan_id = self._live[(job, 0)]
        else:
            if self._epoch.get(job) != epoch:
                self._epoch[job] = epoch
                if epoch + 1 <= len(epochs) and (job, epoch + 1) not in self._live:
                    self._register(job, epoch + 1, epochs[epoch])
                old = self._live.pop((job, epoch - 1), None)
                if old is not None:
                    self.book.remove(old)
            plan_id = self._live[(job, epoch)]
        self.book.observe(plan_id, "", self._paths[request.key], [0])


def simulate_with_book(name: str, built: Built, capacity: int) -> Result:
    """Policy ``name`` under plan-aware eviction fed by the spoke's real plan engine
    (:class:`BookReplay`): the cursor learnt from the reads, the plans as registered."""
    replay = BookReplay(built)

    def factory(capacity_bytes: int) -> EvictionPolicy[Any]:
        return PlanAwarePolicy(make_policy(name, capacity_bytes, DEFAULT_ADMISSION),
                               replay.next_use)

    return simulate(factory, built.trace, capacity, warmup=built.warmup, tick=replay.tick,
                    bypass_ok=True)


# Traces of training jobs, replayed with plans as well.
PLANNED_KINDS = frozenset({"epochs", "scan", "jobs", "loop", "growing", "noisy", "jobs-epoch"})


def run_case(scenario: Scenario, fraction: float) -> list[Row]:
    """OPT and every policy on ``scenario`` with a cache of ``fraction`` of its dataset.

    Traces of training jobs are also replayed with each policy under plan-aware
    eviction (``+plan``): the jobs told the spoke their read order; a scan did not.
    """
    built = build(scenario)
    capacity = int(built.dataset_bytes * fraction)
    optimum = opt(built.trace, capacity, warmup=built.warmup)
    rows = [Row(scenario, fraction, "opt", optimum, optimum)]
    for name, factory in policy_factories().items():
        result = simulate(factory, built.trace, capacity, warmup=built.warmup)
        rows.append(Row(scenario, fraction, name, result, optimum))
    if scenario.kind in PLANNED_KINDS:
        for name in POLICY_NAMES:
            result = simulate_with_book(name, built, capacity)
            rows.append(Row(scenario, fraction, f"{name}+plan", result, optimum))
    if scenario.kind == "noisy":  # the most a plan can give: its future known exactly
        result = simulate_with_plan("lru", built.trace, capacity, warmup=built.warmup)
        rows.append(Row(scenario, fraction, "oracle+plan", result, optimum))
    return rows


def run_scenarios(chosen: Iterable[Scenario], *, workers: int = 1) -> list[Row]:
    """Every policy and OPT on every scenario at every capacity, in a stable order."""
    cases = [(scenario, fraction) for scenario in chosen for fraction in scenario.capacities]
    if workers <= 1 or len(cases) <= 1:
        batches = [run_case(scenario, fraction) for scenario, fraction in cases]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            batches = list(pool.map(run_case, *zip(*cases, strict=True)))
    return [row for batch in batches for row in batch]


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"


def _of(value: float, reference: float) -> str:
    return f"{100 * value / reference:.0f}" if reference > 0 else "-"


def table(rows: Sequence[Row]) -> str:
    """The Markdown table of ``rows``, then a legend of the traces."""
    lines = [
        "| trace | cache | policy | hit % (req) | hit % (bytes) | % of OPT (req) "
        "| % of OPT (bytes) | last-epoch hit % (req) | hit % by job (req) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        result, optimum = row.result, row.optimum
        jobs = by_job(result)
        split = ""
        if len(jobs) > 1:
            split = ", ".join(f"{job} {_percent(part.hit_ratio)}" for job, part in jobs.items())
        final = last_epoch(result)
        lines.append(
            f"| {row.scenario.label} | {100 * row.fraction:.0f} % | {row.policy} "
            f"| {_percent(result.hit_ratio)} | {_percent(result.byte_hit_ratio)} "
            f"| {_of(result.hit_ratio, optimum.hit_ratio)} "
            f"| {_of(result.byte_hit_ratio, optimum.byte_hit_ratio)} "
            f"| {_percent(final.hit_ratio) if final else ''} | {split} |"
        )
    lines.append("")
    seen: dict[str, str] = {}
    for row in rows:
        seen.setdefault(row.scenario.label, row.scenario.description)
    lines.extend(f"- {label}: {description}" for label, description in seen.items())
    return "\n".join(lines)


def training_share_of_opt(row: Row, job: str = "train") -> float:
    """``job``'s hit ratio in ``row`` as a fraction of OPT's for the same job (0 if OPT's is 0).

    OPT maximises hits over every job, so on a trace with a scan it keeps only training
    chunks: its training hit ratio is the most any policy can reach for that job.
    """
    ours = by_job(row.result).get(job)
    best = by_job(row.optimum).get(job)
    if ours is None or best is None or best.hit_ratio <= 0:
        return 0.0
    return ours.hit_ratio / best.hit_ratio


def scan_summary(rows: Sequence[Row]) -> str:
    """A Markdown table: per policy without a plan, the training job's share of OPT on (b)."""
    scan_rows = [
        row
        for row in rows
        if row.scenario.kind == "scan" and row.policy != "opt" and "+" not in row.policy
    ]
    fractions = sorted({row.fraction for row in scan_rows})
    if not scan_rows:
        return ""
    lines = [
        "Training job of (b), no plan: hit ratio as a fraction of OPT's (target: >= 0.90 "
        "at 110 %)",
        "",
        "| policy | " + " | ".join(f"{100 * f:.0f} %" for f in fractions) + " |",
        "|---|" + "---:|" * len(fractions),
    ]
    share = {(row.policy, row.fraction): training_share_of_opt(row) for row in scan_rows}
    for name in dict.fromkeys(row.policy for row in scan_rows):
        cells = " | ".join(f"{share[(name, f)]:.2f}" for f in fractions)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def share_table(rows: Sequence[Row]) -> str:
    """A Markdown table of every policy's hit ratio as a percentage of OPT's, one line per
    trace and cache size (OPT's own hit ratio in the first column)."""
    policies = list(dict.fromkeys(row.policy for row in rows if row.policy != "opt"))
    cases: dict[tuple[str, float], dict[str, Row]] = {}
    for row in rows:
        cases.setdefault((row.scenario.label, row.fraction), {})[row.policy] = row
    lines = [
        "| trace | cache | OPT hit % | " + " | ".join(policies) + " |",
        "|---|---:|---:|" + "---:|" * len(policies),
    ]
    for (label, fraction), by_policy in cases.items():
        optimum = next(iter(by_policy.values())).optimum.hit_ratio
        cells = [
            _of(by_policy[name].result.hit_ratio, optimum) if name in by_policy else ""
            for name in policies
        ]
        lines.append(f"| {label} | {100 * fraction:.0f} % | {_percent(optimum)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: Sequence[Row]) -> str:
    """The plan engine's targets (the issue's), each with the worst case measured."""

    def worst(kinds: set[str], policy: Callable[[str], bool],
              fractions: Iterable[float] = (0.1, 0.25, 0.5, 0.9)) -> tuple[float, str]:
        chosen = set(fractions)
        shares = [
            (row.result.hit_ratio / row.optimum.hit_ratio,
             f"{row.scenario.label} {100 * row.fraction:.0f} % {row.policy}")
            for row in rows
            if row.scenario.kind in kinds and row.fraction in chosen and policy(row.policy)
            and row.optimum.hit_ratio > 0
        ]
        return min(shares) if shares else (math.nan, "not run")

    planned = lambda name: name.endswith("+plan") and name != "oracle+plan"  # noqa: E731
    checks = [
        ("a plan, one job, 10-90 %", 0.95, worst({"epochs"}, planned)),
        ("a plan, three jobs, 10-90 %", 0.95, worst({"jobs"}, planned)),
        ("a plan, three jobs one epoch ahead, 10-90 %", 0.95, worst({"jobs-epoch"}, planned)),
        ("a noisy plan (10 % off-plan), 10-90 %", 0.90, worst({"noisy"}, planned)),
        ("a noisy plan, 50-90 %", 0.90, worst({"noisy"}, planned, (0.5, 0.9))),
        ("W-TinyLFU, loop at 10 %", 0.85, worst({"loop"}, lambda n: n == "wtinylfu", (0.1,))),
    ]
    all_fractions = {row.fraction for row in rows}
    kinds = {row.scenario.kind for row in rows}
    names = dict.fromkeys(row.policy for row in rows if row.policy != "opt")
    # The floor is the spoke's: its policies as it runs them. The textbook rows (every
    # miss admitted) follow as a reference, unjudged: LRU and ARC hit nothing on a loop
    # larger than the cache by their own definition.
    for name in (n for n in names if not n.endswith(TEXTBOOK)):
        checks.append((f"{name}, any trace", 0.5,
                       worst(kinds, lambda n, name=name: n == name, all_fractions)))
    lines = ["| target | need (x OPT) | worst measured | where | met |", "|---|---:|---:|---|---|"]
    for what, need, (share, where) in checks:
        met = "-" if math.isnan(share) else "yes" if share >= need else "no"
        lines.append(f"| {what} | {need:.2f} | {share:.2f} | {where} | {met} |")
    for name in (n for n in names if n.endswith(TEXTBOOK)):
        share, where = worst(kinds, lambda n, name=name: n == name, all_fractions)
        lines.append(f"| {name} (textbook, for reference), any trace | | {share:.2f} | "
                     f"{where} | |")
    return "\n".join(lines)


def lru_shuffle_hit_ratio(fraction: float) -> float:
    """LRU's steady-state hit ratio on shuffled epochs with a cache of ``fraction`` of the data.

    A chunk at relative position u of one epoch and v of the next has about
    N(1 - u(1 - v)) distinct chunks between its two reads, so LRU hits iff
    u(1 - v) > 1 - fraction; for u, v uniform that has probability 1 - a + a ln a,
    a = 1 - fraction.
    """
    if fraction >= 1:
        return 1.0
    if fraction <= 0:
        return 0.0
    a = 1 - fraction
    return 1 - a + a * math.log(a)


NOTES = """\
Cache sizes are fractions of the dataset ((b): of the training dataset; (d): of the corpus).
Hit ratios leave out a warm-up: the first epoch in (a) and (b), the requests until every job
has finished its first epoch in (c); none in (d). "last-epoch" counts only the requests of each
training job's last epoch (near the steady state; (b)'s scan is left out). OPT is Belady's with
bypass; with equal chunks its steady state on shuffled epochs is exactly the cache fraction.
LRU's steady state on shuffled epochs, 1 - a + a ln a with a = 1 - fraction: {lru}."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.simulate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small traces (for CI)")
    parser.add_argument("--seed", type=int, default=1, help="seed of every trace")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes to spread the cases over (the results do not depend on it)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = run_scenarios(scenarios(quick=args.quick, seed=args.seed), workers=args.workers)
    print(table(rows))
    print()
    print("Hit ratio as a percentage of OPT's:")
    print()
    print(share_table(rows))
    print()
    print(targets(rows))
    print()
    summary = scan_summary(rows)
    if summary:
        print(summary)
        print()
    lru = ", ".join(
        f"{100 * f:.0f} % -> {_percent(lru_shuffle_hit_ratio(f))} %" for f in (0.25, 0.5, 0.9)
    )
    print(NOTES.format(lru=lru))
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
