"""A PyTorch map-style dataset of fixed-size samples packed in shard files.

The reference workload: tokenized text packed in 4096-token sequences, tokens
stored as little-endian integers, one shard file after another. Point it at a
spoke (or a hub) and use it with any ``DataLoader``; each worker process gets
its own connection pool (see :class:`spoke.client.clients.Client`).

    from torch.utils.data import DataLoader
    from spoke.client.torch_dataset import ShardedSamples

    ds = ShardedSamples("http://spoke:8701", prefix="dataset/")
    for batch in DataLoader(ds, batch_size=32, shuffle=True, num_workers=4):
        ...  # batch: LongTensor [32, 4096]

With :class:`PlannedSampler` in place of ``shuffle=True`` the loader tells the spoke
each epoch's reads before making them, so the spoke fetches ahead in that order and
evicts by it (Belady's rule); for one rank of a multi-rank job, give ``rank`` and
``world_size`` (or initialise ``torch.distributed``)::

    sampler = PlannedSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=4,
                        persistent_workers=True)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...

torch is an optional dependency (``pip install 'hubspoke[torch]'``).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import math
import os
import secrets
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler

from protocol.errors import ProtocolError
from protocol.plan_request import parse_job
from spoke.client.clients import Client, HubspokeError
from spoke.client.orders import padded, rank_share, shard_aware_order, uniform_order

logger = logging.getLogger(__name__)

TOKENS_PER_SAMPLE = 4096
_DTYPES = {"int32": torch.int32, "int64": torch.int64, "uint16": torch.uint16,
           "int16": torch.int16, "uint8": torch.uint8}


class ShardedSamples(Dataset[torch.Tensor]):
    """Sample ``i`` is the ``i``-th fixed-size record across the shards, in path order.

    The shard list and each shard's version (ETag) are fixed when the dataset is
    made: reads carry ``If-Match``, so an epoch never mixes two versions of a shard.
    A partial record at the end of a shard is ignored.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        paths: Sequence[str] | None = None,
        prefix: str | None = None,
        tokens_per_sample: int = TOKENS_PER_SAMPLE,
        dtype: str = "int32",
        client: Client | None = None,
    ) -> None:
        if (paths is None) == (prefix is None):
            raise ValueError("give exactly one of paths= or prefix=")
        self.client = client or Client(endpoint)
        self.dtype = _DTYPES[dtype]
        self.sample_bytes = tokens_per_sample * torch.tensor([], dtype=self.dtype).element_size()
        stats = ([self.client.stat(p) for p in paths] if paths is not None
                 else self.client.list(prefix or ""))
        self.shards = [(s.path, s.etag) for s in stats if s.size >= self.sample_bytes]
        counts = [s.size // self.sample_bytes for s in stats if s.size >= self.sample_bytes]
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, index: int) -> tuple[str, str, int]:
        """(shard path, etag, byte offset) of sample ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} outside 0..{len(self) - 1}")
        shard = bisect.bisect_right(self._starts, index) - 1
        path, etag = self.shards[shard]
        return path, etag, (index - self._starts[shard]) * self.sample_bytes

    def chunk_groups(self, chunk_size: int) -> list[list[int]]:
        """Sample indices grouped by the shard chunk (of ``chunk_size`` bytes) they start in."""
        groups: list[list[int]] = []
        for shard in range(len(self.shards)):
            first, stop = self._starts[shard], self._starts[shard + 1]
            per_chunk: dict[int, list[int]] = defaultdict(list)
            for index in range(first, stop):
                per_chunk[(index - first) * self.sample_bytes // chunk_size].append(index)
            groups.extend(per_chunk[c] for c in sorted(per_chunk))
        return groups

    def __getitem__(self, index: int) -> torch.Tensor:
        path, etag, offset = self.locate(index)
        return self._tensor(self.client.read(path, offset, self.sample_bytes, etag=etag,
                                             plan=getattr(index, "plan", None)))

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        """A whole batch at once: the reads of all its shards go out concurrently.

        Indices from a :class:`PlannedSampler` carry their plan, and the reads say so.
        """
        by_shard: dict[tuple[str, str, str | None], list[tuple[int, int]]] = defaultdict(list)
        for position, index in enumerate(indices):
            path, etag, offset = self.locate(index)
            by_shard[(path, etag, getattr(index, "plan", None))].append((position, offset))
        out: list[torch.Tensor | None] = [None] * len(indices)
        got = self.client.read_objects(
            [(path, [(offset, self.sample_bytes) for _, offset in wanted], etag, plan)
             for (path, etag, plan), wanted in by_shard.items()])
        for wanted, datas in zip(by_shard.values(), got, strict=True):
            for (position, _), data in zip(wanted, datas, strict=True):
                out[position] = self._tensor(data)
        return [t for t in out if t is not None]

    def _tensor(self, data: bytes) -> torch.Tensor:
        if len(data) != self.sample_bytes:
            raise OSError(f"short sample: {len(data)} of {self.sample_bytes} bytes")
        return torch.frombuffer(bytearray(data), dtype=self.dtype).to(torch.int64)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PlannedIndex(int):
    """A sample index that carries the id of the read plan it belongs to.

    It travels from the sampler (main process) to the DataLoader workers with the
    index itself, so a persistent worker reads under whichever epoch's plan its batch
    was drawn in, with no state shared behind the loader's back.
    """

    plan: str | None

    def __new__(cls, value: int, plan: str | None) -> PlannedIndex:
        index = super().__new__(cls, value)
        index.plan = plan
        return index

    def __reduce__(self) -> tuple[type[PlannedIndex], tuple[int, str | None]]:
        return PlannedIndex, (int(self), self.plan)


class PlannedSampler(Sampler[int]):
    """A shuffling sampler that tells the spoke each epoch's reads before making them.

    Each epoch (``set_epoch``; without it, each new pass is the next epoch) draws a
    permutation from ``seed`` and the epoch, registers it (epoch 0's when the sampler
    is made, unless ``register_now=False``; a later one at ``set_epoch``, or else
    before its first index is yielded) with the spoke as a read
    plan (``POST /plans``) followed by the first ``lookahead`` of the next epoch's
    reads, so the spoke's prefetch runs on across the epoch boundary (only a part:
    a read of the epoch's end that the next epoch's start repeats is ambiguous to the
    spoke's cursor, and a whole second epoch made every read so), and yields
    :class:`PlannedIndex` values that name the plan, so reads from DataLoader workers
    follow it. The plan of the epoch before is dropped once the new one is registered.

    Distributed: ``rank`` and ``world_size`` (by default ``torch.distributed``'s when
    it is initialised, else 0 and 1). The plan is the job's global order; rank ``r``
    reads every ``world_size``-th sample of it from the ``r``-th on, padded so that
    ranks read equally many (or cut, with ``drop_last``). Ranks share one plan: each
    names the epoch's plan after the job (``job``; by default a token rank 0 draws
    and broadcasts under ``torch.distributed``, ``$TORCHELASTIC_RUN_ID`` under
    torchrun, else, for several ranks, a digest of the dataset, seed and layout, and
    a fresh token for a single one), and the spoke makes one plan per name.

    ``shard_aware``: shuffle chunk groups and read inside a window of ``window`` of
    them at a time (see :mod:`spoke.client.orders`), for datasets larger than the
    cache. ``chunk_size`` is the hub's (``--chunk-size``).

    If the endpoint takes no plans (a hub, or a spoke that refuses), the sampler logs
    a warning and yields plain indices: training goes on without the plan.
    """

    def __init__(
        self,
        dataset: ShardedSamples,
        seed: int = 0,
        shuffle: bool = True,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        shard_aware: bool = False,
        window: int = 16,
        chunk_size: int = 4 << 20,
        job: str | None = None,
        lookahead: float = 0.25,
        register_now: bool = True,
    ) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        if shard_aware and (window < 1 or chunk_size < 1):
            raise ValueError("window and chunk_size must be positive")
        if not 0 <= lookahead <= 1:
            raise ValueError(f"lookahead is a fraction of an epoch, not {lookahead}")
        self.dataset = dataset
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.shard_aware = shard_aware
        self.window = window
        self.lookahead = lookahead
        self._groups = dataset.chunk_groups(chunk_size) if shard_aware else None
        if job is not None:
            try:
                parse_job(f"{job}/e0")
            except ProtocolError as exc:
                raise ValueError(str(exc)) from None
        self.job = job or self._default_job(distributed, chunk_size)
        self.epoch = 0
        self._epoch_given = False
        self._started = False
        self._orders: dict[int, list[int]] = {}
        self.plan_id: str | None = None  # the plan of the epoch being read
        self._registered: int | None = None  # the epoch plan_id is of
        self._warned = False
        if register_now:
            # The loader's workers and the job's model are made after the sampler:
            # the spoke fetches the first batches meanwhile. A job that resumes at a
            # later epoch says register_now=False (or its set_epoch drops this plan).
            self._register(self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, and tell the spoke now: while the loader starts its
        workers (and a job its model), the spoke is already fetching."""
        self.epoch = epoch
        self._epoch_given = True
        self._register(epoch)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.world_size if self.drop_last else -(-n // self.world_size)

    def order(self, epoch: int) -> list[int]:
        """The job's global order of ``epoch`` (padded to whole rounds of ranks)."""
        if epoch not in self._orders:
            if self._groups is not None and self.shuffle:
                raw = shard_aware_order(self._groups, self.seed, epoch, self.window)
            else:
                raw = uniform_order(len(self.dataset), self.seed, epoch, self.shuffle)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = padded(raw, self.world_size, self.drop_last)
        return self._orders[epoch]

    def __iter__(self) -> Iterator[int]:
        if self._started and not self._epoch_given:
            self.epoch += 1
        self._started, self._epoch_given = True, False
        epoch = self.epoch
        plan = self.plan_id if self._registered == epoch else self._register(epoch)
        for index in rank_share(self.order(epoch), self.rank, self.world_size):
            yield PlannedIndex(index, plan) if plan is not None else index

    def _reads(self, epoch: int, lookahead: float) -> list[tuple[str, int, int]]:
        """``epoch``'s reads, then the first ``lookahead`` of the next epoch's."""
        following = self.order(epoch + 1)
        indices = self.order(epoch) + following[:math.ceil(lookahead * len(following))]
        size = self.dataset.sample_bytes
        reads = []
        for index in indices:
            path, _, offset = self.dataset.locate(index)
            reads.append((path, offset, size))
        return reads

    def _register(self, epoch: int) -> str | None:
        """Book this epoch's plan (and the next epoch's reads after it); drop the last."""
        if self._registered == epoch:
            return self.plan_id
        self._registered = epoch
        previous = self.plan_id
        job = f"{self.job}/e{epoch}"
        try:
            try:
                self.plan_id = self.dataset.client.create_plan(
                    self._reads(epoch, self.lookahead), job=job)
            except HubspokeError as exc:
                if not self.lookahead or exc.status != 400:
                    raise
                # With the next epoch's there may be more reads than a plan may hold.
                self.plan_id = self.dataset.client.create_plan(self._reads(epoch, 0), job=job)
        except HubspokeError as exc:
            if not self._warned:
                logger.warning("%s takes no read plan (%s); reading without one",
                               self.dataset.client.endpoint, exc)
                self._warned = True
            self.plan_id = None
        if previous is not None and previous != self.plan_id:
            # Another rank may have dropped it already; and training goes on if the
            # spoke cannot drop it now.
            with contextlib.suppress(HubspokeError):
                self.dataset.client.delete_plan(previous)
        return self.plan_id

    def _default_job(self, distributed: bool, chunk_size: int) -> str:
        if distributed:
            token = [secrets.token_hex(8) if self.rank == 0 else None]
            dist.broadcast_object_list(token, src=0)
            return f"job-{token[0]}"
        run_id = os.environ.get("TORCHELASTIC_RUN_ID")
        if run_id:
            return f"run-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"
        if self.world_size == 1:
            return f"job-{secrets.token_hex(8)}"
        layout = (self.dataset.client.endpoint, self.dataset.shards, self.dataset.sample_bytes,
                  self.seed, self.shuffle, self.world_size, self.drop_last, self.shard_aware,
                  self.window, chunk_size)
        return f"ds-{hashlib.sha256(repr(layout).encode()).hexdigest()[:16]}"
