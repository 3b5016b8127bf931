"""spoke.cache.early: which manifest's chunk an early fetch is, and refusing any other bytes."""

from __future__ import annotations

import pytest

from protocol.chunks import chunk_count
from protocol.manifest import Manifest
from protocol.ranges import ByteRange
from spoke.cache.early import EarlyFetch
from spoke.cache.flight import Filling
from spoke.upstream.errors import StaleVersion

CHUNK = 1000


def manifest(
    size: int, etag: str = '"v1"', chunk_size: int = CHUNK, path: str = "ds/a.bin"
) -> Manifest:
    return Manifest(path=path, size=size, etag=etag, chunk_size=chunk_size,
                    digest_alg="sha256", digests=(b"\0" * 32,) * chunk_count(size, chunk_size))


def early_at(start: int) -> EarlyFetch:
    return EarlyFetch("ds/a.bin", ByteRange(start, start + CHUNK), Filling(CHUNK))


def test_it_is_the_chunk_that_starts_where_it_was_asked_for() -> None:
    assert early_at(2 * CHUNK).bounds_in(manifest(10 * CHUNK)) == ByteRange(2000, 3000)
    # The last chunk: the hub's answer ends where the object does.
    assert early_at(2 * CHUNK).bounds_in(manifest(2 * CHUNK + 7)) == ByteRange(2000, 2007)


@pytest.mark.parametrize("other", [
    manifest(10 * CHUNK, chunk_size=2 * CHUNK),  # another chunk size: not one chunk
    manifest(2 * CHUNK),  # the object ends before it
    manifest(10 * CHUNK, path="ds/b.bin"),  # another object
])
def test_it_is_no_chunk_of_a_manifest_shaped_otherwise(other: Manifest) -> None:
    assert early_at(2 * CHUNK).bounds_in(other) is None


def test_once_the_answer_said_its_version_only_that_versions_manifest_takes_it() -> None:
    early = early_at(0)
    early.on_head('"v2"', ByteRange(0, CHUNK))
    assert early.bounds_in(manifest(5 * CHUNK)) is None
    assert early.bounds_in(manifest(5 * CHUNK, etag='"v2"')) == ByteRange(0, CHUNK)


def test_taken_on_before_the_answer_it_refuses_another_version_before_any_byte() -> None:
    early = early_at(0)
    early.take_on(manifest(5 * CHUNK), ByteRange(0, CHUNK))
    with pytest.raises(StaleVersion):
        early.on_head('"v2"', ByteRange(0, CHUNK))
    assert early.fill.received == 0


def test_a_chunk_shorter_than_asked_for_shrinks_the_fill_before_its_bytes() -> None:
    taken = early_at(0)
    taken.take_on(manifest(300), ByteRange(0, 300))
    assert taken.fill.length == 300
    taken.on_head('"v1"', ByteRange(0, 300))  # as the manifest said: accepted
    answered = early_at(0)
    answered.on_head('"v1"', ByteRange(0, 300))
    assert (answered.fill.length, len(answered.fill.space())) == (300, 300)
    with pytest.raises(StaleVersion):  # the manifest wants 300 bytes, not 200
        early = early_at(0)
        early.take_on(manifest(300), ByteRange(0, 300))
        early.on_head('"v1"', ByteRange(0, 200))
