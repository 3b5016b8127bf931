"""A fill's digest taken as its bytes arrive is the digest of the whole chunk, or nothing.

The verdict of a cold chunk no longer waits for a hash of the whole chunk after its
last byte: :meth:`Filling.digesting` hashes each piece as it lands. These pin that the
piecewise digest is exactly the whole chunk's (however the network split it, however
late the hashing started), and that it is refused (None) whenever it might not be:
bytes missing, another algorithm, an attempt taken back.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.digests import digest
from spoke.cache.flight import BufferPool, Filling

ALG = "xxh3-128"
LENGTH = 256 << 10
DATA = os.urandom(LENGTH)


def _arrive(fill: Filling, data: bytes, cuts: list[int]) -> None:
    """``data`` into ``fill`` as the hub client puts it: into space(), then advance."""
    at = 0
    for stop in [*sorted(set(cuts)), len(data)]:
        if stop <= at:
            continue
        fill.space()[: stop - at] = data[at:stop]
        fill.advance(stop - at)
        at = stop


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=LENGTH - 1), max_size=20),
       started_at=st.integers(min_value=0, max_value=LENGTH))
def test_the_digest_taken_on_arrival_is_the_whole_chunks(cuts: list[int], started_at: int) -> None:
    fill = Filling(LENGTH, BufferPool(4 * LENGTH))
    _arrive(fill, DATA[:started_at], [c for c in cuts if c < started_at])
    fill.digesting(ALG)  # late, as for an early fetch's bytes already in
    fill.space()[: LENGTH - started_at] = DATA[started_at:]
    fill.advance(LENGTH - started_at)
    assert fill.digest(ALG) == digest(ALG, DATA)


def test_other_bytes_give_another_digest() -> None:
    fill = Filling(LENGTH)
    fill.digesting(ALG)
    corrupt = bytearray(DATA)
    corrupt[LENGTH // 2] ^= 1
    _arrive(fill, bytes(corrupt), [LENGTH // 3])
    assert fill.digest(ALG) not in (None, digest(ALG, DATA))


def test_no_digest_until_every_byte_arrived() -> None:
    fill = Filling(LENGTH)
    fill.digesting(ALG)
    _arrive(fill, DATA[:-1], [])
    assert fill.digest(ALG) is None


def test_no_digest_for_another_algorithm_or_without_digesting() -> None:
    fill = Filling(LENGTH)
    _arrive(fill, DATA, [1000])
    assert fill.digest(ALG) is None
    fill2 = Filling(LENGTH)
    fill2.digesting(ALG)
    _arrive(fill2, DATA, [1000])
    assert fill2.digest("sha256") is None


def test_an_attempt_taken_back_leaves_no_digest_and_the_next_is_its_own() -> None:
    fill = Filling(LENGTH)
    fill.digesting(ALG)
    _arrive(fill, os.urandom(LENGTH // 2), [])
    assert fill.discard_attempt()
    _arrive(fill, DATA, [])  # the next attempt's bytes, not digested: no verdict from them
    assert fill.digest(ALG) is None
    assert fill.discard_attempt()
    fill.digesting(ALG)
    _arrive(fill, DATA, [LENGTH // 5])
    assert fill.digest(ALG) == digest(ALG, DATA)


def test_every_algorithm_hashes_piece_by_piece_as_it_does_whole() -> None:
    for alg in ("xxh3-128", "sha256", "blake3"):
        fill = Filling(LENGTH)
        fill.digesting(alg)
        _arrive(fill, DATA, [7, 65536, 200_000])
        assert fill.digest(alg) == digest(alg, DATA), alg
