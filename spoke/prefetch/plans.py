"""The plan book: the read orders loaders told the spoke, and how far each has got.

A plan is the list of reads a job will make, e.g. the shuffled sample order of
its next epoch. The book turns it into the sequence of chunks those reads touch,
so that (1) the plan prefetcher (:mod:`spoke.prefetch.plan_prefetch`) can fetch the
next chunks of that sequence ahead of the reader, and (2) the eviction policy can
ask how far away each chunk's next use is, to apply Belady's rule
(:mod:`spoke.policy.plan_aware`). The book is pure: no cache, no I/O, no event
loop; it is made before the cache (whose policy consults it), the prefetcher after.

The reader's position is learnt from its reads: requests carrying
``X-Hubspoke-Plan: <id>`` move that plan's cursor to the chunk they touched.

A plan belongs to the tenant that made it: only that tenant's requests see it,
delete it or move its cursor; to anyone else it does not exist (404, never 403,
so an id says nothing), and its prefetches count against its tenant's quota.
"""

from __future__ import annotations

import bisect
import math
import secrets
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from protocol.chunks import chunk_slices
from protocol.errors import ProtocolError
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache.keys import ChunkKey

# Bounds what one plan may cost the spoke: 4M reads is a 64 GiB epoch of 16 KiB samples.
MAX_PLAN_READS = 4_000_000
# How far out of order the cursor takes reads to come, in reads: beyond a DataLoader's
# prefetch window (workers x prefetch_factor x batch) with room to spare.
DEFAULT_WINDOW = 2048
# How far behind the cursor the prefetch looks for reads that came but may still wait
# for their chunks (ReadPlan.upcoming): a few batches of a few loaders' workers.
COME_BACK = 256
# Reads over which a plan's share of the book's reads is averaged.
_GAP_MEMORY = 256


class PlanNotFound(ProtocolError):
    status_hint = 404
    title = "No such plan"


@dataclass(frozen=True, slots=True)
class PlannedRead:
    path: str
    offset: int
    length: int


class ReadPlan:
    """One job's planned reads, the chunks they touch, and how far its readers are.

    Positions are read indices in the plan. The cursor is learnt from the reads
    themselves (:meth:`observe`); a read is recognised by its object and start offset,
    which are unique within an epoch but recur once per epoch the plan covers.

    The cursor follows the readers through any number of epochs without sticking or
    jumping, despite reads that come out of order (a DataLoader's workers and prefetch
    queue), late (a retry) or not from the plan at all:

    * an *anchor* trails the readers: the median of the positions of the last
      ``_RECENT`` recognised reads, which off-plan reads that happen to match cannot
      drag far while they are under half of them;
    * a read is looked for only in ``[anchor - window, anchor + window]``, as the
      occurrence nearest the cursor there; found nowhere in it, it is off-plan and
      ignored, whatever occurrence it has further on (a stray read once jumped the
      cursor epochs ahead);
    * the cursor moves to a recognised read that the cursor or another recent read backs
      (lies within ``_SUPPORT`` positions of it), never past ``anchor + window``: a lone
      stray far ahead cannot move it, readers in order or shuffled within the window do;
    * when three in four of the last ``_RESYNC`` reads were found only further ahead,
      close together (the readers skipped part of the plan), the cursor jumps there.

    So the cursor never passes the readers by more than the window, and reaches the
    end with them, for reads displaced by up to half the window (a property test holds
    it to that over random epochs, sizes, noise and reordering). A read the cursor has
    passed that has not come yet is still to come: :meth:`next_use` counts it as needed
    now, and :meth:`upcoming` lists it first.
    """

    # Recognised reads the anchor is the median of, and the ones a move needs backing from.
    _RECENT = 32
    # Positions apart that two recognised reads back each other.
    _SUPPORT = 16
    # The last reads in which a skip ahead is looked for (three in four found there).
    _RESYNC = 16

    def __init__(
        self,
        plan_id: str,
        reads: list[tuple[int, int]],
        touched: list[list[int]],
        names: list[str],
        where: dict[str, tuple[Manifest, int]],
        tenant: str = "",
        on_move: Callable[[], None] = lambda: None,
        window: int = DEFAULT_WINDOW,
        job: str = "",
    ) -> None:
        self.id = plan_id
        self.tenant = tenant
        self.job = job
        self.reads = len(reads)
        self.where = where
        self._names = names
        self._ids = {name: i for i, name in enumerate(names)}
        # (read, chunk) pairs in read order: what upcoming() walks.
        self._seq_read = array("l")
        self._seq_chunk = array("l")
        self._positions: dict[int, array[int]] = {}
        for position, chunks in enumerate(touched):
            for chunk in chunks:
                self._seq_read.append(position)
                self._seq_chunk.append(chunk)
                self._positions.setdefault(chunk, array("l")).append(position)
        # Reads sorted by (object, offset) key, to recognise a read when it comes.
        order = sorted(range(len(reads)), key=lambda i: reads[i])
        self._keys = array("q", (_key(*reads[i]) for i in order))
        self._key_positions = array("l", order)
        # Under half an epoch (as many reads as distinct ones) when reads recur, so that
        # the window rarely holds two occurrences of a read: small epochs narrow it.
        distinct = sum(1 for i in range(len(self._keys))
                       if i == 0 or self._keys[i] != self._keys[i - 1])
        if distinct < self.reads:
            window = min(window, (distinct - 1) // 2)
        self.window = max(1, window)
        self.cursor = 0
        self.anchor = 0
        # Short enough that the anchor, which lags the readers by half of it, stays well
        # inside a narrow window.
        self._recent: deque[int] = deque(maxlen=max(1, min(self._RECENT, self.window)))
        # Of the last _RESYNC reads, where each occurs beyond the window (empty if it was
        # recognised, or occurs nowhere ahead).
        self._ahead: deque[tuple[int, ...]] = deque(maxlen=self._RESYNC)
        self._consumed: set[int] = set()  # recognised positions, lately (for next_use)
        self.off_plan = 0  # reads not recognised (counted, for /stats and tests)
        self.observed = 0  # reads observed, recognised or not
        # The book's reads per read of this plan, a moving average; its clock at our last.
        self.gap = 1.0
        self._last_tick = 0
        self.on_move = on_move  # told each time the cursor moves on (wakes the prefetcher)

    def __len__(self) -> int:
        return self.reads

    @property
    def distinct_chunks(self) -> int:
        return len(self._names)

    @property
    def started(self) -> bool:
        """Whether any read of the plan has come."""
        return self.observed > 0

    def observe(self, object_id: int, offset: int, tick: int | None = None) -> None:
        """A read of ``offset`` in object ``object_id`` arrived, at the book's clock
        ``tick``: move the cursor on if the readers have (see the class docstring)."""
        if tick is not None:
            if self.observed:  # an average over the first reads, then a moving one
                weight = max(1 / self.observed, 1 / _GAP_MEMORY)
                self.gap += (tick - self._last_tick - self.gap) * weight
            self._last_tick = tick
        self.observed += 1
        key = _key(object_id, offset)
        lo = bisect.bisect_left(self._keys, key)
        hi = bisect.bisect_right(self._keys, key, lo)
        floor, ceiling = self.anchor - self.window, self.anchor + self.window
        cursor = self.cursor
        recent = self._recent
        best = None
        best_rank = (0, 0)
        ahead: list[int] = []
        for i in range(lo, hi):  # a handful: one per epoch the plan covers
            position = self._key_positions[i]
            if position < floor:
                continue
            if position > ceiling:
                ahead.append(position)
                continue
            # Nearest the cursor, but a read just recognised again is its next occurrence
            # when there is one in the window (a plan whose epochs are a read or two).
            rank = (position in recent, abs(position - cursor))
            if best is None or rank < best_rank or (rank == best_rank and position > best):
                best, best_rank = position, rank
        self._ahead.append(() if best is not None else tuple(ahead))
        if best is None:
            self.off_plan += 1
            self._resync()
            return
        self._recognised(best)

    def _recognised(self, position: int) -> None:
        recent = self._recent
        seen = position in recent
        if seen and position in self._consumed:
            return  # a retry, or a stray of a read just made: it says nothing new
        # Seen but not taken: a stray of this sample came first, unbacked. The read
        # itself, when it comes, is judged as if new (else the plan's last read, so
        # shadowed, would never be taken and the plan never finish).
        support = self._SUPPORT
        backed = abs(position - self.cursor) <= support or any(
            abs(position - other) <= support for other in recent if other != position)
        if not seen:
            recent.append(position)
            if len(recent) == recent.maxlen:  # a median of a few is a stray's to move
                ranked = sorted(recent)
                self.anchor = max(self.anchor, ranked[(len(ranked) - 1) // 2])
        if not backed:
            return  # alone so far: a stray, or the first of a run that the next backs
        consumed = self._consumed
        consumed.add(position)  # only backed reads: a stray must not mark a read as done
        if len(consumed) > 4 * self.window + 64:
            self._consumed = {p for p in consumed if p >= self.cursor - self.window}
        target = min(position, self.anchor + self.window)
        if target > self.cursor:
            self.cursor = target
            self.on_move()

    def _resync(self) -> None:
        """Jump to where most of the last reads occur beyond the window, if one place
        holds three in four of them: the readers skipped part of the plan."""
        history = self._ahead
        needed = self._RESYNC * 3 // 4
        if len(history) < self._RESYNC or sum(1 for found in history if found) < needed:
            return
        window = self.window
        for candidate in history[-1]:  # ascending: the earliest place that qualifies
            near = [min(p for p in found if abs(p - candidate) <= window)
                    for found in history if any(abs(p - candidate) <= window for p in found)]
            if len(near) >= needed:
                self._jump(min(near))
                return

    def _jump(self, position: int) -> None:
        self._ahead.clear()
        self._recent.clear()
        self._recent.append(position)
        self.anchor = position
        if position > self.cursor:
            self.cursor = position
            self.on_move()

    def next_use(self, name: str) -> float:
        """Planned reads until ``name`` is needed after the current read; ``inf`` if never.

        Strictly after the cursor once reads have come: the chunk being read now is in
        use already, and what matters to eviction is when it will be wanted again. A read the cursor
        passed (within the window) that has not come yet is still to come, now: out of
        order, it is not done (evicting such chunks cost a noisy plan a third of OPT's
        hits at a small cache).
        """
        chunk = self._ids.get(name)
        if chunk is None:
            return math.inf
        occurrences = self._positions[chunk]
        cursor = self.cursor
        i = bisect.bisect_left(occurrences, cursor - self.window)
        while i < len(occurrences) and occurrences[i] < cursor:
            if occurrences[i] not in self._consumed:
                return 0.0  # passed by the cursor but not read yet: a worker has it next
            i += 1
        if i < len(occurrences) and occurrences[i] == cursor and self.observed:
            i += 1  # the read at the cursor has come (before any, it is still to come)
        return math.inf if i == len(occurrences) else float(occurrences[i] - cursor)

    def due(self, name: str) -> float:
        """The position of ``name``'s first planned read that is not long past (not
        before the window behind the cursor); ``inf`` if none is left.

        Unlike :meth:`next_use` it counts reads that have come: a loader fetch waiting
        on this chunk is one of them. Positions, not distances from the cursor, so that
        fetches ranked while the cursor moved compare (:meth:`PlanBook.due`).
        """
        chunk = self._ids.get(name)
        if chunk is None:
            return math.inf
        occurrences = self._positions[chunk]
        i = bisect.bisect_left(occurrences, self.cursor - self.window)
        return math.inf if i == len(occurrences) else float(occurrences[i])

    def upcoming(self, limit: int, still_needed: Callable[[str], bool] | None = None
                 ) -> list[str]:
        """The next ``limit`` distinct chunks from the cursor on, in order of need (after
        the reads the cursor passed that have not come yet).

        With ``still_needed``, also the chunks of reads that came, up to ``COME_BACK``
        positions behind the cursor, that ``still_needed`` accepts (neither at hand nor
        on their way): an answer asks for its chunks in turn, so a read that came may
        not have asked for its chunk yet. Those it turns down are neither listed nor
        counted.
        """
        seen: dict[str, None] = {}
        cursor = self.cursor
        back = cursor - min(self.window, COME_BACK) if still_needed is not None else cursor
        start = bisect.bisect_left(self._seq_read, cursor - self.window)
        for i in range(start, len(self._seq_chunk)):
            position = self._seq_read[i]
            if position < cursor and position in self._consumed:
                if position < back or still_needed is None:
                    continue
                name = self._names[self._seq_chunk[i]]
                if name not in seen and still_needed(name):
                    seen[name] = None
                    if len(seen) >= limit:
                        break
                continue
            seen.setdefault(self._names[self._seq_chunk[i]])
            if len(seen) >= limit:
                break
        return list(seen)

    @property
    def finished(self) -> bool:
        return self.cursor >= self.reads - 1


def _key(object_id: int, offset: int) -> int:
    return (object_id << 44) | offset  # offsets below 16 TiB


class PlanBook:
    """Every active plan of one spoke: the chunks each touches and where its readers are.

    Distances are on one time scale for all plans, so that Belady's rule holds across
    them (the next use of a chunk is the soonest over every plan): the book's clock
    counts the reads it observes, of any plan, and each plan's distance in its own
    reads is scaled by how many of the book's reads go by per read of that plan (its
    ``gap``, learnt as it reads). A plan not started yet that follows an unfinished one
    of the same job (say, the next epoch, registered ahead) starts when that one ends.
    """

    def __init__(self) -> None:
        self._plans: dict[str, ReadPlan] = {}
        self._object_ids: dict[str, int] = {}  # object path -> small int, for read keys
        self.clock = 0  # reads observed, of every plan
        self._starts: dict[str, tuple[float, float]] = {}  # plan -> (start, gap), per clock
        self._starts_clock = -1

    def next_use(self, name: object) -> float:
        """Time, in the book's reads, until chunk ``name``'s next planned use by any plan;
        ``inf`` if no plan needs it again."""
        if not self._plans or not isinstance(name, str):
            return math.inf
        if len(self._plans) == 1:  # the usual case: one plan's scale orders nothing
            (plan,) = self._plans.values()
            return plan.next_use(name)
        starts = self._starts if self._starts_clock == self.clock else self._timing()
        best = math.inf
        for plan in self._plans.values():
            distance = plan.next_use(name)
            if distance != math.inf:
                start, gap = starts[plan.id]
                if start + distance * gap < best:
                    best = start + distance * gap
        return best

    def due(self, name: str) -> float:
        """When chunk ``name`` is needed by the plans, to order fetches that loaders wait
        on (lower first); ``-inf`` when no plan has it (it is needed now, by whoever
        reads it). With one plan, the position of its read (:meth:`ReadPlan.due`); with
        several, the time of the soonest on the book's clock."""
        best = math.inf
        if len(self._plans) == 1:
            (plan,) = self._plans.values()
            best = plan.due(name)
        elif self._plans:
            starts = self._timing()
            for plan in self._plans.values():
                position = plan.due(name)
                if position != math.inf:
                    start, gap = starts[plan.id]
                    best = min(best, self.clock + start + (position - plan.cursor) * gap)
        return -math.inf if best == math.inf else best

    def owner(self, name: object) -> str | None:
        """The plan that needs chunk ``name`` soonest; None if no plan needs it again."""
        best: tuple[float, str] | None = None
        if isinstance(name, str):
            starts = self._timing()
            for plan_id, plan in self._plans.items():
                start, gap = starts[plan_id]
                distance = start + plan.next_use(name) * gap
                if not math.isinf(distance) and (best is None or distance < best[0]):
                    best = (distance, plan_id)
        return None if best is None else best[1]

    def _timing(self) -> dict[str, tuple[float, float]]:
        """Each plan's (start, gap): when its cursor's read happens, from now, and the
        book's reads per read of it. Recomputed once per clock tick."""
        if self._starts_clock == self.clock:
            return self._starts
        running = [plan.gap for plan in self._plans.values() if plan.started]
        default_gap = sum(running) / len(running) if running else 1.0
        starts: dict[str, tuple[float, float]] = {}
        ends: dict[tuple[str, str], tuple[float, float]] = {}  # job -> its last plan's end
        for plan in self._plans.values():  # in the order they were made
            job = (plan.tenant, plan.job)
            before = ends.get(job) if plan.job else None
            if plan.started or before is None:
                start, gap = 0.0, plan.gap if plan.started else default_gap
            else:
                start, gap = before
            if plan.finished:
                starts[plan.id] = (start, gap)
                continue
            starts[plan.id] = (start, gap)
            ends[job] = (start + (plan.reads - plan.cursor) * gap, gap)
        self._starts, self._starts_clock = starts, self.clock
        return starts

    def add(
        self, reads: Iterable[PlannedRead], manifests: Mapping[str, Manifest], tenant: str = "",
        on_move: Callable[[], None] = lambda: None, *, plan_id: str | None = None,
        job: str = "", window: int = DEFAULT_WINDOW,
    ) -> ReadPlan:
        """Book ``tenant``'s plan of ``reads``, each read against its object's manifest
        in ``manifests``; ``on_move`` is told whenever the plan's cursor moves on.

        ``plan_id`` names the plan (a job's epoch, shared by its ranks); a plan already
        booked under that name is returned as it is. Plans of one ``job`` (non-empty)
        follow one another: one not started yet is taken to start when the job's plan
        before it ends. ``window``: how far out of order reads may come (:class:`ReadPlan`)."""
        if plan_id is not None and plan_id in self._plans:
            return self._plans[plan_id]
        planned: list[tuple[int, int]] = []
        touched: list[list[int]] = []
        names: dict[str, int] = {}
        where: dict[str, tuple[Manifest, int]] = {}
        for read in reads:
            manifest = manifests[read.path]
            object_id = self._object_ids.setdefault(read.path, len(self._object_ids))
            stop = min(read.offset + read.length, manifest.size)
            if read.offset >= stop:
                continue
            chunks = []
            for s in chunk_slices(ByteRange(read.offset, stop), manifest.size,
                                  manifest.chunk_size):
                name = ChunkKey.of(manifest, s.index).name
                chunks.append(names.setdefault(name, len(names)))
                where.setdefault(name, (manifest, s.index))
            planned.append((object_id, read.offset))
            touched.append(chunks)
        plan = ReadPlan(plan_id or secrets.token_hex(8), planned, touched, list(names), where,
                        tenant, on_move, window=window, job=job)
        self._plans[plan.id] = plan
        self._starts_clock = -1
        return plan

    def get(self, plan_id: str, tenant: str = "") -> ReadPlan:
        """Plan ``plan_id`` if ``tenant`` made it (another tenant's is not found)."""
        plan = self._plans.get(plan_id)
        if plan is None or plan.tenant != tenant:
            raise PlanNotFound(f"no plan {plan_id!r}")
        return plan

    def plans(self, tenant: str | None = None) -> list[ReadPlan]:
        """The plans ``tenant`` made; every plan when ``tenant`` is None."""
        return [p for p in self._plans.values() if tenant is None or p.tenant == tenant]

    def observe(self, plan_id: str, tenant: str, path: str, offsets: Iterable[int]) -> None:
        """Reads by ``tenant`` of ``offsets`` in ``path`` that follow plan ``plan_id``
        arrived (another tenant's reads do not move the plan)."""
        plan = self._plans.get(plan_id)
        object_id = self._object_ids.get(path)
        if plan is not None and plan.tenant == tenant and object_id is not None:
            for offset in offsets:
                self.clock += 1
                plan.observe(object_id, offset, self.clock)

    def remove(self, plan_id: str) -> None:
        del self._plans[plan_id]
        self._starts_clock = -1
