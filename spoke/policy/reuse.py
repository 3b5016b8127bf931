"""UnforeseenReuse: how soon chunks come back that no plan announced, learnt from the reads.

A plan tells the spoke when each chunk it lists is needed next; it says nothing of the
reads it does not list (an evaluation pass, a retry, a sample read twice). Those are
not random either: a chunk just read is often read again soon. Belady's rule on the plan
alone evicts such a chunk at once (its planned use is an epoch away) and loses the
re-read; a plan-less policy keeps it by recency but knows nothing of the plan.

This learns, from the stream of reads, what keeping a chunk for the unannounced re-reads
is worth, on Belady's own scale. Each read starts a *life*, of one of two classes: the
chunk's next use was planned, or it was not. A later read of the same chunk is
*unforeseen* when it comes well before the plan said (sooner than half the planned
distance, or the plan had none): its age, in reads, is counted in that class's
histogram (powers of two). Holding every chunk of a class for ``W`` reads after each
read then costs ``W`` slot-reads per life and hits a share ``P(W)`` of them: a cost of
``W / P(W)`` reads of cache room per hit. A planned chunk needed in ``d`` reads costs ``d``
per hit, so the two compare directly: the window ``W`` with the lowest cost is the
class's offer (the inverse of a hit density, as in Beckmann et al., "LHD: Improving
Cache Hit Rate by Maximizing Hit Density", NSDI 2018), and the plan-aware policy keeps a
chunk for ``W`` reads after its read when that cost beats the planned chunks it competes
with.

Pure and stdlib only: keys are opaque, the sizes are the policy's. The ghost of last
reads and the windows are bounded by the policy's entry count; counts halve as they
age, so the estimate follows a workload that changes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["UnforeseenReuse"]

K = TypeVar("K", bound=Hashable)

PLANNED, UNPLANNED, POOLED = 0, 1, 2
_BUCKETS = 48  # ages up to 2**47 reads
# Unforeseen re-reads a window needs before it is offered: fewer say nothing.
_MIN_HITS = 8
# Reads between two re-estimates of the windows.
_REFRESH = 256


class UnforeseenReuse(Generic[K]):
    """The read clock, a ghost of each recent chunk's last read, and per class the
    windows worth holding chunks for (:meth:`offer`)."""

    def __init__(self, floor: int = 64) -> None:
        self.clock = 0  # reads seen
        self.floor = floor  # the ghost's least span, in chunks
        # key -> (clock at its last read, clock its plan said it comes back, class)
        self._ghost: OrderedDict[K, tuple[int, float, int]] = OrderedDict()
        self._ages = [[0.0] * _BUCKETS for _ in (PLANNED, UNPLANNED)]
        self._lives = [0.0, 0.0]
        # Per class, each window's (length, cost per hit, cost per hit of its last stretch).
        # (and of both classes together, last).
        self._windows: list[list[tuple[int, float, float]]] = [[], [], []]
        self._since_refresh = 0
        self._since_decay = 0
        self.unforeseen = 0  # unforeseen re-reads counted (for tests and /stats)

    def read(self, key: K, distance: float, entries: int) -> int:
        """A read of ``key``, whose next planned use is now ``distance`` reads away
        (``inf``: none); ``entries``: the cache's entry count, which bounds the ghost.
        Returns the class of the life it starts."""
        self.clock += 1
        clock = self.clock
        last = self._ghost.pop(key, None)
        if last is not None:
            at, due, kind = last
            age = clock - at
            if 2 * age < due - at:
                self._ages[kind][min(_BUCKETS - 1, (age - 1).bit_length())] += 1
                self.unforeseen += 1
        kind = PLANNED if math.isfinite(distance) else UNPLANNED
        self._ghost[key] = (clock, clock + distance, kind)
        self._lives[kind] += 1
        span = max(self.floor, entries)
        ghost = self._ghost
        while len(ghost) > span:
            ghost.popitem(last=False)  # the oldest read: the order is read order
        self._since_refresh += 1
        if self._since_refresh >= _REFRESH:
            self._refresh(span)
        return kind

    def offer(self, kind: int, against: float) -> tuple[int, float]:
        """``(window, cost)`` for a life of class ``kind`` that competes with chunks needed
        ``against`` reads from now: hold it ``window`` reads, at ``cost`` reads of room per
        hit. The longest window that pays, as a whole and in its last stretch (a stretch
        of ages that rarely comes back is not worth its room even after a good start);
        ``(0, inf)`` while none does."""
        best: tuple[int, float] = (0, math.inf)
        # A class with too few re-reads of its own (the reads of a plan's last epoch,
        # unplanned from then on) goes by both classes' together.
        for window, cost, marginal in self._windows[kind] or self._windows[POOLED]:
            if cost <= against and marginal <= against:
                best = (window, cost)
        return best

    def _refresh(self, span: int) -> None:
        self._since_refresh = 0
        self._since_decay += _REFRESH
        if self._since_decay >= 8 * span:
            self._since_decay = 0
            for ages in self._ages:
                ages[:] = [count / 2 for count in ages]
            self._lives = [lives / 2 for lives in self._lives]
        # No longer than the ghost measures ages (about ``span`` reads).
        largest = span
        pooled = [a + b for a, b in zip(*self._ages, strict=True)]
        for kind, ages, lives in ((PLANNED, self._ages[PLANNED], self._lives[PLANNED]),
                                  (UNPLANNED, self._ages[UNPLANNED], self._lives[UNPLANNED]),
                                  (POOLED, pooled, sum(self._lives))):
            windows: list[tuple[int, float, float]] = []
            hits = 0.0
            previous = 0
            for bucket, count in enumerate(ages):
                window = 1 << bucket
                if window > largest:
                    break
                hits += count
                if hits >= _MIN_HITS and lives > 0:
                    marginal = (window - previous) * lives / count if count else math.inf
                    windows.append((window, window * lives / hits, marginal))
                previous = window
            self._windows[kind] = windows
