"""S3-FIFO, as libCacheSim has it, sized in bytes."""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import TypeVar

from spoke.policy.base import EvictionPolicy, SizedQueue, check_capacity, check_size, drain

__all__ = ["S3FIFOPolicy"]

K = TypeVar("K", bound=Hashable)


class S3FIFOPolicy(EvictionPolicy[K]):
    """S3-FIFO (Yang et al., SOSP'23 "FIFO queues are all you need for cache eviction"),
    as its authors' reference implementation, libCacheSim's ``S3FIFO.c``, has it.

    New keys enter a small FIFO S (10% of capacity); keys evicted from S move to the main
    FIFO M if they were hit at least twice there, else they leave a ghost in G. A key
    whose ghost is in G enters M directly. M reinserts a key while its frequency
    (hits, capped at 3, decremented per reinsertion) is positive; otherwise evicts it.

    Where libCacheSim departs from the paper's Algorithm 1 we follow libCacheSim, the
    published behaviour (``loadtest/crosscheck_s3fifo.py`` checks that we stay within
    1 pp of it; the paper's version differed from it by up to 8 pp on the simulator's
    traces):

    * until the first eviction, a new key goes to M once S is at its target, so the
      keys that filled the cache are not all flushed through S;
    * a key moved from S to M starts over with frequency 0;
    * M yields when it is over its target or S is empty, else S does; a promotion from
      S never evicts from M by itself.

    libCacheSim refuses (serves uncached) an object at least as large as S; a policy
    here must take every fill, so such an object simply enters S.

    G holds keys only, but remembers each one's size so that it can be bounded in bytes
    like M: G's remembered bytes never exceed M's target (capacity minus S's target).
    """

    name: str = "s3fifo"
    MAX_FREQ = 3
    MOVE_TO_MAIN = 2  # hits in S that earn a key its place in M
    SMALL_DIVISOR = 10  # S targets 1/10 of the capacity

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = check_capacity(capacity_bytes)
        self.small_target_bytes = capacity_bytes // self.SMALL_DIVISOR
        self.main_target_bytes = capacity_bytes - self.small_target_bytes
        self._small: SizedQueue[K] = SizedQueue()
        self._main: SizedQueue[K] = SizedQueue()
        self._ghost: SizedQueue[K] = SizedQueue()
        self._freq: dict[K, int] = {}  # exactly the resident keys
        self._has_evicted = False

    def __contains__(self, key: object) -> bool:
        return key in self._freq

    def __len__(self) -> int:
        return len(self._freq)

    @property
    def resident_bytes(self) -> int:
        """Sum of the sizes of the resident entries (S and M)."""
        return self._small.bytes + self._main.bytes

    def frequency(self, key: K) -> int | None:
        """Resident ``key``'s hit counter (0..3), or None if it is not resident."""
        return self._freq.get(key)

    def segments(self) -> dict[str, list[K]]:
        """The queues S, M and G (oldest first), for debugging and tests."""
        queues = {"small": self._small, "main": self._main, "ghost": self._ghost}
        return {name: list(queue) for name, queue in queues.items()}

    def admit(self, key: K) -> None:
        """Note a ghost hit by making ``key`` G's newest entry.

        The evictions that make room for ``key`` push ghosts into G; refreshing it keeps
        the hit from aging out of G before insert() looks for it. (libCacheSim takes the
        ghost out at once; with concurrent fills a ghost hit must survive until its own
        insert(), and the one extra ghost it keeps meanwhile is within the cross-check's
        noise.)
        """
        if key in self._ghost:
            self._ghost.refresh(key)

    def evict(self, incoming: K | None = None) -> K | None:
        """Evict from M while it is over its target (or S is empty), else from S."""
        self._has_evicted = True
        if self._main.bytes > self.main_target_bytes or not self._small:
            return self._evict_main()
        while self._small:
            key, size = self._small.pop_oldest()
            if self._freq[key] >= self.MOVE_TO_MAIN:
                self._freq[key] = 0
                self._main.push(key, size)
            else:
                del self._freq[key]
                self._remember(key, size)
                return key
        # Everything in S was promoted: M yields instead.
        return self._evict_main()

    def _evict_main(self) -> K | None:
        # Terminates: each pass over a key decrements its frequency (at most 3 passes).
        while self._main:
            key, size = self._main.pop_oldest()
            if self._freq[key] > 0:
                self._freq[key] -= 1
                self._main.push(key, size)
            else:
                del self._freq[key]
                return key
        return None

    def _remember(self, key: K, size: int) -> None:
        self._ghost.push(key, size)
        while self._ghost and self._ghost.bytes > self.main_target_bytes:
            self._ghost.pop_oldest()

    def insert(self, key: K, size: int) -> None:
        """New keys enter S, keys with a ghost enter M; a resident key is resized and hit."""
        check_size(size)
        if key in self._freq:
            queue = self._small if key in self._small else self._main
            queue.resize(key, size)
            self.touch(key)
            return
        from_ghost = self._ghost.pop(key) is not None
        filling = not self._has_evicted and self._small.bytes >= self.small_target_bytes
        (self._main if from_ghost or filling else self._small).push(key, size)
        self._freq[key] = 0

    def touch(self, key: K) -> None:
        """A hit: count it (capped at 3); queues are not reordered, as FIFO promises."""
        freq = self._freq.get(key)
        if freq is not None:
            self._freq[key] = min(freq + 1, self.MAX_FREQ)

    def remove(self, key: K) -> None:
        """Forget resident ``key`` without leaving a ghost."""
        if self._freq.pop(key, None) is not None and self._small.pop(key) is None:
            self._main.pop(key)

    def keys(self) -> list[K]:
        """Resident keys in the order successive ``evict()`` calls would return them."""
        clone = copy.copy(self)
        clone._small, clone._main = self._small.copy(), self._main.copy()
        clone._ghost, clone._freq = self._ghost.copy(), dict(self._freq)
        return drain(clone)
