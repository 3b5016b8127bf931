"""The eviction-policy contract and the byte-sized queue the policies are built from.

A policy only keeps order and names victims; it knows nothing of disks, files or asyncio.
The caller owns the bytes and enforces capacity, in the cachetools style
(``Cache.__setitem__`` pops items until the new one fits)::

    policy.admit(key)                                   # a miss for key is about to be filled
    while used + size > policy.capacity_bytes:
        victim = policy.evict(key)                      # caller deletes victim's bytes
        if victim is None:
            break                                       # serve key without storing it
        ...
    policy.insert(key, size)                            # key is now resident (if it fits)

Hits call ``touch(key)``; deletions the policy did not ask for call ``remove(key)``.
Every operation is O(1) (S3-FIFO's eviction is amortised O(1)); ``keys()`` is O(n)
and only meant for debugging and tests.

What a policy may decline is part of the contract, with defaults for the policies that
decline nothing (LRU, ARC, S3-FIFO, W-TinyLFU take every fill), so that callers ask
instead of probing for attributes:

* ``may_decline``: whether ``evict(incoming)`` may return None while keys are still
  resident, turning the incoming fill away (the caller serves it without storing it);
* ``refused``: how many fills were turned away so;
* ``would_keep(key)``: a cheap hint, before any fetch, whether a fill of ``key`` would be
  kept if it needed room; callers skip optional work (a prefetch) on False.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import ClassVar, Generic, TypeVar

__all__ = ["EvictionPolicy", "SizedQueue", "check_capacity", "check_size", "drain"]

K = TypeVar("K", bound=Hashable)


class EvictionPolicy(ABC, Generic[K]):
    """What the chunk cache needs from an eviction policy (see the module docstring)."""

    name: str
    capacity_bytes: int
    may_decline: ClassVar[bool] = False
    # Whether the policy decides itself which misses may push out its residents (W-TinyLFU's
    # frequency duel): then the reuse gate (spoke.policy.admission) only sweeps dead ones.
    filters_admission: ClassVar[bool] = False
    refused: int = 0  # a declining policy counts each decline in its own attribute

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident."""

    @abstractmethod
    def __len__(self) -> int:
        """How many entries are resident."""

    @property
    @abstractmethod
    def resident_bytes(self) -> int:
        """Sum of the sizes of the resident entries."""

    @abstractmethod
    def admit(self, key: K) -> None:
        """A miss for ``key`` is about to be filled; called once per fill, before evict()."""

    @abstractmethod
    def evict(self, incoming: K | None = None) -> K | None:
        """Forget a resident victim and return it; None when nothing is resident, or,
        if ``may_decline``, when ``incoming`` is not worth any resident (counted in
        ``refused``)."""

    @abstractmethod
    def insert(self, key: K, size: int) -> None:
        """``key`` is resident with ``size`` bytes; re-inserting a resident key is an access."""

    @abstractmethod
    def touch(self, key: K) -> None:
        """A hit on ``key``; no-op if it is not resident."""

    @abstractmethod
    def remove(self, key: K) -> None:
        """Forget resident ``key`` without leaving history; no-op if it is not resident."""

    @abstractmethod
    def keys(self) -> list[K]:
        """Resident keys in eviction order: the first is the next victim."""

    def would_keep(self, key: K) -> bool:
        """Whether a fill of ``key`` that needs room would be kept: always, unless
        ``may_decline``, in which case False says it would most likely be turned away."""
        return True


def check_capacity(capacity_bytes: int) -> int:
    """``capacity_bytes``, if it is a valid capacity (not negative)."""
    if capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
    return capacity_bytes


def check_size(size: int) -> int:
    """``size``, if it is a valid entry size (not negative)."""
    if size < 0:
        raise ValueError(f"entry size must be >= 0 bytes, got {size}")
    return size


def drain(policy: EvictionPolicy[K]) -> list[K]:
    """Evict everything from ``policy`` (a throwaway copy), in order: how ``keys()`` is
    computed by policies whose eviction order is not one queue's."""
    victims: list[K] = []
    while (victim := policy.evict()) is not None:
        victims.append(victim)
    return victims


class SizedQueue(Generic[K]):
    """Keys in insertion order (oldest first), each with a byte size, and their byte total."""

    __slots__ = ("_sizes", "bytes")

    def __init__(self) -> None:
        self._sizes: OrderedDict[K, int] = OrderedDict()
        self.bytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> Iterator[K]:
        return iter(self._sizes)

    def push(self, key: K, size: int) -> None:
        """Append absent ``key`` at the newest end."""
        self._sizes[key] = size
        self.bytes += size

    def pop(self, key: K) -> int | None:
        """Drop ``key`` and return its size, or None if absent."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self.bytes -= size
        return size

    def pop_oldest(self) -> tuple[K, int]:
        """Drop and return the oldest key and its size; the queue must not be empty."""
        key, size = self._sizes.popitem(last=False)
        self.bytes -= size
        return key, size

    def size_of(self, key: K) -> int:
        """The size of present ``key``."""
        return self._sizes[key]

    def resize(self, key: K, size: int) -> None:
        """Change present ``key``'s size, keeping its place."""
        self.bytes += size - self._sizes[key]
        self._sizes[key] = size

    def refresh(self, key: K) -> None:
        """Move present ``key`` to the newest end."""
        self._sizes.move_to_end(key)

    def copy(self) -> SizedQueue[K]:
        """An independent queue with the same keys, sizes and order."""
        clone: SizedQueue[K] = SizedQueue()
        clone._sizes = self._sizes.copy()
        clone.bytes = self.bytes
        return clone
