"""Rendezvous placement (protocol.placement): stable, balanced, weighted, and minimal in
what moves when a member joins or leaves."""

from __future__ import annotations

import pytest

from protocol.placement import chunk_key, owner, rank, sample_keys, score, shares

KEYS = sample_keys(20_000)


def members(n: int) -> dict[str, float]:
    return {f"http://10.0.0.{i}:8701": 1.0 for i in range(1, n + 1)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 15])
def test_going_from_n_to_n_plus_1_peers_moves_about_one_in_n_plus_1_keys(n: int) -> None:
    before, after = members(n), members(n + 1)
    joined = next(m for m in after if m not in before)
    moved = 0
    for key in KEYS:
        was, now = owner(before, key), owner(after, key)
        if was != now:
            assert now == joined  # a key only ever moves to the newcomer
            moved += 1
    expected = len(KEYS) / (n + 1)
    assert abs(moved - expected) < 0.1 * expected, (moved, expected)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_peer_leaving_moves_only_its_own_keys_to_each_keys_next_choice(n: int) -> None:
    full = members(n)
    gone = next(iter(full))
    rest = {m: w for m, w in full.items() if m != gone}
    for key in KEYS[:2000]:
        ranked = rank(full, key)
        now = owner(rest, key)
        assert now == (ranked[1] if ranked[0] == gone else ranked[0])


def test_equal_peers_own_equal_shares() -> None:
    for share in shares(members(4), KEYS).values():
        assert abs(share - 0.25) < 0.02


def test_a_peer_of_twice_the_capacity_owns_twice_the_keys() -> None:
    weights = {"http://a:1": 2.0, "http://b:1": 1.0, "http://c:1": 1.0}
    got = shares(weights, KEYS)
    assert abs(got["http://a:1"] - 0.5) < 0.02
    assert abs(got["http://b:1"] - 0.25) < 0.02


def test_every_spoke_ranks_a_key_the_same_whatever_the_order_it_lists_members_in() -> None:
    forward = members(5)
    backward = dict(reversed(list(forward.items())))
    for key in KEYS[:500]:
        assert rank(forward, key) == rank(backward, key)


def test_the_key_is_path_version_and_index() -> None:
    a, b = chunk_key("ds/a", "v1", 3), chunk_key("ds/a", "v2", 3)
    assert a != b != chunk_key("ds/a", "v1", 4)
    assert score("m", 1.0, a) == score("m", 1.0, a) > 0


def test_no_member_of_positive_weight_owns_nothing() -> None:
    assert owner({}, KEYS[0]) is None
    assert owner({"http://a:1": 0.0}, KEYS[0]) is None
    assert rank({"http://a:1": 0.0, "http://b:1": 1.0}, KEYS[0]) == ["http://b:1"]
