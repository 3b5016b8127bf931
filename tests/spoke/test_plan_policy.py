"""PlanAwarePolicy: Belady on a known future, falling back to the base policy."""

from __future__ import annotations

import bisect
import math
import random

import pytest

from spoke.policy import LRUPolicy, PlanAwarePolicy, make_policy
from spoke.policy.reuse import UnforeseenReuse

UNKNOWN: dict[str, float] = {}


def fixed(distances: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda key: distances.get(key, math.inf)


class Future:
    """next_use() over a known trace, with a cursor the test moves as it replays."""

    def __init__(self, trace: list[str]) -> None:
        self.cursor = 0
        self.positions: dict[str, list[int]] = {}
        for i, key in enumerate(trace):
            self.positions.setdefault(key, []).append(i)

    def __call__(self, key: object) -> float:
        occ = self.positions.get(str(key))
        if not occ:
            return math.inf
        i = bisect.bisect_right(occ, self.cursor)  # the use after the current one
        return math.inf if i == len(occ) else float(occ[i] - self.cursor)


def replay(policy: PlanAwarePolicy[str] | LRUPolicy[str], trace: list[str], size: int,
           future: Future | None = None) -> int:
    """Drive the cache protocol over ``trace``; returns hits. Checks capacity each step."""
    hits = 0
    for position, key in enumerate(trace):
        if future is not None:
            future.cursor = position
        if key in policy:
            hits += 1
            policy.touch(key)
            continue
        policy.admit(key)
        admitted = True
        while policy.resident_bytes + size > policy.capacity_bytes:
            if policy.evict(key) is None:
                admitted = False
                break
        if admitted:
            policy.insert(key, size)
        assert policy.resident_bytes <= policy.capacity_bytes
    return hits


def shuffled_epochs(keys: int, epochs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    trace: list[str] = []
    for _ in range(epochs):
        order = [f"c{i}" for i in range(keys)]
        rng.shuffle(order)
        trace += order
    return trace


def test_without_plans_it_is_the_base_policy() -> None:
    trace = shuffled_epochs(200, 3, seed=1)
    plain = replay(LRUPolicy[str](100), trace, 1)
    wrapped = replay(PlanAwarePolicy(LRUPolicy[str](100), fixed(UNKNOWN)), trace, 1)
    assert wrapped == plain


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
@pytest.mark.parametrize("base", ["lru", "arc", "s3fifo", "wtinylfu"])
def test_with_the_plan_shuffled_epochs_reach_opt(fraction: float, base: str) -> None:
    keys, epochs = 400, 4
    trace = shuffled_epochs(keys, epochs, seed=7)
    capacity = int(keys * fraction)
    future = Future(trace)
    policy = PlanAwarePolicy(make_policy(base, capacity), future)
    hits = replay(policy, trace, 1, future)
    # OPT on a random shuffle keeps a fixed set: capacity/keys of every later epoch.
    opt_hits = capacity * (epochs - 1)
    assert hits >= 0.95 * opt_hits
    plain_hits = replay(make_policy(base, capacity), trace, 1)
    assert hits > plain_hits


def test_evicts_the_key_needed_last() -> None:
    distances = {"a": 5.0, "b": 50.0, "c": 1.0, "new": 2.0}
    policy = PlanAwarePolicy(LRUPolicy[str](3), fixed(distances))
    for key in "abc":
        policy.insert(key, 1)
    policy.admit("new")
    assert policy.evict("new") == "b"
    assert set(policy.keys()) == {"a", "c"}


def test_refuses_a_newcomer_needed_later_than_every_resident() -> None:
    distances = {"a": 5.0, "b": 6.0, "late": 100.0}
    policy = PlanAwarePolicy(LRUPolicy[str](2), fixed(distances))
    policy.insert("a", 1)
    policy.insert("b", 1)
    assert policy.evict("late") is None
    assert policy.refused == 1
    assert "a" in policy and "b" in policy


def test_unplanned_keys_go_first() -> None:
    distances = {"p1": 10.0, "p2": 20.0}
    policy = PlanAwarePolicy(LRUPolicy[str](4), fixed(distances))
    for key in ["p1", "u1", "p2", "u2"]:
        policy.insert(key, 1)
    assert [policy.evict("x"), policy.evict("x")] == ["u1", "u2"]
    assert policy.evict("x") is None  # x has no plan, planned keys under their share


def test_unplanned_newcomers_are_not_starved_past_the_planned_share() -> None:
    distances = {f"p{i}": float(i + 1) for i in range(10)}
    policy = PlanAwarePolicy(LRUPolicy[str](10), fixed(distances), planned_share=0.5)
    for i in range(10):
        policy.insert(f"p{i}", 1)
    # Planned keys hold 100 % > 50 %: an unplanned read may take the one needed last.
    assert policy.evict("unplanned") == "p9"


def test_accounting_through_remove_and_reinsert() -> None:
    distances = {"a": 3.0}
    policy = PlanAwarePolicy(LRUPolicy[str](10), fixed(distances))
    policy.insert("a", 4)
    policy.insert("b", 3)
    assert (len(policy), policy.resident_bytes) == (2, 7)
    policy.insert("a", 2)  # re-insert with a new size
    assert policy.resident_bytes == 5
    policy.remove("a")
    policy.remove("b")
    policy.remove("zzz")
    assert (len(policy), policy.resident_bytes) == (0, 0)
    assert policy.evict(None) is None


def test_a_used_up_plan_hands_keys_back_to_eviction() -> None:
    distances = {"a": 1.0, "b": 2.0}
    policy = PlanAwarePolicy(LRUPolicy[str](2), fixed(distances))
    policy.insert("a", 1)
    policy.insert("b", 1)
    distances["a"] = math.inf  # the plan read it for the last time
    policy.touch("a")
    assert policy.evict("new") == "a"


# --- several plans: one Belady over all of them ---------------------------------------


def two_plans() -> dict[str, float]:
    """Plan A needs a0..a9 soon (distances 1..10); plan B needs b0..b9 only later (100..109)."""
    distances = {f"a{i}": float(i + 1) for i in range(10)}
    distances |= {f"b{i}": float(100 + i) for i in range(10)}
    return distances


def fill_with(policy: PlanAwarePolicy[str], keys: list[str]) -> list[str | None]:
    """Admit each key, evicting while full; returns the victims (None: declined)."""
    victims: list[str | None] = []
    for key in keys:
        policy.admit(key)
        while policy.resident_bytes + 1 > policy.capacity_bytes:
            victim = policy.evict(key)
            victims.append(victim)
            if victim is None:
                break
        else:
            policy.insert(key, 1)
    return victims


def test_belady_across_plans_lets_the_plan_with_the_nearer_future_keep_everything() -> None:
    """No fair split: the chunks needed soonest, whichever plan needs them, stay."""
    policy = PlanAwarePolicy(LRUPolicy[str](10), fixed(two_plans()))
    fill_with(policy, [f"a{i}" for i in range(10)])
    assert fill_with(policy, [f"b{i}" for i in range(10)]) == [None] * 10  # all declined
    assert sorted(policy.keys()) == sorted(f"a{i}" for i in range(10))


def test_a_later_plan_takes_the_room_of_chunks_needed_after_its_own() -> None:
    distances = two_plans() | {f"c{i}": float(50 + i) for i in range(5)}
    policy = PlanAwarePolicy(LRUPolicy[str](10), fixed(distances))
    fill_with(policy, [f"b{i}" for i in range(10)])
    assert fill_with(policy, [f"c{i}" for i in range(5)]) == ["b9", "b8", "b7", "b6", "b5"]
    assert sorted(policy.keys()) == sorted([f"b{i}" for i in range(5)]
                                           + [f"c{i}" for i in range(5)])


# --- re-reads no plan announced ---------------------------------------------------------


def with_retries(keys: int, epochs: int, seed: int) -> tuple[list[str], list[bool]]:
    """Shuffled epochs where one read in five is followed, two reads on, by a retry of it
    that no plan lists; returns the reads and which of them the plan lists."""
    rng = random.Random(seed)
    trace: list[str] = []
    planned: list[bool] = []
    pending: list[tuple[int, str]] = []
    for key in shuffled_epochs(keys, epochs, seed):
        trace.append(key)
        planned.append(True)
        if rng.random() < 0.2:
            pending.append((len(trace) + 2, key))
        while pending and pending[0][0] <= len(trace):
            trace.append(pending.pop(0)[1])
            planned.append(False)
    return trace, planned


class PlannedOnly(Future):
    """The future of the planned reads only: the retries are unforeseen."""

    def __init__(self, trace: list[str], planned: list[bool]) -> None:
        super().__init__([key if listed else "" for key, listed in zip(trace, planned,
                                                                         strict=True)])


def retry_hits(policy: PlanAwarePolicy[str], trace: list[str], planned: list[bool],
               future: Future) -> tuple[int, int]:
    """(hits on the retries, retries) after the first epoch's worth of reads."""
    hits = retries = 0
    for position, key in enumerate(trace):
        future.cursor = position
        hit = key in policy
        if position > len(trace) // 4 and not planned[position]:
            retries += 1
            hits += hit
        replay(policy, [key], 1)
    return hits, retries


def test_a_chunk_retried_soon_is_held_though_its_plan_needs_it_only_next_epoch() -> None:
    trace, planned = with_retries(400, 4, seed=3)
    future = PlannedOnly(trace, planned)
    policy = PlanAwarePolicy(LRUPolicy[str](40), future)
    hits, retries = retry_hits(policy, trace, planned, future)
    assert hits >= 0.9 * retries
    assert policy.reuse.unforeseen >= retries


def test_without_the_learnt_holds_the_retries_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above bites: Belady on the plan alone turns the retried chunk away."""
    monkeypatch.setattr(UnforeseenReuse, "offer", lambda self, kind, against: (0, math.inf))
    trace, planned = with_retries(400, 4, seed=3)
    future = PlannedOnly(trace, planned)
    hits, retries = retry_hits(PlanAwarePolicy(LRUPolicy[str](40), future), trace, planned,
                               future)
    assert hits < 0.5 * retries


@pytest.mark.parametrize("base", ["lru", "arc", "s3fifo", "wtinylfu"])
def test_without_a_plan_re_reads_leave_the_base_policy_in_charge(base: str) -> None:
    """Holds compete with planned chunks only: with no plan, eviction is the base
    policy's, order for order, however often chunks come back."""
    trace, _ = with_retries(200, 3, seed=5)
    plain = make_policy(base, 50)
    wrapped = PlanAwarePolicy(make_policy(base, 50), fixed(UNKNOWN))
    assert replay(wrapped, trace, 1) == replay(plain, trace, 1)
    assert wrapped.keys() == plain.keys()
    assert wrapped.reuse.unforeseen > 0  # it learnt, and held nothing
