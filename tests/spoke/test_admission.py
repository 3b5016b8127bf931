"""ReuseAdmission: what it lets into the base policy, what it keeps in its window, and
what it lets go. (The contract every policy keeps is tested in test_policy.py.)"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from spoke.policy import (
    EvictionPolicy,
    LRUPolicy,
    PlanAwarePolicy,
    ReuseAdmission,
    make_policy,
)
from spoke.policy.admission import ReadClocks

CHUNK = 100


def access(policy: EvictionPolicy[int], key: int) -> bool:
    """Read ``key`` as the cache does; True on a hit."""
    if key in policy:
        policy.touch(key)
        return True
    policy.admit(key)
    while policy.resident_bytes + CHUNK > policy.capacity_bytes:
        assert policy.evict(key) is not None
    policy.insert(key, CHUNK)
    return False


def hits(policy: EvictionPolicy[int], trace: Iterable[int]) -> int:
    return sum(access(policy, key) for key in trace)


def gated(capacity_chunks: int = 20, base: str = "lru") -> ReuseAdmission[int]:
    policy = make_policy(base, capacity_chunks * CHUNK, "reuse")
    assert isinstance(policy, ReuseAdmission)
    return policy


def warmed() -> ReuseAdmission[int]:
    """A gate whose 20 chunks of LRU hold keys 0-19, each read twice 20 reads apart: the
    horizon is 20 reads, and no resident is idle past it."""
    policy = gated(20)
    assert hits(policy, list(range(20)) * 2) == 20
    assert policy.horizon == 20
    return policy


GATED = ("arc", "lru", "s3fifo")


@pytest.mark.parametrize("name", GATED)
def test_a_loop_larger_than_the_cache_keeps_a_part_of_it(name: str) -> None:
    """50 chunks read in order, again and again, through 20 chunks of cache: Belady keeps 20
    a pass. The gate keeps all but its window's one; LRU and ARC alone keep none."""
    loop = list(range(50))
    policy, bare = gated(20, name), make_policy(name, 20 * CHUNK)
    hits(policy, loop)
    hits(bare, loop)
    per_pass = [hits(policy, loop) for _ in range(5)]
    assert all(count >= 18 for count in per_pass), per_pass
    if name in ("lru", "arc"):
        assert [hits(bare, loop) for _ in range(5)] == [0] * 5


def test_a_working_set_that_fits_is_all_hits() -> None:
    policy = gated(20)
    keys = list(range(15)) * 4
    assert hits(policy, keys) == 45
    assert policy.probation.bytes == 0 and policy.promoted == 0


def test_until_it_has_seen_reuse_the_gate_admits_as_the_base_does() -> None:
    policy, bare = gated(20), LRUPolicy[int](20 * CHUNK)
    trace = list(range(30))  # nothing read twice: no horizon, every resident "idle past it"
    assert hits(policy, trace) == hits(bare, trace) == 0
    assert policy.keys() == bare.keys() == list(range(10, 30))


def test_a_miss_not_seen_lately_waits_in_the_window_and_leaves_the_base_alone() -> None:
    policy = warmed()
    residents = policy.base.keys()
    access(policy, 100)
    assert 100 in policy and 100 in policy.probation
    assert len(policy.base) == 19 and set(policy.base.keys()) < set(residents)  # room for it
    access(policy, 101)  # the window is at its share (one chunk): its oldest goes
    assert (100 in policy, list(policy.probation)) == (False, [101])
    assert len(policy.base) == 19


def test_a_second_hit_in_the_window_moves_a_key_to_the_base() -> None:
    policy = warmed()
    access(policy, 100)
    assert access(policy, 100)  # one hit: what a read-ahead gets from the read behind it
    assert 100 in policy.probation and policy.promoted == 0
    assert access(policy, 100)
    assert 100 in policy.base and 100 not in policy.probation and policy.promoted == 1


def test_a_miss_read_again_soon_twice_in_a_row_goes_to_the_base_by_its_rules() -> None:
    policy = warmed()
    access(policy, 100)  # into the window
    assert access(policy, 100)  # a hit one read later: a short reuse
    access(policy, 101)  # pushes 100 out of the window
    lru_victim = policy.base.keys()[0]
    access(policy, 100)  # short again: the base admits it, evicting its own victim
    assert 100 in policy.base and lru_victim not in policy
    assert policy.replaced_dead == 0


def test_one_short_reuse_is_chance_and_does_not_push_out_a_live_resident() -> None:
    """A stray read of a chunk just before its planned one makes one short reuse; its
    next read is an epoch away, and a resident the base would evict for it is not."""
    policy = warmed()
    access(policy, 100)  # a first read: into the window
    access(policy, 101)  # pushes 100 out of it
    access(policy, 100)  # read 2 reads ago, but its reuse before that was not short
    # Not the base's choice: a long miss's rule, which only a dead resident gives way to.
    assert policy.replaced_dead == 1


def test_a_finished_jobs_chunks_give_way_to_the_next_job() -> None:
    """Job A's 20 chunks are read in 3 loops and fill the cache, then job B loops over 50
    others. Kept for good, A's chunks would leave B nothing; idle past the horizon (the
    longest reuse seen lately), they are replaced, and B's loop is kept as if alone."""
    policy = gated(20)
    job_a, job_b = list(range(20)), list(range(1000, 1050))
    for _ in range(3):
        hits(policy, job_a)
    b_hits = [hits(policy, job_b) for _ in range(8)]
    assert policy.replaced_dead >= 19
    assert not set(job_a) & set(policy.keys())
    assert b_hits[-1] >= 18, b_hits


def test_a_one_pass_scan_gives_way_to_a_job_reading_every_epoch() -> None:
    """A job re-reads its 15 chunks every 30 reads, between the reads of a scan, through 20
    chunks of cache. LRU keeps the last 20 reads, half of them the scan's: no job read
    hits. With the gate the scan's chunks, idle past the horizon, give way to the job's
    one by one, and once they have the scan only passes through the window."""
    scan = iter(range(10_000, 20_000))
    rounds = [[key for job_key in range(15) for key in (job_key, next(scan))]
              for _ in range(20)]
    policy, bare = gated(20), LRUPolicy[int](20 * CHUNK)
    assert [hits(bare, r) for r in rounds] == [0] * 20
    per_round = [hits(policy, r) for r in rounds]
    assert per_round[-5:] == [15] * 5, per_round
    assert per_round == sorted(per_round), per_round  # it never loses ground


def test_it_wants_a_base_that_keeps_every_fill() -> None:
    planned = PlanAwarePolicy(LRUPolicy[int](10 * CHUNK), lambda key: math.inf)
    with pytest.raises(ValueError, match="keeps every fill; lru turns some away itself"):
        ReuseAdmission(planned)


def test_wtinylfu_keeps_its_own_filter_and_lets_a_finished_job_go() -> None:
    """Its frequency duel turns away what is not read often: no window in front of it. But
    its counts of a finished job's chunks, read every epoch, stay higher than the next
    job's for several halvings; the gate sweeps those once they are idle past the horizon
    (and half as much again)."""
    job_a, job_b = list(range(20)), list(range(1000, 1050))
    policy = make_policy("wtinylfu", 20 * CHUNK, "reuse")
    bare = make_policy("wtinylfu", 20 * CHUNK)
    assert isinstance(policy, ReuseAdmission) and policy.sweep_only
    for each in (policy, bare):
        for _ in range(5):
            hits(each, job_a)
    b_hits = [hits(policy, job_b) for _ in range(8)]
    bare_hits = [hits(bare, job_b) for _ in range(8)]
    assert policy.probation.bytes == 0 and policy.replaced_dead >= 19
    assert not set(job_a) & set(policy.keys())
    assert b_hits[-1] >= 15 and sum(b_hits) > 2 * sum(bare_hits), (b_hits, bare_hits)


def test_a_fill_routed_to_the_window_lands_there_after_other_fills() -> None:
    """The cache makes room for a fill when it starts and stores it when it has arrived,
    with other fills in between: where each goes is remembered per key."""
    policy = warmed()
    for key in (100, 101):  # two long misses in flight at once, both headed for the window
        policy.admit(key)
        assert policy.evict(key) in range(20)  # the window is empty: the base makes room
    access(policy, 5)  # a hit meanwhile
    policy.insert(101, CHUNK)  # the second lands first
    policy.insert(100, CHUNK)
    assert list(policy.probation) == [101, 100]
    assert len(policy.base) == 18 and policy.resident_bytes == 20 * CHUNK


def test_read_clocks_count_reads_between_two_reads_of_a_key() -> None:
    clocks = ReadClocks()
    assert clocks.read("a", 2) == math.inf
    for key in "bcd":
        clocks.read(key, 2)
    assert clocks.read("a", 2) == 4
    assert clocks.read("a", 2) == 1


def test_read_clocks_tell_whether_the_reuse_before_was_short() -> None:
    clocks = ReadClocks()
    clocks.read("a", 1)
    assert not clocks.was_short  # never read before
    clocks.read("b", 1)
    clocks.read("a", 1)  # 2 reads: longer than 1
    assert not clocks.was_short
    clocks.read("a", 1)  # 1 read: short, noted for the next read
    assert not clocks.was_short
    clocks.read("b", 1)
    clocks.read("a", 1)
    assert clocks.was_short
    clocks.read("a", 1)  # the 2 reads before were not short
    assert not clocks.was_short


def test_read_clocks_forget_a_key_whose_slot_another_key_took() -> None:
    clocks = ReadClocks()
    clocks.read(0, 1)
    collider = next(k for k in range(1, 1 << 20)
                    if _slot(clocks, k) == _slot(clocks, 0) and _tag(k) != _tag(0))
    clocks.read(collider, 1)
    assert clocks.read(0, 1) == math.inf  # a collision is a key not seen, never a wrong distance


def test_read_clocks_grow_with_the_residents() -> None:
    clocks = ReadClocks()
    clocks.fit(10)
    small = len(clocks._slots)
    clocks.fit(100_000)
    assert len(clocks._slots) >= 8 * 100_000 > small
    clocks.read("x", 1)
    assert clocks.read("x", 1) == 1


def _mixed(key: int) -> int:
    mixed = (hash(key) * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    return mixed ^ (mixed >> 29)


def _slot(clocks: ReadClocks, key: int) -> int:
    return (_mixed(key) >> 16) & clocks._mask


def _tag(key: int) -> int:
    return (_mixed(key) & 0xFFFF) | 1
