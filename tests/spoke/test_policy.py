"""Eviction policies: one contract for all of them, then what makes each one itself."""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

import pytest

from spoke.policy import (
    POLICY_NAMES,
    ARCPolicy,
    EvictionPolicy,
    LRUPolicy,
    S3FIFOPolicy,
    make_policy,
)

CHUNK = 100  # bytes; small numbers keep the hand-computed expectations readable
K = TypeVar("K", bound=Hashable)


def fill(policy: EvictionPolicy[K], key: K, size: int = CHUNK) -> list[K]:
    """Fill a miss as the cache does (admit, evict until it fits, insert); return the victims."""
    policy.admit(key)
    victims: list[K] = []
    while policy.resident_bytes + size > policy.capacity_bytes:
        victim = policy.evict(key)
        assert victim is not None, "over capacity yet nothing to evict"
        victims.append(victim)
    policy.insert(key, size)
    return victims


def access(policy: EvictionPolicy[K], key: K, size: int = CHUNK) -> bool:
    """Read ``key``: a hit touches it, a miss fills it. True on a hit."""
    if key in policy:
        policy.touch(key)
        return True
    fill(policy, key, size)
    return False


def run(policy: EvictionPolicy[K], trace: Iterable[K]) -> int:
    """Read every key of ``trace`` in turn; return the number of hits."""
    return sum(access(policy, key) for key in trace)


def drain(policy: EvictionPolicy[K]) -> list[K]:
    victims: list[K] = []
    while (victim := policy.evict()) is not None:
        victims.append(victim)
    return victims


@pytest.fixture(params=POLICY_NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def policy(name: str) -> EvictionPolicy[str]:
    return make_policy(name, 10 * CHUNK)


class TestContract:
    """What the chunk cache relies on, for every policy."""

    def test_new_policy_is_empty(self, policy: EvictionPolicy[str]) -> None:
        assert isinstance(policy, EvictionPolicy)
        assert policy.name in POLICY_NAMES
        assert policy.capacity_bytes == 10 * CHUNK
        assert len(policy) == 0
        assert policy.resident_bytes == 0
        assert "a" not in policy
        assert policy.keys() == []
        assert policy.evict() is None

    def test_insert_accounts_entries_and_bytes(self, policy: EvictionPolicy[str]) -> None:
        policy.insert("a", CHUNK)
        policy.insert("b", 40)  # the last chunk of an object is smaller
        assert ("a" in policy, "b" in policy, "c" in policy) == (True, True, False)
        assert len(policy) == 2
        assert policy.resident_bytes == CHUNK + 40
        assert sorted(policy.keys()) == ["a", "b"]

    def test_evict_returns_each_resident_key_then_none(self, policy: EvictionPolicy[str]) -> None:
        for key in "abcde":
            policy.insert(key, CHUNK)
        victims = [policy.evict() for _ in range(5)]
        assert (len(victims), set(victims)) == (5, set("abcde"))
        assert policy.evict() is None
        assert (len(policy), policy.resident_bytes) == (0, 0)
        assert not any(key in policy for key in "abcde")

    def test_keys_lists_victims_in_eviction_order(self, policy: EvictionPolicy[str]) -> None:
        for key in "abcdefghij":
            policy.insert(key, CHUNK)
        for key in "cfcj":
            policy.touch(key)
        expected = policy.keys()
        assert len(expected) == 10
        assert policy.keys() == expected, "keys() must not change the policy"
        assert drain(policy) == expected

    def test_remove_forgets_resident_key(self, policy: EvictionPolicy[str]) -> None:
        policy.insert("a", CHUNK)
        policy.insert("b", 30)
        policy.remove("a")
        assert ("a" in policy, len(policy), policy.resident_bytes) == (False, 1, 30)
        policy.remove("a")  # already gone
        policy.remove("never-seen")
        assert (len(policy), policy.resident_bytes) == (1, 30)
        assert drain(policy) == ["b"]

    def test_touch_of_absent_key_is_a_no_op(self, policy: EvictionPolicy[str]) -> None:
        policy.touch("ghost")
        assert ("ghost" in policy, len(policy), policy.resident_bytes) == (False, 0, 0)
        policy.insert("a", CHUNK)
        policy.insert("b", CHUNK)
        order = policy.keys()
        policy.touch("ghost")
        assert (policy.keys(), policy.resident_bytes) == (order, 2 * CHUNK)

    def test_reinsert_of_resident_key_updates_size_once(self, policy: EvictionPolicy[str]) -> None:
        policy.insert("a", CHUNK)
        policy.insert("b", CHUNK)
        policy.insert("a", 60)
        assert (len(policy), policy.resident_bytes) == (2, CHUNK + 60)
        victims = drain(policy)
        assert (len(victims), set(victims)) == (2, {"a", "b"})
        assert policy.resident_bytes == 0

    def test_rejects_negative_sizes(self, policy: EvictionPolicy[str]) -> None:
        with pytest.raises(ValueError, match="size"):
            policy.insert("a", -1)
        assert len(policy) == 0

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_random_caller_protocol_keeps_model(self, name: str, seed: int) -> None:
        """Thousands of mixed reads, refills and purges against a model of resident bytes."""
        rng = random.Random(seed)
        policy: EvictionPolicy[int] = make_policy(name, 10 * CHUNK + 37)  # not a CHUNK multiple
        model: dict[int, int] = {}  # resident key -> size, as the caller sees it
        sizes = {key: CHUNK if key % 4 else 7 + key for key in range(60)}
        hot = range(8)
        for step in range(3000):
            key = rng.choice(hot) if rng.random() < 0.5 else rng.randrange(60)
            roll = rng.random()
            if roll < 0.1:
                policy.remove(key)
                model.pop(key, None)
            elif roll < 0.15 and key in model:
                sizes[key] = rng.randint(1, model[key])  # a shrunk refill needs no room
                policy.insert(key, sizes[key])
                model[key] = sizes[key]
            elif key in model:
                assert key in policy
                policy.touch(key)
            else:
                assert key not in policy
                policy.admit(key)
                while sum(model.values()) + sizes[key] > policy.capacity_bytes:
                    victim = policy.evict(key)
                    assert victim in model, f"step {step}: evicted non-resident {victim!r}"
                    del model[victim]
                policy.insert(key, sizes[key])
                model[key] = sizes[key]
            assert policy.resident_bytes == sum(model.values()) <= policy.capacity_bytes
            assert len(policy) == len(model)
            if step % 50 == 0:
                resident = policy.keys()
                assert (len(resident), set(resident)) == (len(model), set(model))
                check_invariants(policy, sizes)


def check_invariants(policy: EvictionPolicy[Any], sizes: dict[int, int]) -> None:
    """Policy-specific bounds: ghosts are bounded in bytes and disjoint from residents."""
    capacity = policy.capacity_bytes
    if isinstance(policy, ARCPolicy):
        lists = policy.segments()
        size = {name: sum(sizes[key] for key in keys) for name, keys in lists.items()}
        assert 0 <= policy.p <= capacity
        assert size["t1"] + size["b1"] <= capacity
        assert sum(size.values()) <= 2 * capacity
        every = [key for keys in lists.values() for key in keys]
        assert len(every) == len(set(every))  # the four lists are disjoint
    if isinstance(policy, S3FIFOPolicy):
        queues = policy.segments()
        assert sum(sizes[key] for key in queues["ghost"]) <= policy.main_target_bytes
        assert not set(queues["ghost"]) & set(policy.keys())


def test_make_policy_builds_each_name() -> None:
    assert POLICY_NAMES == ("arc", "lru", "s3fifo")
    built = {name: type(make_policy(name, 5)) for name in POLICY_NAMES}
    assert built == {"arc": ARCPolicy, "lru": LRUPolicy, "s3fifo": S3FIFOPolicy}


@pytest.mark.parametrize("name", ["", "LRU", "fifo", "clock"])
def test_make_policy_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy(name, 1000)


@pytest.mark.parametrize("cls", [LRUPolicy, ARCPolicy, S3FIFOPolicy])
def test_rejects_negative_capacity(cls: type[LRUPolicy[str]]) -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        cls(-1)


# --- LRU -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trace", "expected_keys"),
    [
        ("abc", "abc"),  # untouched: insertion order
        ("abca", "bca"),  # a hit makes a the most recent
        ("abcab", "cab"),
        ("abcd", "bcd"),  # capacity 3: d evicts a
        ("abcad", "cad"),  # ...but b once a was hit
    ],
)
def test_lru_evicts_least_recently_used(trace: str, expected_keys: str) -> None:
    policy: LRUPolicy[str] = LRUPolicy(3 * CHUNK)
    run(policy, trace)
    assert "".join(policy.keys()) == expected_keys


# --- ARC -------------------------------------------------------------------------------


def arc_state(policy: ARCPolicy[str]) -> dict[str, str]:
    return {name: "".join(keys) for name, keys in policy.segments().items()}


@pytest.mark.parametrize(
    ("trace", "p_history", "lists"),
    [
        # T1 fills the cache: |T1| + |B1| <= c leaves no room for ghosts (paper case IV-A).
        (
            "abcdea",
            [0] * 6,
            {"t1": "cdea", "t2": "", "b1": "", "b2": ""},
        ),
        # e evicts b to B1; b's B1 hit grows p by one chunk and lands b in T2.
        (
            "aabcdeb",
            [0] * 6 + [100],
            {"t1": "de", "t2": "ab", "b1": "c", "b2": ""},
        ),
        # With |B2| = 2|B1|, a B1 hit grows p by two chunks (delta = size * |B2|/|B1|).
        (
            "abcdabcdeefgf",
            [0] * 12 + [200],
            {"t1": "g", "t2": "def", "b1": "", "b2": "abc"},
        ),
        # ...then g's B1 hit with |B2| = 3|B1| would lift p past c: it stops at c.
        (
            "abcdabcdeefgfhijg",
            [0] * 12 + [200] * 4 + [400],
            {"t1": "hij", "t2": "g", "b1": "", "b2": "cdef"},
        ),
        # c's B1 hit grows p; f then evicts a from T2 to B2; a's B2 hit shrinks p again.
        (
            "ababcdecfa",
            [0, 0, 0, 0, 0, 0, 0, 100, 100, 0],
            {"t1": "f", "t2": "bca", "b1": "de", "b2": ""},
        ),
    ],
)
def test_arc_adapts_p_on_ghost_hits(
    trace: str, p_history: list[int], lists: dict[str, str]
) -> None:
    policy: ARCPolicy[str] = ARCPolicy(4 * CHUNK)
    history = []
    for key in trace:
        access(policy, key)
        history.append(policy.p)
    assert history == p_history
    assert arc_state(policy) == lists


def test_arc_b2_incoming_evicts_t1_when_at_target() -> None:
    """The paper's tie-break: with |T1| == p, an incoming B2 ghost takes from T1."""
    policy: ARCPolicy[str] = ARCPolicy(4 * CHUNK)
    run(policy, "ababcdec")
    assert (policy.p, arc_state(policy)) == (
        CHUNK,
        {"t1": "e", "t2": "abc", "b1": "d", "b2": ""},
    )
    assert policy.evict() == "a"  # |T1| == p, no incoming: T2 yields, a becomes a B2 ghost
    assert arc_state(policy)["b2"] == "a"
    assert policy.evict("a") == "e"  # incoming a is in B2: T1 yields instead of b
    assert arc_state(policy) == {"t1": "", "t2": "bc", "b1": "de", "b2": "a"}


def test_arc_remove_and_reinsert() -> None:
    policy: ARCPolicy[str] = ARCPolicy(4 * CHUNK)
    run(policy, "abb")
    policy.remove("a")
    policy.remove("b")
    assert arc_state(policy) == {"t1": "", "t2": "", "b1": "", "b2": ""}  # no ghosts
    policy.insert("c", CHUNK)
    policy.insert("c", 50)  # re-insert of a resident key is an access: T1 -> T2
    assert (arc_state(policy)["t2"], policy.resident_bytes) == ("c", 50)


def test_arc_ghost_lists_stay_bounded_in_bytes() -> None:
    policy: ARCPolicy[int] = ARCPolicy(4 * CHUNK)
    run(policy, [0, 1, 0, 1])  # T2 = 0 1
    run(policy, range(2, 40))  # a scan: T1 churns, B1 fills up to c - |T1|
    lists = policy.segments()
    assert lists["t2"] == [0, 1]
    assert lists["t1"] == [38, 39]
    assert lists["b1"] == [36, 37]  # |T1| + |B1| == c
    assert policy.p == 0


SCAN_TRACE = [f"w{i}" for i in range(5)] * 3 + [f"s{i}" for i in range(100)]


@pytest.mark.parametrize(("name", "hits_after_scan"), [("lru", 0), ("arc", 5), ("s3fifo", 5)])
def test_working_set_survives_a_scan(name: str, hits_after_scan: int) -> None:
    """Re-used keys then a one-time scan of 100 new keys: do the re-used ones survive?"""
    policy = make_policy(name, 10 * CHUNK)
    assert run(policy, SCAN_TRACE) == 10  # rounds 2 and 3 of the working set
    assert run(policy, [f"w{i}" for i in range(5)]) == hits_after_scan


# --- S3-FIFO ---------------------------------------------------------------------------


def s3_state(policy: S3FIFOPolicy[str]) -> dict[str, str]:
    return {name: "".join(keys) for name, keys in policy.segments().items()}


@pytest.fixture
def s3() -> S3FIFOPolicy[str]:
    policy: S3FIFOPolicy[str] = S3FIFOPolicy(10 * CHUNK)
    assert (policy.small_target_bytes, policy.main_target_bytes) == (CHUNK, 9 * CHUNK)
    run(policy, "abcdefghij")  # the cache is full; everything sits in S
    return policy


def test_s3fifo_one_hit_wonder_goes_to_ghost(s3: S3FIFOPolicy[str]) -> None:
    assert fill(s3, "k") == ["a"]
    assert s3_state(s3) == {"small": "bcdefghijk", "main": "", "ghost": "a"}


def test_s3fifo_reaccessed_key_moves_to_main(s3: S3FIFOPolicy[str]) -> None:
    run(s3, "aab")  # a hit twice (freq 2), b once (freq 1)
    assert fill(s3, "k") == ["b"]  # a moves to M on its way out of S; b is not hit enough
    assert s3_state(s3) == {"small": "cdefghijk", "main": "a", "ghost": "b"}
    assert (s3.frequency("a"), s3.frequency("b")) == (2, None)


def test_s3fifo_ghost_hit_inserts_into_main(s3: S3FIFOPolicy[str]) -> None:
    run(s3, "aak")  # a -> M, b -> G
    assert fill(s3, "b") == ["c"]
    assert s3_state(s3) == {"small": "defghijk", "main": "ab", "ghost": "c"}
    assert s3.frequency("b") == 0


def test_s3fifo_main_reinserts_while_frequency_lasts(s3: S3FIFOPolicy[str]) -> None:
    run(s3, "aakb")  # M = a (freq 2), b (freq 0); S = d..k
    assert s3.keys() == list("defghijkba")  # S drains first; a's two hits outlast b
    assert drain(s3) == list("defghijkba")


def test_s3fifo_promotion_into_full_main_evicts_from_main() -> None:
    policy: S3FIFOPolicy[str] = S3FIFOPolicy(10 * CHUNK)
    policy.insert("m", 850)
    assert policy.evict() == "m"  # never hit: out of S, into G
    fill(policy, "m", 850)  # ghost hit: straight into M
    fill(policy, "a")
    run(policy, "aa")  # a: freq 2 in S
    fill(policy, "b", 50)  # the cache is exactly full
    assert s3_state(policy) == {"small": "ab", "main": "m", "ghost": ""}
    assert policy.evict() == "m"  # a moves to M, pushing M over its target: M evicts m
    assert s3_state(policy) == {"small": "b", "main": "a", "ghost": ""}


def test_s3fifo_ghost_is_bounded_by_main_target() -> None:
    policy: S3FIFOPolicy[int] = S3FIFOPolicy(10 * CHUNK)
    run(policy, range(30))  # 20 one-hit wonders evicted
    assert policy.segments()["ghost"] == list(range(11, 20))  # 9 chunks fit M's target


def test_s3fifo_remove_leaves_no_ghost(s3: S3FIFOPolicy[str]) -> None:
    s3.remove("a")
    assert s3_state(s3) == {"small": "bcdefghij", "main": "", "ghost": ""}
    assert fill(s3, "a") == []  # a comes back as new, to S
    assert s3_state(s3)["small"] == "bcdefghija"


def test_s3fifo_reinsert_is_a_hit_that_resizes() -> None:
    policy: S3FIFOPolicy[str] = S3FIFOPolicy(10 * CHUNK)
    policy.insert("a", CHUNK)
    policy.insert("a", 40)
    policy.touch("a")
    assert (policy.frequency("a"), policy.resident_bytes) == (2, 40)
    for _ in range(5):
        policy.touch("a")
    assert policy.frequency("a") == 3  # capped
