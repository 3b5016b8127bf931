"""Chunk geometry: which fixed-size chunks a byte range touches.

Chunk ``i`` of an object covers ``[i*chunk_size, min(size, (i+1)*chunk_size))``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from protocol.ranges import ByteRange


@dataclass(frozen=True, slots=True)
class ChunkSlice:
    """The part ``[start, stop)`` of chunk ``index`` that a range needs.

    ``start`` and ``stop`` are offsets inside the chunk, not in the object.
    """

    index: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def chunk_count(size: int, chunk_size: int) -> int:
    """How many chunks an object of ``size`` bytes has (0 for an empty object)."""
    _check(size, chunk_size)
    return -(-size // chunk_size)


def chunk_bounds(index: int, size: int, chunk_size: int) -> ByteRange:
    """The object bytes ``[start, stop)`` that chunk ``index`` covers."""
    if not 0 <= index < chunk_count(size, chunk_size):
        raise IndexError(f"chunk {index} outside an object of {size} bytes")
    start = index * chunk_size
    return ByteRange(start, min(size, start + chunk_size))


def chunk_slices(r: ByteRange, size: int, chunk_size: int) -> Iterator[ChunkSlice]:
    """The chunks that ``r`` touches, in order, with the part of each it needs.

    An empty range touches no chunk.
    """
    _check(size, chunk_size)
    if r.stop > size:
        raise ValueError(f"range [{r.start}, {r.stop}) beyond an object of {size} bytes")
    if r.length == 0:
        return
    first, last = r.start // chunk_size, (r.stop - 1) // chunk_size
    for index in range(first, last + 1):
        base = index * chunk_size
        yield ChunkSlice(
            index,
            max(r.start, base) - base,
            min(r.stop, base + chunk_size) - base,
        )


def _check(size: int, chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk size must be positive, not {chunk_size}")
    if size < 0:
        raise ValueError(f"object size must not be negative, not {size}")
