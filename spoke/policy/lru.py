"""LRU: the victim is the resident key untouched for longest."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from spoke.policy.base import EvictionPolicy, SizedQueue, check_capacity, check_size

__all__ = ["LRUPolicy"]

K = TypeVar("K", bound=Hashable)


class LRUPolicy(EvictionPolicy[K]):
    """Least recently used: the victim is the resident key untouched for longest."""

    name: str = "lru"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = check_capacity(capacity_bytes)
        self._lru: SizedQueue[K] = SizedQueue()  # oldest = least recently used

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def resident_bytes(self) -> int:
        """Sum of the sizes of the resident entries."""
        return self._lru.bytes

    def admit(self, key: K) -> None:
        """No-op: LRU keeps no history of evicted keys."""

    def evict(self, incoming: K | None = None) -> K | None:
        """Forget and return the least recently used key; None when empty."""
        if not self._lru:
            return None
        return self._lru.pop_oldest()[0]

    def insert(self, key: K, size: int) -> None:
        """Make ``key`` the most recently used entry, with ``size`` bytes."""
        check_size(size)
        self._lru.pop(key)
        self._lru.push(key, size)

    def touch(self, key: K) -> None:
        """Make resident ``key`` the most recently used entry."""
        if key in self._lru:
            self._lru.refresh(key)

    def remove(self, key: K) -> None:
        """Forget resident ``key``."""
        self._lru.pop(key)

    def keys(self) -> list[K]:
        """Resident keys, least recently used first."""
        return list(self._lru)
