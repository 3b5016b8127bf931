"""Space: the cache's byte accounting, checked without a disk, a loop or a clock.

A property test runs random sequences of what the engine does to it (reserve, then
publish or give up; purge; a chunk file found bad) under random capacities, quotas
and pinned shares, and checks after every step that the bytes on disk never pass
the capacity and that every tally matches the chunks it counts. Table tests pin the
quota's and the pinned share's behaviour down.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from spoke.cache.resident import Resident
from spoke.cache.space import Space
from spoke.policy import POLICY_NAMES, make_policy


@dataclass
class Counts:
    evictions: int = 0
    quota_evictions: int = 0


def space_of(capacity: int, *, quota: int = 0, pinned: tuple[str, ...] = (),
             fraction: float = 0.5, policy: str = "lru") -> tuple[Space, Counts, list[str]]:
    counts, dropped = Counts(), []
    space = Space(make_policy(policy, capacity), capacity, counts, tenant_quota_bytes=quota,
                  pinned_prefixes=pinned, pin_fraction=fraction, on_drop=dropped.append)
    return space, counts, dropped


def store(space: Space, name: str, size: int, tenant: str = "", path: str = "ds/a") -> bool:
    """What a fill does once verified: reserve, publish if there was room, release."""
    _, reserved = space.reserve(name, size, tenant)
    if reserved:
        space.add(name, Resident(size, path, tenant))
        space.release(tenant, size)
    return reserved


# -- the property -------------------------------------------------------------

NAMES = [f"c{i}" for i in range(12)]
TENANTS = ["", "alice", "bob"]
PATHS = ["ds/a", "ds/b", "pinned/x"]

ops = st.lists(st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from(NAMES), st.integers(1, 40),
              st.sampled_from(TENANTS), st.sampled_from(PATHS)),
    st.tuples(st.just("publish"), st.integers(0, 11)),
    st.tuples(st.just("release"), st.integers(0, 11)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),  # purged, expired
    st.tuples(st.just("drop"), st.sampled_from(NAMES)),  # its file found gone
    st.tuples(st.just("touch"), st.sampled_from(NAMES)),  # read
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 120), st.sampled_from([0, 30, 60]), st.sampled_from([0.0, 0.3, 1.0]),
       st.sampled_from(POLICY_NAMES))
def test_bytes_on_disk_never_exceed_the_capacity_and_the_tallies_hold(
    steps: list[tuple[object, ...]], capacity: int, quota: int, fraction: float, policy: str,
) -> None:
    space, counts, dropped = space_of(capacity, quota=quota, pinned=("pinned/",),
                                      fraction=fraction, policy=policy)
    pending: list[tuple[str, int, str, str]] = []  # reservations granted, not yet released
    for step in steps:
        kind = step[0]
        if kind == "reserve":
            _, name, size, tenant, path = step
            assert isinstance(name, str) and isinstance(size, int)
            assert isinstance(tenant, str) and isinstance(path, str)
            if name in space.resident or any(p[0] == name for p in pending):
                continue  # one flight per chunk, and a resident chunk is not fetched
            before = set(name for name, _ in space.resident.items())
            victims, reserved = space.reserve(name, size, tenant)
            assert set(victims) <= before and not set(victims) & {n for n, _ in
                                                                  space.resident.items()}
            if reserved:
                pending.append((name, size, tenant, path))
        elif kind in ("publish", "release") and pending:
            at = step[1]
            assert isinstance(at, int)
            name, size, tenant, path = pending.pop(at % len(pending))
            if kind == "publish":
                space.add(name, Resident(size, path, tenant))
            space.release(tenant, size)
        elif kind == "remove":
            assert isinstance(step[1], str)
            space.remove(step[1])
        elif kind == "drop" and space.drop(str(step[1])) is not None:
            space.policy.remove(str(step[1]))
        elif kind == "touch":
            space.policy.touch(str(step[1]))
            space.resident.touched(str(step[1]))
        check(space, pending, capacity, quota, fraction)
    assert counts.evictions + counts.quota_evictions <= len(dropped)


def check(space: Space, pending: list[tuple[str, int, str, str]], capacity: int, quota: int,
          fraction: float) -> None:
    chunks = list(space.resident.items())
    assert space.used_bytes == sum(r.size for _, r in chunks) <= capacity
    # What is on disk plus what fills in flight were promised fits too: the next
    # publish cannot pass the capacity either.
    assert space.used_bytes + space.reserved_bytes <= capacity
    assert space.reserved_bytes == sum(p[1] for p in pending)
    by_tenant: dict[str, int] = {}
    for _, r in chunks:
        by_tenant[r.tenant] = by_tenant.get(r.tenant, 0) + r.size
    assert space.resident.tenant_bytes == by_tenant
    promised: dict[str, int] = {}
    for _, size, tenant, _ in pending:
        promised[tenant] = promised.get(tenant, 0) + size
    assert space.tenant_reserved == promised
    if quota:
        for tenant in set(by_tenant) | set(promised):
            assert by_tenant.get(tenant, 0) + promised.get(tenant, 0) <= quota
    # Each chunk on disk is the policy's to evict, or pinned: never both, never neither.
    unpinned = [r for name, r in chunks if name in space.policy]
    pinned = [r for name, r in chunks if name not in space.policy]
    assert space.pinned_bytes == sum(r.size for r in pinned) <= fraction * capacity
    assert all(r.path.startswith("pinned/") for r in pinned)
    assert len(space.policy) == len(unpinned)


# -- quota ----------------------------------------------------------------------

def test_a_tenant_at_its_quota_makes_room_among_its_own_oldest_chunks() -> None:
    space, counts, dropped = space_of(100, quota=30)
    for name, tenant in (("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("a3", "alice")):
        assert store(space, name, 10, tenant)
    space.resident.touched("a1")  # read since: a2 is now alice's oldest
    assert store(space, "a4", 10, "alice")
    assert dropped == ["a2"] and counts.quota_evictions == 1 and counts.evictions == 0
    assert space.resident.tenant_bytes == {"alice": 30, "bob": 10}


def test_a_tenant_whose_fills_in_flight_hold_its_quota_is_served_uncached() -> None:
    space, _, dropped = space_of(100, quota=20)
    assert space.reserve("a1", 10, "alice")[1] and space.reserve("a2", 10, "alice")[1]
    assert space.reserve("a3", 10, "alice") == ([], False)
    assert space.reserve("b1", 10, "bob") == ([], True)  # others are not held back
    assert dropped == [] and space.tenant_reserved == {"alice": 20, "bob": 10}


def test_no_quota_lets_one_tenant_fill_the_cache() -> None:
    space, counts, _ = space_of(30)
    assert all(store(space, f"a{i}", 10, "alice") for i in range(5))
    assert space.resident.tenant_bytes == {"alice": 30} and counts.evictions == 2


# -- pinning and capacity --------------------------------------------------------

def test_pinned_chunks_outlast_pressure_within_their_share() -> None:
    space, counts, _ = space_of(40, pinned=("pinned/",), fraction=0.5)
    assert store(space, "p1", 10, path="pinned/x") and store(space, "p2", 10, path="pinned/y")
    assert store(space, "p3", 10, path="pinned/z")  # past the share: the policy's to evict
    assert space.pinned_bytes == 20 and "p3" in space.policy and "p1" not in space.policy
    for i in range(4):
        assert store(space, f"d{i}", 10)
    assert "p1" in space.resident and "p2" in space.resident and "p3" not in space.resident
    assert space.used_bytes == 40 and counts.evictions == 3


def test_a_dropped_pinned_chunk_frees_its_share() -> None:
    space, _, _ = space_of(40, pinned=("pinned/",), fraction=0.25)
    assert store(space, "p1", 10, path="pinned/x")
    space.remove("p1")
    assert space.pinned_bytes == 0
    assert store(space, "p2", 10, path="pinned/y") and space.pinned_bytes == 10


def test_a_chunk_finds_no_room_when_everything_left_is_being_filled() -> None:
    space, _, dropped = space_of(30)
    assert store(space, "a", 10) and dropped == []
    assert space.reserve("b", 10, "")[1] and space.reserve("c", 10, "")[1]
    assert space.reserve("d", 20, "") == (["a"], False)  # a goes; b and c are not the policy's
    assert dropped == ["a"] and space.used_bytes == 0 and space.reserved_bytes == 20
    assert not space.fits(11)


def test_start_up_keeps_the_most_recent_chunks_that_fit() -> None:
    space, _, _ = space_of(25)
    rows = [Resident(10, "ds/a"), Resident(10, "ds/b"), Resident(10, "ds/c")]  # oldest first
    keep, over = space.keep_within(rows)
    assert list(keep) == rows[1:] and list(over) == rows[:1]
