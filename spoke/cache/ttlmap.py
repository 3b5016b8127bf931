"""TTLMap: a dict whose entries expire a fixed time after they were set.

What the spoke needs for manifests on its hottest path: one dict lookup and one
clock read per ``get`` (cachetools' ``TTLCache`` costs several times that, for
per-access bookkeeping this use has no need of).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLMap(Generic[K, V]):
    def __init__(
        self, maxsize: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.maxsize = maxsize
        self.ttl_s = ttl_s
        self._clock = clock
        self._items: dict[K, tuple[float, V]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        """The value set for ``key`` less than ``ttl_s`` ago, else None."""
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= self._clock():
            del self._items[key]
            return None
        return item[1]

    def __setitem__(self, key: K, value: V) -> None:
        self._items.pop(key, None)  # re-set: now the newest, for the size bound
        self._items[key] = (self._clock() + self.ttl_s, value)
        if len(self._items) > self.maxsize:
            # The oldest set goes first: with one TTL, also the first to expire.
            del self._items[next(iter(self._items))]

    def time_left(self, key: K) -> float:
        """Seconds until ``key`` expires; 0 when it has or is not set."""
        item = self._items.get(key)
        return 0.0 if item is None else max(0.0, item[0] - self._clock())

    def live_items(self) -> Iterator[tuple[K, V, float]]:
        """(key, value, expiry on the clock) of each entry not yet expired."""
        now = self._clock()
        for key, (expires_at, value) in list(self._items.items()):
            if expires_at > now:
                yield key, value, expires_at

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._items.pop(key, None)
        return default if item is None else item[1]
