"""spoke.prefetch.plans: the plan book, built and read without a cache or an event loop."""

from __future__ import annotations

import math

import pytest

from protocol.chunks import chunk_count
from protocol.manifest import Manifest
from spoke.cache.keys import ChunkKey
from spoke.prefetch.plans import PlanBook, PlannedRead, PlanNotFound

CHUNK = 1000


def manifest(path: str, size: int) -> Manifest:
    return Manifest(path=path, size=size, etag='"v1"', chunk_size=CHUNK, digest_alg="sha256",
                    digests=(b"\0" * 32,) * chunk_count(size, CHUNK))


MANIFESTS = {"ds/a": manifest("ds/a", 4 * CHUNK), "ds/b": manifest("ds/b", 2 * CHUNK)}


def name(path: str, index: int) -> str:
    return ChunkKey.of(MANIFESTS[path], index).name


def book_with_plan(tenant: str = "") -> tuple[PlanBook, str, list[int]]:
    """A book holding one plan of four reads, touching chunks a0, b1, a2 and a3, a0 again;
    and the cursor positions its ``on_move`` was told of."""
    moves: list[int] = []
    book = PlanBook()
    reads = [PlannedRead("ds/a", 0, 500), PlannedRead("ds/b", 1500, 400),
             PlannedRead("ds/a", 2500, 1000), PlannedRead("ds/a", 100, 10)]
    plan = book.add(reads, MANIFESTS, tenant, on_move=lambda: moves.append(plan.cursor))
    return book, plan.id, moves


def test_a_plan_lists_the_chunks_its_reads_touch_in_order_of_need() -> None:
    book, plan_id, _ = book_with_plan()
    plan = book.get(plan_id)
    assert len(plan) == 4 and plan.distinct_chunks == 4
    assert plan.upcoming(10) == [name("ds/a", 0), name("ds/b", 1), name("ds/a", 2),
                                 name("ds/a", 3)]
    assert plan.upcoming(2) == [name("ds/a", 0), name("ds/b", 1)]
    assert plan.where[name("ds/a", 3)] == (MANIFESTS["ds/a"], 3)


def test_reads_move_the_cursor_and_the_distances_to_each_chunk_follow() -> None:
    book, plan_id, moves = book_with_plan()
    # Before any read: a's chunk 0 is read first (position 0), and again at position 3.
    assert book.next_use(name("ds/a", 0)) == 0.0
    assert book.next_use(name("ds/a", 2)) == 2.0
    assert book.next_use(name("ds/b", 0)) == math.inf  # no planned read touches it
    book.observe(plan_id, "", "ds/a", [2500])  # the third read arrived first
    assert moves == [2]
    assert book.get(plan_id).cursor == 2
    # The two reads before it are still to come (workers out of order): needed now.
    assert book.next_use(name("ds/a", 0)) == 0.0
    assert book.next_use(name("ds/b", 1)) == 0.0
    assert book.get(plan_id).upcoming(10) == [name("ds/a", 0), name("ds/b", 1),
                                              name("ds/a", 2), name("ds/a", 3)]
    book.observe(plan_id, "", "ds/a", [0])  # a late worker's read: the cursor stays
    book.observe(plan_id, "", "ds/b", [1500])
    assert moves == [2]
    assert book.next_use(name("ds/a", 0)) == 1.0  # read; next at position 3
    assert book.next_use(name("ds/b", 1)) == math.inf  # its only read is done
    assert book.get(plan_id).upcoming(10) == [name("ds/a", 2), name("ds/a", 3),
                                              name("ds/a", 0)]


def test_the_plan_needing_a_chunk_soonest_owns_it() -> None:
    book, first, _ = book_with_plan()
    second = book.add([PlannedRead("ds/a", 3000, 10), PlannedRead("ds/a", 2000, 10)],
                      MANIFESTS).id
    assert book.owner(name("ds/a", 2)) == second  # 1 read away, against 2 in the first
    assert book.next_use(name("ds/a", 2)) == 1.0  # the nearest use over all plans
    assert book.owner(name("ds/a", 3)) == second  # its first read, still to come
    assert book.owner(name("ds/a", 0)) == first
    assert book.owner(name("ds/b", 0)) is None
    assert book.owner(object()) is None and book.next_use(object()) == math.inf
    book.remove(second)
    assert book.owner(name("ds/a", 2)) == first
    assert [p.id for p in book.plans()] == [first]


def test_another_tenants_plan_does_not_exist_for_it() -> None:
    book, plan_id, moves = book_with_plan(tenant="alice")
    assert book.get(plan_id, "alice").id == plan_id
    with pytest.raises(PlanNotFound):
        book.get(plan_id, "bob")
    assert book.plans("bob") == [] and len(book.plans("alice")) == 1
    book.observe(plan_id, "bob", "ds/a", [2500])  # bob's reads do not move alice's plan
    assert moves == [] and book.get(plan_id, "alice").cursor == 0


LONG = {"ds/c": manifest("ds/c", 40 * CHUNK)}


def reads_of(chunks: list[int]) -> list[PlannedRead]:
    return [PlannedRead("ds/c", index * CHUNK, CHUNK) for index in chunks]


def c(index: int) -> str:
    return ChunkKey.of(LONG["ds/c"], index).name


def test_plans_share_one_time_scale_each_scaled_by_its_read_rate() -> None:
    """A reads three times as fast as B: B's next read of c30 is 6 of its reads away,
    A's 8 of its own, and A's comes first (in the book's reads: 8 x 4/3 against 6 x 4)."""
    book = PlanBook()
    fast = book.add(reads_of([*range(20), 30]), LONG)
    slow = book.add(reads_of([*range(20, 30), 30]), LONG)
    for step in range(4):
        for i in range(3):
            book.observe(fast.id, "", "ds/c", [(3 * step + i) * CHUNK])
        book.observe(slow.id, "", "ds/c", [(20 + step) * CHUNK])
    assert (fast.cursor, slow.cursor) == (11, 3)
    assert fast.gap == pytest.approx(4 / 3, rel=0.2) and slow.gap == pytest.approx(4, rel=0.2)
    assert fast.next_use(c(30)) < slow.next_use(c(30)) * 2  # raw: 9 reads against 7
    assert book.owner(c(30)) == fast.id
    assert book.next_use(c(30)) == pytest.approx(9 * fast.gap)


def test_a_jobs_next_plan_starts_when_its_current_one_ends() -> None:
    book = PlanBook()
    first = book.add(reads_of(list(range(10))), LONG, job="j")
    second = book.add(reads_of([*range(10, 20), 0]), LONG, job="j")
    other = book.add(reads_of([19]), LONG, job="k")  # another job: not chained
    for index in range(5):
        book.observe(first.id, "", "ds/c", [index * CHUNK])
    assert first.cursor == 4 and not second.started
    assert book.next_use(c(5)) == 1.0  # the current plan's next read
    assert book.next_use(c(10)) == 6.0  # the next plan's first read, once the first's 6 left
    assert book.next_use(c(0)) == 16.0  # its last: 6 + 10
    assert book.next_use(c(19)) == 0.0  # the other job's first read is still to come
    assert book.owner(c(19)) == other.id
    book.remove(first.id)  # the job moved on: its next plan starts now
    assert book.next_use(c(10)) == 0.0


def test_due_is_the_position_of_a_chunks_first_read_even_once_it_has_come() -> None:
    book, plan_id, _ = book_with_plan()
    # Nothing read yet: each chunk at its first planned read; unplanned ones are "now".
    assert [book.due(name("ds/a", 0)), book.due(name("ds/b", 1)),
            book.due(name("ds/a", 2))] == [0.0, 1.0, 2.0]
    assert book.due(name("ds/b", 0)) == -math.inf
    book.observe(plan_id, "", "ds/a", [2500])
    book.observe(plan_id, "", "ds/b", [1500])
    # Read (a loader may still be waiting on its fetch), yet still ranked by that read:
    # next_use has moved on, due has not.
    assert book.next_use(name("ds/b", 1)) == math.inf
    assert book.due(name("ds/b", 1)) == 1.0
    assert book.due(name("ds/a", 0)) < book.due(name("ds/a", 2))


def test_due_over_several_plans_takes_the_soonest_on_the_books_clock() -> None:
    book, _, _ = book_with_plan()  # its third read (position 2) touches a2 and a3
    book.add([PlannedRead("ds/a", 3000, 10), PlannedRead("ds/b", 0, 10)], MANIFESTS)
    # a3 is the other plan's first read: sooner than its place (2) in the first plan.
    assert book.due(name("ds/a", 3)) < book.due(name("ds/a", 2))
    assert book.due(name("ds/b", 0)) == 1.0  # only in the second plan, its second read


def test_upcoming_can_list_the_chunks_of_reads_that_came_and_are_still_needed() -> None:
    book, plan_id, _ = book_with_plan()
    plan = book.get(plan_id)
    for path, offset in (("ds/a", 0), ("ds/b", 1500), ("ds/a", 2500)):
        book.observe(plan_id, "", path, [offset])
    assert plan.cursor == 2  # a0 and b1 behind it, and come
    assert plan.upcoming(10) == [name("ds/a", 2), name("ds/a", 3), name("ds/a", 0)]
    # b1's answer may not have asked for its chunk yet; a0's is at hand.
    wanted = {name("ds/b", 1)}
    assert plan.upcoming(10, wanted.__contains__) == [
        name("ds/b", 1), name("ds/a", 2), name("ds/a", 3), name("ds/a", 0)]
    assert plan.upcoming(1, wanted.__contains__) == [name("ds/b", 1)]
    # Those at hand are not counted either.
    assert plan.upcoming(2, lambda _: False) == [name("ds/a", 2), name("ds/a", 3)]
