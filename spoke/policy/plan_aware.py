"""PlanAwarePolicy: Belady on the part of the future that loaders told us.

When a loader has registered its read order (``POST /plans``), the spoke knows,
for the chunks that plan mentions, when each is needed next. Belady's rule is
then optimal for those chunks: evict the one whose next use is furthest away,
and do not admit a chunk whose next use is further than everything it would
push out (it would be evicted before it is used). Chunks no plan mentions are
ordered by the configured policy (LRU, ARC, S3-FIFO) and go first; and so that
jobs without a plan are not starved, planned chunks give way to them once they
hold more than ``planned_share`` of the capacity. Several plans share that part by
Belady's rule across all of them: ``next_use`` is the soonest use over every plan, on one
time scale (:class:`spoke.prefetch.plans.PlanBook`). A fair split of the cache between
plans fell well short of that with three jobs and a small cache (docs/policies.md).

A plan does not list every read: an evaluation pass, a retry, a sample read twice. A
chunk so re-read soon after its read would be lost to Belady's rule on the plan alone
(its planned use may be an epoch off). :class:`spoke.policy.reuse.UnforeseenReuse`
learns from the reads how soon such re-reads come and what holding a chunk for them
costs per hit, and each read chunk is *held* for that window, under Belady's rule at
that cost, when it beats the planned chunks it would displace; when the hold runs out
the chunk goes back to its planned distance, or to the base policy. Holds only compete
with planned chunks: without a plan the base policy decides alone.

Pure: the plan knowledge comes in as ``next_use(key)``, the distance in planned
reads to the key's next use after the current read (``inf`` when no plan needs
it any more). Stored
distances go stale as loaders read, so they are re-checked before a victim is
chosen (a bounded number of times per eviction).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from typing import Any, ClassVar, TypeVar

from spoke.policy.base import EvictionPolicy, check_size
from spoke.policy.reuse import UnforeseenReuse

__all__ = ["PlanAwarePolicy"]

K = TypeVar("K", bound=Hashable)
NextUse = Callable[[Any], float]

_MAX_RECHECKS = 64


class PlanAwarePolicy(EvictionPolicy[K]):
    """``base`` for the chunks no plan needs, Belady's rule for those a plan does.

    The one policy that declines fills (``may_decline``): a newcomer needed later than
    every resident planned chunk is turned away, counted in ``refused``, and
    ``would_keep`` predicts it before the chunk is fetched.
    """

    may_decline: ClassVar[bool] = True

    def __init__(
        self, base: EvictionPolicy[K], next_use: NextUse, planned_share: float = 0.9,
    ) -> None:
        self.base = base
        self.name = base.name
        self.capacity_bytes = base.capacity_bytes
        self.planned_share = planned_share
        self._next_use = next_use
        self._planned: dict[K, int] = {}  # resident keys under Belady's rule -> size
        self._planned_bytes = 0
        self._sizes: dict[K, int] = {}  # every resident key -> size
        self._bytes = 0  # sum of _sizes, kept as it changes (the simulator reads it per step)
        self._heap: list[tuple[float, int, K]] = []  # (-distance, tiebreak, key), lazy
        self._counter = 0
        self.refused = 0  # admissions declined because residents are needed sooner
        # Re-reads no plan announced, learnt; the keys read lately that it says to hold:
        # key -> (clock until which it is held, its cost per hit), and their expiry order.
        self.reuse: UnforeseenReuse[K] = UnforeseenReuse()
        self._held: dict[K, tuple[int, float]] = {}
        self._expiry: list[tuple[int, int, K]] = []  # (until, tiebreak, key), a heap
        self._held_unplanned: set[K] = set()  # under Belady's rule only while held

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def resident_bytes(self) -> int:
        return self._bytes

    def admit(self, key: K) -> None:
        self._read(key)
        self.base.admit(key)

    def evict(self, incoming: K | None = None) -> K | None:
        """An unplanned victim if there is one, else the planned key needed last.

        ``None`` when the incoming key is needed later than every resident planned
        key: admitting it could only cost hits (Belady's bypass).
        """
        victim = self._evict_unplanned(incoming)
        if victim is None:
            victim = self._evict_planned(incoming)
        if victim is not None:
            self._bytes -= self._sizes.pop(victim)
        return victim

    def insert(self, key: K, size: int) -> None:
        check_size(size)  # before any accounting: a planned key never reaches base.insert()
        self.remove(key)
        self._sizes[key] = size
        self._bytes += size
        distance = self._distance(key)
        if math.isinf(distance):
            self.base.insert(key, size)
        else:
            self._plan(key, size, distance)

    def touch(self, key: K) -> None:
        if key not in self._sizes:
            return
        self._read(key)
        if key in self._planned:
            self._push(key, self._distance(key))  # its next use moved on
            return
        distance = self._distance(key)
        if math.isinf(distance):
            self.base.touch(key)
        else:  # held for a re-read the plan does not foresee
            self.base.remove(key)
            self._plan(key, self._sizes[key], distance)

    def remove(self, key: K) -> None:
        old = self._sizes.pop(key, None)
        if old is None:
            return
        self._bytes -= old
        self._held_unplanned.discard(key)
        size = self._planned.pop(key, None)
        if size is None:
            self.base.remove(key)
        else:
            self._planned_bytes -= size

    def keys(self) -> list[K]:
        planned = sorted(self._planned, key=self._distance, reverse=True)
        return self.base.keys() + planned

    def would_keep(self, key: K) -> bool:
        """Whether ``key``, if fetched now, would be admitted (a cheap estimate).

        The rule of :meth:`_evict_planned` on the furthest distance the heap holds:
        kept unless needed later than it, and unplanned keys are kept while planned
        ones hold more than their share.
        """
        self._release(self.reuse.clock + 1)  # as the read would: no hold outlives it
        if len(self.base) or not self._heap:
            return True
        distance = self._next_use(key)
        if self._holding():
            _, cost = self.reuse.offer(self._kind(distance), self._furthest_hint())
            distance = min(distance, cost)
        if math.isinf(distance) and self._over_share():
            return True
        return distance <= -self._heap[0][0]

    def _evict_unplanned(self, incoming: K | None) -> K | None:
        while True:
            victim = self.base.evict(incoming)
            if victim is None:
                return None
            distance = self._next_use(victim)
            if math.isinf(distance):
                return victim
            # A plan needs it: keep it, under Belady's rule from now on.
            self._plan(victim, self._sizes[victim], distance)

    def _evict_planned(self, incoming: K | None) -> K | None:
        incoming_distance = math.inf if incoming is None else self._distance(incoming)
        victim, distance = self._furthest()
        if victim is None:
            return None
        unplanned_newcomer = math.isinf(incoming_distance)
        needed_sooner = distance < incoming_distance
        if needed_sooner and not (unplanned_newcomer and self._over_share()):
            self._push(victim, distance)
            self.refused += 1
            return None
        self._planned_bytes -= self._planned.pop(victim)
        self._held_unplanned.discard(victim)
        return victim

    def _over_share(self) -> bool:
        return self._planned_bytes > self.planned_share * self.capacity_bytes

    def _plan(self, key: K, size: int, distance: float) -> None:
        if math.isinf(self._next_use(key)):
            self._held_unplanned.add(key)
        self._planned[key] = size
        self._planned_bytes += size
        self._push(key, distance)

    def _furthest(self) -> tuple[K | None, float]:
        """The resident planned key with the furthest next use, popped from the heap."""
        best: tuple[float, K] | None = None
        for _ in range(_MAX_RECHECKS):
            if not self._heap:
                break
            negative, _, key = heapq.heappop(self._heap)
            if key not in self._planned:
                continue  # evicted or removed since it was pushed
            current = self._distance(key)
            if best is None or current > best[0]:
                if best is not None:
                    self._push(best[1], best[0])
                best = (current, key)
            else:
                self._push(key, current)
            if current >= -negative:
                break  # the entry was current: the heap order holds
        if best is None:
            return None, 0.0
        return best[1], best[0]

    def _read(self, key: K) -> None:
        """Learn from a read of ``key`` and hold it for the re-reads the plan misses, if
        holding is worth its room; let go of the keys whose hold ran out."""
        reuse = self.reuse
        self._release(reuse.clock + 1)  # the holds this read outlasts
        distance = self._next_use(key)
        # Offered before the read is learnt from, as would_keep() saw it just before.
        holding = self._holding()
        window, cost = reuse.offer(self._kind(distance), self._furthest_hint()) if holding \
            else (0, 0.0)
        reuse.read(key, distance, len(self._sizes))
        if window:
            until = reuse.clock + window
            self._held[key] = (until, cost)
            self._counter += 1
            heapq.heappush(self._expiry, (until, self._counter, key))
        else:
            self._held.pop(key, None)

    def _release(self, clock: int) -> None:
        expiry, held = self._expiry, self._held
        while expiry and expiry[0][0] <= clock:
            until, _, key = heapq.heappop(expiry)
            entry = held.get(key)
            if entry is None or entry[0] != until:
                continue  # read again since: held longer
            del held[key]
            if key not in self._planned:
                continue
            distance = self._next_use(key)
            if math.isinf(distance) and key in self._held_unplanned:
                # Back to the base policy, whose order it joins as a newcomer.
                self._held_unplanned.discard(key)
                self._planned_bytes -= self._planned.pop(key)
                self.base.insert(key, self._sizes[key])
            else:
                self._push(key, distance)  # further now: a fresh entry keeps the heap's order

    def _furthest_hint(self) -> float:
        """About the furthest next use of a resident planned chunk (the heap's top, which
        may be stale and so a little high): what a hold competes with."""
        return -self._heap[0][0] if self._heap else 0.0

    def _holding(self) -> bool:
        """Holds compete with planned chunks only: without a plan the base policy rules."""
        return len(self._planned) > len(self._held_unplanned)

    @staticmethod
    def _kind(distance: float) -> int:
        return 0 if math.isfinite(distance) else 1

    def _distance(self, key: K) -> float:
        """Belady's distance: the planned one, or a hold's cost per hit if lower."""
        distance = self._next_use(key)
        held = self._held.get(key)
        if held is not None and held[0] > self.reuse.clock and held[1] < distance:
            return held[1]
        return distance

    def _push(self, key: K, distance: float) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (-distance, self._counter, key))
        if len(self._heap) > 4 * len(self._planned) + 64:
            self._compact()

    def _compact(self) -> None:
        latest: dict[K, tuple[float, int, K]] = {}
        for entry in self._heap:
            key = entry[2]
            if key in self._planned and (key not in latest or entry[1] > latest[key][1]):
                latest[key] = entry
        self._heap = list(latest.values())
        heapq.heapify(self._heap)
