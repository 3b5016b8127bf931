"""Epoch orders for a training job: which sample each rank reads, in which order.

Pure and deterministic: every rank of a job computes the same global order from the
same seed and epoch, and takes its share of it, so one plan (the global order) can
describe the reads of all of them. A rank's share is every ``world_size``-th sample
of the global order, as ``DistributedSampler`` does, so ranks moving at one pace read
the plan front to back together.

Two shuffles:

- ``uniform``: a permutation of every sample.
- ``shard_aware``: the samples are grouped by the chunk they start in; the groups are
  shuffled, then taken ``window`` groups at a time, and the samples of those groups
  are shuffled among themselves. At any time the job reads from at most ``window``
  chunks (per rank share, the same ones), so a cache of ``window`` chunks keeps
  every chunk until all its samples are read, however large the dataset. The price
  is randomness: a sample's neighbours in the order come from ``window`` chunks, not
  from the whole dataset (MosaicML Streaming's py1e and WebDataset's shard shuffle
  with a sample buffer make the same trade).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence


def epoch_rng(seed: int, epoch: int) -> random.Random:
    """The generator of ``epoch``'s order: the same on every rank and every machine."""
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def uniform_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    order = list(range(n))
    if shuffle:
        epoch_rng(seed, epoch).shuffle(order)
    return order


def shard_aware_order(groups: Sequence[Sequence[int]], seed: int, epoch: int,
                      window: int) -> list[int]:
    """Groups shuffled, then the samples of each ``window`` consecutive groups shuffled."""
    if window < 1:
        raise ValueError(f"window must be at least 1 group, not {window}")
    rng = epoch_rng(seed, epoch)
    shuffled = list(groups)
    rng.shuffle(shuffled)
    order: list[int] = []
    for start in range(0, len(shuffled), window):
        block = [i for group in shuffled[start:start + window] for i in group]
        rng.shuffle(block)
        order.extend(block)
    return order


def padded(order: Sequence[int], world_size: int, drop_last: bool) -> list[int]:
    """``order`` cut or padded (from its start) to a multiple of ``world_size``, so every
    rank reads as many samples: ranks that stepped unevenly would stall a job."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    if drop_last:
        return list(order[:len(order) - len(order) % world_size])
    out = list(order)
    while out and len(out) % world_size:
        out.extend(order[:world_size - len(out) % world_size])
    return out


def rank_share(order: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s reads of the (padded) global ``order``, in order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    return list(order[rank::world_size])
