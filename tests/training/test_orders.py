"""Epoch orders: every rank computes the job's order alike and reads its own share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spoke.client.orders import padded, rank_share, shard_aware_order, uniform_order


@given(n=st.integers(1, 300), seed=st.integers(0, 9), epoch=st.integers(0, 5),
       world=st.integers(1, 8), drop_last=st.booleans())
def test_rank_shares_cover_the_epoch_once(n: int, seed: int, epoch: int, world: int,
                                          drop_last: bool) -> None:
    order = padded(uniform_order(n, seed, epoch), world, drop_last)
    shares = [rank_share(order, r, world) for r in range(world)]
    assert len({len(s) for s in shares}) == 1  # every rank steps as often
    read = sorted(i for s in shares for i in s)
    if drop_last:
        assert len(read) == n - n % world and len(set(read)) == len(read)
    else:
        assert set(read) == set(range(n)) and len(read) == -(-n // world) * world


def test_an_epoch_order_is_the_same_everywhere_and_new_each_epoch() -> None:
    assert uniform_order(500, 3, 1) == uniform_order(500, 3, 1)
    assert uniform_order(500, 3, 1) != uniform_order(500, 3, 2)
    assert sorted(uniform_order(500, 3, 1)) == list(range(500))
    assert uniform_order(5, 3, 1, shuffle=False) == [0, 1, 2, 3, 4]


@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=40), window=st.integers(1, 6),
       seed=st.integers(0, 99))
def test_shard_aware_reads_at_most_a_window_of_groups_at_a_time(
    sizes: list[int], window: int, seed: int
) -> None:
    groups, start = [], 0
    for size in sizes:
        groups.append(list(range(start, start + size)))
        start += size
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    order = shard_aware_order(groups, seed, 0, window)
    assert sorted(order) == list(range(start))
    # Each group's samples are read within one block of ``window`` groups' samples:
    # whole groups come and go together, so at most ``window`` are open at once.
    open_groups: set[int] = set()
    remaining = {g: len(m) for g, m in enumerate(groups)}
    for i in order:
        open_groups.add(group_of[i])
        assert len(open_groups) <= window
        remaining[group_of[i]] -= 1
        if remaining[group_of[i]] == 0:
            open_groups.discard(group_of[i])


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError):
        shard_aware_order([[0]], 0, 0, 0)
    with pytest.raises(ValueError):
        padded([1, 2], 0, False)
    with pytest.raises(ValueError):
        rank_share([1, 2], 2, 2)
