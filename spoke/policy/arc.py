"""ARC, the Adaptive Replacement Cache, generalised to byte sizes."""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import TypeVar

from spoke.policy.base import EvictionPolicy, SizedQueue, check_capacity, check_size, drain

__all__ = ["ARCPolicy"]

K = TypeVar("K", bound=Hashable)


def _delta(ghost_size: int, other_ghost_bytes: int, own_ghost_bytes: int) -> float:
    """ARC's step for p, in bytes: the ghost's size times max(1, |other ghost| / |own ghost|).

    A real ratio, as in the paper: rounding it down to whole ghosts biased p towards the
    list whose ghosts are hit more rarely (0.76 pp off the reference on a mixed trace).
    """
    if own_ghost_bytes <= 0:
        return float(ghost_size)
    return ghost_size * max(1.0, other_ghost_bytes / own_ghost_bytes)


class ARCPolicy(EvictionPolicy[K]):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03), generalised to byte sizes.

    T1 holds keys seen once recently, T2 keys seen at least twice; B1 and B2 remember
    keys evicted from T1 and T2 (ghosts, no data). ``p`` is the target size of T1.

    Byte generalisation: every list length |X| of the paper becomes the byte sum of X,
    and a ghost remembers the size its entry had when resident. A ghost hit moves p by
    the ghost's size times max(1, |B2|/|B1|) (B1 hit, p grows) or max(1, |B1|/|B2|)
    (B2 hit, p shrinks), clamped to [0, c] -- with unit sizes this is the paper's rule.
    The paper's directory bounds hold in bytes: |T1|+|B1| <= c and
    |T1|+|T2|+|B1|+|B2| <= 2c, kept by dropping the oldest ghosts after each insert
    (the paper drops them just before; with fixed sizes the outcome is the same).
    """

    name: str = "arc"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = check_capacity(capacity_bytes)
        self._p = 0.0
        self._t1: SizedQueue[K] = SizedQueue()
        self._t2: SizedQueue[K] = SizedQueue()
        self._b1: SizedQueue[K] = SizedQueue()
        self._b2: SizedQueue[K] = SizedQueue()

    @property
    def p(self) -> float:
        """The adaptive target size of T1, in bytes (0 <= p <= capacity_bytes), a real
        number as in the paper."""
        return self._p

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    @property
    def resident_bytes(self) -> int:
        """Sum of the sizes of the resident entries (T1 and T2)."""
        return self._t1.bytes + self._t2.bytes

    def segments(self) -> dict[str, list[K]]:
        """The four lists T1, T2, B1, B2 (oldest first), for debugging and tests."""
        queues = {"t1": self._t1, "t2": self._t2, "b1": self._b1, "b2": self._b2}
        return {name: list(queue) for name, queue in queues.items()}

    def admit(self, key: K) -> None:
        """Adapt p on a ghost hit: a B1 hit favours recency (p grows), B2 frequency.

        Only admit() adapts p; insert() of a ghost key moves it to T2 without adapting.
        """
        # The ghost stays in B1/B2 until insert(): evict(key) must still see it in B2.
        if key in self._b1:
            step = _delta(self._b1.size_of(key), self._b2.bytes, self._b1.bytes)
            self._p = min(float(self.capacity_bytes), self._p + step)
        elif key in self._b2:
            step = _delta(self._b2.size_of(key), self._b1.bytes, self._b2.bytes)
            self._p = max(0.0, self._p - step)

    def evict(self, incoming: K | None = None) -> K | None:
        """ARC's REPLACE: forget the oldest of T1 or T2, remember it in B1 or B2, return it."""
        source = self._replace_source(incoming)
        if source is None:
            return None
        key, size = source.pop_oldest()
        ghosts = self._b1 if source is self._t1 else self._b2
        ghosts.push(key, size)
        return key

    def _replace_source(self, incoming: K | None) -> SizedQueue[K] | None:
        if not self._t1 and not self._t2:
            return None
        over_target = self._t1.bytes > self._p
        # The paper's tie-break "x in B2 and |T1| = p": a B2 hit says T2 is worth more.
        at_target_for_b2_hit = incoming in self._b2 and self._t1.bytes >= self._p
        if self._t1 and (over_target or at_target_for_b2_hit or not self._t2):
            return self._t1
        return self._t2

    def insert(self, key: K, size: int) -> None:
        """Resident, ghost-hit or re-inserted keys go to T2 (seen twice), new keys to T1."""
        check_size(size)
        # A key lives in at most one of the four lists, so stopping at the first is fine.
        seen_before = any(queue.pop(key) is not None for queue in self._queues())
        (self._t2 if seen_before else self._t1).push(key, size)
        self._trim_ghosts()

    def _queues(self) -> tuple[SizedQueue[K], ...]:
        return (self._t1, self._t2, self._b1, self._b2)

    def _trim_ghosts(self) -> None:
        capacity = self.capacity_bytes
        while self._b1 and self._t1.bytes + self._b1.bytes > capacity:
            self._b1.pop_oldest()
        # Only B2 can push the total over 2c once |T1|+|B1| <= c, unless T1 alone is
        # oversize (an entry larger than the cache); then B1 goes too.
        for ghosts in (self._b2, self._b1):
            while ghosts and self._directory_bytes() > 2 * capacity:
                ghosts.pop_oldest()

    def _directory_bytes(self) -> int:
        return sum(queue.bytes for queue in self._queues())

    def touch(self, key: K) -> None:
        """A hit: move resident ``key`` to the most recent end of T2."""
        size = self._t1.pop(key)
        if size is None:
            size = self._t2.pop(key)
        if size is not None:
            self._t2.push(key, size)

    def remove(self, key: K) -> None:
        """Forget resident ``key`` without making it a ghost; ghost history is untouched."""
        if self._t1.pop(key) is None:
            self._t2.pop(key)

    def keys(self) -> list[K]:
        """Resident keys in the order successive ``evict()`` calls would return them."""
        clone = copy.copy(self)
        clone._t1, clone._t2 = self._t1.copy(), self._t2.copy()
        clone._b1, clone._b2 = self._b1.copy(), self._b2.copy()
        return drain(clone)
