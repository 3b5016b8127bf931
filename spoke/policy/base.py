"""Eviction policies for the spoke's chunk cache: LRU, ARC, S3-FIFO and (in
:mod:`spoke.policy.tinylfu`) W-TinyLFU, sized in bytes.

A policy only keeps order and names victims; it knows nothing of disks, files or asyncio.
The caller owns the bytes and enforces capacity, in the cachetools style
(``Cache.__setitem__`` pops items until the new one fits)::

    policy.admit(key)                                   # a miss for key is about to be filled
    while used + size > policy.capacity_bytes:
        victim = policy.evict(key)                      # caller deletes victim's bytes
        ...
    policy.insert(key, size)                            # key is now resident

Hits call ``touch(key)``; deletions the policy did not ask for call ``remove(key)``.
Every operation is O(1) (S3-FIFO's eviction is amortised O(1)); ``keys()`` is O(n)
and only meant for debugging and tests.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = [
    "POLICY_NAMES",
    "ARCPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "S3FIFOPolicy",
    "make_policy",
]

K = TypeVar("K", bound=Hashable)

POLICY_NAMES: tuple[str, ...] = ("arc", "lru", "s3fifo", "wtinylfu")


@runtime_checkable
class EvictionPolicy(Protocol[K]):
    """What the chunk cache needs from an eviction policy (see the module docstring)."""

    name: str
    capacity_bytes: int

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident."""
        ...

    def __len__(self) -> int:
        """How many entries are resident."""
        ...

    @property
    def resident_bytes(self) -> int:
        """Sum of the sizes of the resident entries."""
        ...

    def admit(self, key: K) -> None:
        """A miss for ``key`` is about to be filled; called once per fill, before evict()."""
        ...

    def evict(self, incoming: K | None = None) -> K | None:
        """Forget a resident victim and return it; None when nothing is resident."""
        ...

    def insert(self, key: K, size: int) -> None:
        """``key`` is resident with ``size`` bytes; re-inserting a resident key is an access."""
        ...

    def touch(self, key: K) -> None:
        """A hit on ``key``; no-op if it is not resident."""
        ...

    def remove(self, key: K) -> None:
        """Forget resident ``key`` without leaving history; no-op if it is not resident."""
        ...

    def keys(self) -> list[K]:
        """Resident keys in eviction order: the first is the next victim."""
        ...


def _check_capacity(capacity_bytes: int) -> int:
    if capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
    return capacity_bytes


def _check_size(size: int) -> int:
    if size < 0:
        raise ValueError(f"entry size must be >= 0 bytes, got {size}")
    return size


class _Queue(Generic[K]):
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

    def copy(self) -> _Queue[K]:
        """An independent queue with the same keys, sizes and order."""
        clone: _Queue[K] = _Queue()
        clone._sizes = self._sizes.copy()
        clone.bytes = self.bytes
        return clone


class LRUPolicy(Generic[K]):
    """Least recently used: the victim is the resident key untouched for longest."""

    name: str = "lru"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = _check_capacity(capacity_bytes)
        self._lru: _Queue[K] = _Queue()  # oldest = least recently used

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
        _check_size(size)
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


def _delta(ghost_size: int, other_ghost_bytes: int, own_ghost_bytes: int) -> int:
    """ARC's step for p, in bytes: the ghost's size times max(1, |other ghost| / |own ghost|)."""
    if own_ghost_bytes <= 0:
        return ghost_size
    return ghost_size * max(own_ghost_bytes, other_ghost_bytes) // own_ghost_bytes


class ARCPolicy(Generic[K]):
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
        self.capacity_bytes = _check_capacity(capacity_bytes)
        self._p = 0
        self._t1: _Queue[K] = _Queue()
        self._t2: _Queue[K] = _Queue()
        self._b1: _Queue[K] = _Queue()
        self._b2: _Queue[K] = _Queue()

    @property
    def p(self) -> int:
        """The adaptive target size of T1, in bytes (0 <= p <= capacity_bytes)."""
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
            self._p = min(self.capacity_bytes, self._p + step)
        elif key in self._b2:
            step = _delta(self._b2.size_of(key), self._b1.bytes, self._b2.bytes)
            self._p = max(0, self._p - step)

    def evict(self, incoming: K | None = None) -> K | None:
        """ARC's REPLACE: forget the oldest of T1 or T2, remember it in B1 or B2, return it."""
        source = self._replace_source(incoming)
        if source is None:
            return None
        key, size = source.pop_oldest()
        ghosts = self._b1 if source is self._t1 else self._b2
        ghosts.push(key, size)
        return key

    def _replace_source(self, incoming: K | None) -> _Queue[K] | None:
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
        _check_size(size)
        # A key lives in at most one of the four lists, so stopping at the first is fine.
        seen_before = any(queue.pop(key) is not None for queue in self._queues())
        (self._t2 if seen_before else self._t1).push(key, size)
        self._trim_ghosts()

    def _queues(self) -> tuple[_Queue[K], ...]:
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
        return _drain(clone)


class S3FIFOPolicy(Generic[K]):
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
        self.capacity_bytes = _check_capacity(capacity_bytes)
        self.small_target_bytes = capacity_bytes // self.SMALL_DIVISOR
        self.main_target_bytes = capacity_bytes - self.small_target_bytes
        self._small: _Queue[K] = _Queue()
        self._main: _Queue[K] = _Queue()
        self._ghost: _Queue[K] = _Queue()
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
        _check_size(size)
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
        return _drain(clone)


def _drain(policy: EvictionPolicy[K]) -> list[K]:
    """Evict everything from ``policy`` (a throwaway copy), in order."""
    victims: list[K] = []
    while (victim := policy.evict()) is not None:
        victims.append(victim)
    return victims


def _wtinylfu(capacity_bytes: int) -> EvictionPolicy[Any]:
    # Imported here: spoke.policy.tinylfu builds on this module's queue.
    from spoke.policy.tinylfu import WTinyLFUPolicy

    return WTinyLFUPolicy(capacity_bytes)


_FACTORIES: dict[str, Callable[[int], EvictionPolicy[Any]]] = {
    "arc": ARCPolicy,
    "lru": LRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "wtinylfu": _wtinylfu,
}


def make_policy(name: str, capacity_bytes: int) -> EvictionPolicy[Any]:
    """A new, empty policy called ``name`` (one of POLICY_NAMES) for ``capacity_bytes``."""
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(POLICY_NAMES)
        raise ValueError(f"unknown eviction policy {name!r}; choose one of {known}")
    return factory(capacity_bytes)
