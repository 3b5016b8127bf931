"""ReuseAdmission: which misses may push out what the cache holds of a working set too large for it.

Every ``--policy`` admits each miss and then evicts by its own order. A training job reads
its whole dataset every epoch, in order or shuffled; when the dataset is larger than the
cache, admitting every miss cycles all of it through: each chunk is evicted before it is
read again. LRU and ARC then hit nothing on a loop and a few percent on shuffled epochs,
where Belady's optimum keeps a fixed part of the dataset and lets the rest pass by, hitting
as often as the cache's share of the dataset.

This gate, in front of any policy, gets near that from the reads alone:

* Each read notes the key's *reuse distance*: the reads since its previous read. The read
  clocks live in a direct-mapped table of a few slots per resident, so a key read too long
  ago, or never, counts as never seen.
* A miss re-read within about as many reads as the base policy holds entries, whose
  previous reuse was as short, is *short*: a policy that had kept it would have hit, twice
  in a row. It goes to the base policy, as without the gate. One short reuse alone is
  chance: a chunk read off-plan just before its planned read comes back an epoch later,
  and the resident the base would evict for it is due sooner.
* Any other miss is *long*. It does not push out the base's residents. It goes to a small
  FIFO of its own, the *probation* window, a few percent of the capacity, where a read
  soon after (a retry, a sample read twice, a DataLoader's reordering) still finds it. A
  second hit there moves it to the base policy: one hit is what a read-ahead's fill gets
  from the read it ran ahead of, and is no sign that the chunk comes back.
* A long miss read before does replace a *dead* resident instead: one idle for longer
  than the *horizon*, the longest reuse distance of recent reads. A chunk not read for
  longer than any chunk comes back belongs to a job that is over (or to a scan), so a new
  job's chunks take its place rather than the old ones staying for good. The horizon
  decays, so it follows a working set that shrinks.

W-TinyLFU decides by itself which misses may push out its residents (its frequency duel),
and the window would only take its place; but its counts keep a finished job's chunks for
epochs of the next job. In front of such a policy (``filters_admission``) the gate only
replaces dead residents, once a horizon is known, and gives them half a horizon more.

Nothing is declined: every fill is stored, in the base policy or in the window, so
callers and wrappers (:class:`~spoke.policy.plan_aware.PlanAwarePolicy`) see the
ordinary contract. The simulator's figures, with and without the gate, are in
docs/policies.md. Pure and standard library only: keys are opaque, sizes are bytes.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Hashable
from typing import TypeVar

from spoke.policy.base import EvictionPolicy, SizedQueue, check_size

__all__ = ["ReuseAdmission"]

K = TypeVar("K", bound=Hashable)

_NEVER = math.inf
_SLOTS_PER_ENTRY = 8  # read-clock slots per resident: what bounds the distances we see
_MIN_SLOTS = 4096
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: spreads Python's small-int hashes
_WORD = (1 << 64) - 1
_TAG_BITS = 16  # a slot holds (clock << 17) | (short << 16) | tag; the tag tells its key
_TAG_MASK = (1 << _TAG_BITS) - 1  # from a collision; ``short``: that read's reuse was short
_SHORT = 1 << _TAG_BITS
_CLOCK_SHIFT = _TAG_BITS + 1
# Fills sent to the window, remembered from their eviction to their insert (the cache
# stores a chunk after fetching it, with other reads between); a fill that fails is never
# inserted, so the oldest are forgotten past this many.
_MAX_BOUND = 4096
# A policy that filters its own admissions keeps its residents until they are idle this many
# horizons: a dataset that grows each epoch comes back a little later every time, and a
# resident its duel kept is not to be swept for being a little late.
_SWEEP_MARGIN = 1.5


class ReadClocks:
    """When each key was last read, in reads, for about ``_SLOTS_PER_ENTRY`` keys per
    resident: one machine word per slot, however large the keys."""

    __slots__ = ("_mask", "_slots", "clock", "was_short")

    def __init__(self) -> None:
        self.clock = 0
        self.was_short = False  # whether the key's previous read, too, came back soon
        self._slots = array("q", bytes(8 * _MIN_SLOTS))
        self._mask = _MIN_SLOTS - 1

    def read(self, key: Hashable, short: float) -> float:
        """Count a read of ``key``; the reads since its previous one, or inf if unknown.
        Notes whether that is at most ``short``, and sets :attr:`was_short` to what the
        previous read noted."""
        mixed = (hash(key) * _MIX) & _WORD
        mixed ^= mixed >> 29
        slot = (mixed >> _TAG_BITS) & self._mask
        tag = (mixed & _TAG_MASK) | 1  # never 0: an empty slot never matches
        previous = self._slots[slot]
        self.clock += 1
        if previous & _TAG_MASK != tag:
            self.was_short = False
            self._slots[slot] = (self.clock << _CLOCK_SHIFT) | tag
            return _NEVER
        self.was_short = bool(previous & _SHORT)
        distance = self.clock - (previous >> _CLOCK_SHIFT)
        noted = _SHORT if distance <= short else 0
        self._slots[slot] = (self.clock << _CLOCK_SHIFT) | noted | tag
        return float(distance)

    def fit(self, entries: int) -> None:
        """Grow to the slots ``entries`` residents call for. What the old slots held stays
        where it was, so about half of it is lost to the new mask: once per doubling."""
        want = _SLOTS_PER_ENTRY * entries
        size = self._mask + 1
        if want <= size:
            return
        while size < want:
            size *= 2
        grown = array("q", bytes(8 * size))
        grown[: self._mask + 1] = self._slots
        self._slots, self._mask = grown, size - 1


class ReuseAdmission(EvictionPolicy[K]):
    """``base`` for the misses that come back soon; a small FIFO for the others, unless
    they replace a resident whose job is over (see the module docstring)."""

    def __init__(self, base: EvictionPolicy[K], probation_share: float = 0.05) -> None:
        if base.may_decline:
            raise ValueError(f"ReuseAdmission gates a policy that keeps every fill; "
                             f"{base.name} turns some away itself")
        # A policy that filters its own admissions (W-TinyLFU): dead residents replaced,
        # no window, every other miss to its own duel.
        self.sweep_only = base.filters_admission
        self.base = base
        self.name = base.name
        self.capacity_bytes = base.capacity_bytes
        self.probation_bytes = probation_share * base.capacity_bytes
        self.reads = ReadClocks()
        self.horizon = 0.0  # a decaying maximum of the reuse distances of recent reads
        self.probation: SizedQueue[K] = SizedQueue()  # long misses, oldest first
        self._hit_once: set[K] = set()  # the window's keys read once since their fill
        self._idle: OrderedDict[K, int] = OrderedDict()  # base's residents -> last read
        # The miss making room, its reuse distance, and whether its reuse before was short.
        self._incoming: K | None = None
        self._distance = _NEVER
        self._was_short = False
        self._bound: OrderedDict[K, None] = OrderedDict()  # fills headed for the window
        self.promoted = 0  # probation hits moved to the base policy
        self.replaced_dead = 0  # base residents a long miss replaced

    def __contains__(self, key: object) -> bool:
        return key in self.base or key in self.probation

    def __len__(self) -> int:
        return len(self.base) + len(self.probation)

    @property
    def resident_bytes(self) -> int:
        return self.base.resident_bytes + self.probation.bytes

    @property
    def window_bytes(self) -> int:
        """The bytes of long misses waiting in the window."""
        return self.probation.bytes

    def admit(self, key: K) -> None:
        self._incoming, self._distance = key, self._read(key)
        self._was_short = self.reads.was_short
        self._bound.pop(key, None)
        self.base.admit(key)

    def evict(self, incoming: K | None = None) -> K | None:
        if self.sweep_only and incoming is not None and incoming == self._incoming:
            # Only once reuse is known: filling up, the policy's own duel decides.
            dead = self._dead_resident() if self.horizon else None
            return dead if dead is not None else self._evict_from_base(incoming)
        if incoming is None or incoming != self._incoming or self._is_short():
            return self._evict_from_base(incoming)
        dead = self._dead_resident()
        if dead is not None:
            return dead
        self._bound[incoming] = None
        if len(self._bound) > _MAX_BOUND:
            self._bound.popitem(last=False)
        probation = self.probation
        if probation and (probation.bytes >= self.probation_bytes or not len(self.base)):
            return self._pop_probation()
        # The window grows into its share, and past it by the long fills in flight at once
        # (a read-ahead's): each needs room before the one before it lands in the window.
        return self._evict_from_base(incoming)

    def insert(self, key: K, size: int) -> None:
        check_size(size)
        if key in self._bound:
            del self._bound[key]
            self.base.remove(key)
            self._idle.pop(key, None)
            self.probation.pop(key)
            self.probation.push(key, size)
        else:
            if self.probation.pop(key) is not None:
                self._hit_once.discard(key)
            self._into_base(key, size)
        self.reads.fit(len(self))

    def touch(self, key: K) -> None:
        idle = self._idle  # exactly the base's residents: one lookup on the hits' path
        if key in idle:
            self._read(key)
            idle[key] = self.reads.clock
            idle.move_to_end(key)
            self.base.touch(key)
        elif key in self.probation:
            self._read(key)
            if key not in self._hit_once:
                self._hit_once.add(key)
                return
            self._hit_once.discard(key)
            self.promoted += 1
            size = self.probation.pop(key)
            assert size is not None
            self._into_base(key, size)

    def remove(self, key: K) -> None:
        self._bound.pop(key, None)
        self._hit_once.discard(key)
        self.probation.pop(key)
        self._idle.pop(key, None)
        self.base.remove(key)

    def keys(self) -> list[K]:
        """In the order ``evict()`` with no incoming miss takes them: the base's, then the
        window's."""
        return self.base.keys() + list(self.probation)

    def _read(self, key: K) -> float:
        """Count a read; learn the horizon from its reuse distance."""
        distance = self.reads.read(key, self._short_limit())
        if distance != _NEVER:
            # Decays by about 1/e over 16 reads per resident: a few epochs of a dataset
            # the size of the cache, so a long-gone job's distances stop counting.
            horizon = self.horizon
            horizon -= horizon / (16 * len(self._idle) + 1)
            self.horizon = distance if distance > horizon else horizon
        return distance

    def _short_limit(self) -> int:
        """The longest reuse distance a policy holding the base's residents would hit."""
        return max(1, len(self._idle))

    def _is_short(self) -> bool:
        return self._distance <= self._short_limit() and self._was_short

    def _dead_resident(self) -> K | None:
        """A dead resident of the base, evicted, if the incoming miss was read before (or
        no reuse is known yet: a cache filling up). A chunk read for the first time may be
        a scan's, which would only take the place again."""
        if not self._idle or (self._distance == _NEVER and self.horizon):
            return None
        key, last_read = next(iter(self._idle.items()))
        margin = _SWEEP_MARGIN if self.sweep_only else 1.0
        if self.reads.clock - last_read <= self.horizon * margin:
            return None
        del self._idle[key]
        self.base.remove(key)
        self.replaced_dead += 1
        return key

    def _evict_from_base(self, incoming: K | None) -> K | None:
        victim = self.base.evict(incoming)
        if victim is None:
            return self._pop_probation() if self.probation else None
        self._idle.pop(victim, None)
        return victim

    def _pop_probation(self) -> K:
        key = self.probation.pop_oldest()[0]
        self._hit_once.discard(key)
        return key

    def _into_base(self, key: K, size: int) -> None:
        self.base.insert(key, size)
        self._idle[key] = self.reads.clock
        self._idle.move_to_end(key)
