"""Table-driven tests for :mod:`protocol.chunks`."""

from __future__ import annotations

import pytest

from protocol.chunks import ChunkSlice, chunk_bounds, chunk_count, chunk_slices
from protocol.ranges import ByteRange

# (size, chunk_size, count)
COUNT_CASES: list[tuple[int, int, int]] = [
    (0, 4, 0),
    (1, 4, 1),
    (3, 4, 1),
    (4, 4, 1),
    (5, 4, 2),
    (8, 4, 2),
    (9, 4, 3),
    (10, 4, 3),
    (1, 1, 1),
    (7, 1, 7),
    (10, 100, 1),
    (64 << 30, 4 << 20, 16384),
    ((64 << 30) + 1, 4 << 20, 16385),
]


@pytest.mark.parametrize(("size", "chunk_size", "count"), COUNT_CASES)
def test_chunk_count(size: int, chunk_size: int, count: int) -> None:
    assert chunk_count(size, chunk_size) == count


# (index, size, chunk_size, (start, stop))
BOUNDS_CASES: list[tuple[int, int, int, tuple[int, int]]] = [
    (0, 10, 4, (0, 4)),
    (1, 10, 4, (4, 8)),
    (2, 10, 4, (8, 10)),  # last partial chunk
    (0, 8, 4, (0, 4)),
    (1, 8, 4, (4, 8)),  # last chunk of an exact multiple is full
    (0, 1, 4, (0, 1)),
    (0, 3, 100, (0, 3)),
    (6, 7, 1, (6, 7)),
]


@pytest.mark.parametrize(("index", "size", "chunk_size", "bounds"), BOUNDS_CASES)
def test_chunk_bounds(index: int, size: int, chunk_size: int, bounds: tuple[int, int]) -> None:
    assert chunk_bounds(index, size, chunk_size) == ByteRange(*bounds)


# (index, size, chunk_size): no such chunk
BOUNDS_OUT_OF_RANGE: list[tuple[int, int, int]] = [
    (3, 10, 4),
    (2, 8, 4),
    (-1, 10, 4),
    (0, 0, 4),  # an empty object has no chunks
    (1, 1, 4),
    (100, 10, 4),
]


@pytest.mark.parametrize(("index", "size", "chunk_size"), BOUNDS_OUT_OF_RANGE)
def test_chunk_bounds_out_of_range(index: int, size: int, chunk_size: int) -> None:
    with pytest.raises(IndexError, match=f"chunk {index} outside"):
        chunk_bounds(index, size, chunk_size)


# (range, size, chunk_size, [(index, start, stop), ...])
SLICE_CASES: list[tuple[tuple[int, int], int, int, list[tuple[int, int, int]]]] = [
    # whole object, last chunk partial
    ((0, 10), 10, 4, [(0, 0, 4), (1, 0, 4), (2, 0, 2)]),
    # whole object, exact multiple
    ((0, 8), 8, 4, [(0, 0, 4), (1, 0, 4)]),
    # exactly one chunk, on its boundaries
    ((0, 4), 10, 4, [(0, 0, 4)]),
    ((4, 8), 10, 4, [(1, 0, 4)]),
    ((8, 10), 10, 4, [(2, 0, 2)]),
    # inside one chunk
    ((1, 3), 10, 4, [(0, 1, 3)]),
    ((9, 10), 10, 4, [(2, 1, 2)]),
    # single bytes
    ((0, 1), 10, 4, [(0, 0, 1)]),
    ((3, 4), 10, 4, [(0, 3, 4)]),
    ((4, 5), 10, 4, [(1, 0, 1)]),
    ((5, 6), 10, 4, [(1, 1, 2)]),
    # across boundaries
    ((3, 5), 10, 4, [(0, 3, 4), (1, 0, 1)]),
    ((3, 9), 10, 4, [(0, 3, 4), (1, 0, 4), (2, 0, 1)]),
    ((2, 6), 10, 4, [(0, 2, 4), (1, 0, 2)]),
    ((4, 10), 10, 4, [(1, 0, 4), (2, 0, 2)]),
    # chunk size 1 and a chunk larger than the object
    ((2, 5), 7, 1, [(2, 0, 1), (3, 0, 1), (4, 0, 1)]),
    ((2, 5), 10, 100, [(0, 2, 5)]),
    # empty ranges touch no chunk
    ((4, 4), 10, 4, []),
    ((10, 10), 10, 4, []),
    ((0, 0), 0, 4, []),
]


@pytest.mark.parametrize(("r", "size", "chunk_size", "expected"), SLICE_CASES)
def test_chunk_slices(
    r: tuple[int, int], size: int, chunk_size: int, expected: list[tuple[int, int, int]]
) -> None:
    slices = list(chunk_slices(ByteRange(*r), size, chunk_size))
    assert slices == [ChunkSlice(*s) for s in expected]
    assert sum(s.length for s in slices) == r[1] - r[0]


# (callable, message): argument errors
ERROR_CASES = [
    (lambda: chunk_count(10, 0), "chunk size must be positive"),
    (lambda: chunk_count(10, -4), "chunk size must be positive"),
    (lambda: chunk_count(-1, 4), "must not be negative"),
    (lambda: chunk_bounds(0, 10, 0), "chunk size must be positive"),
    (lambda: list(chunk_slices(ByteRange(0, 11), 10, 4)), "beyond an object of 10 bytes"),
    (lambda: list(chunk_slices(ByteRange(0, 1), 0, 4)), "beyond an object of 0 bytes"),
    (lambda: list(chunk_slices(ByteRange(0, 1), 10, 0)), "chunk size must be positive"),
]


@pytest.mark.parametrize(("call", "message"), ERROR_CASES)
def test_argument_errors(call: object, message: str) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match=message):
        call()


def test_chunk_slice_length() -> None:
    assert ChunkSlice(3, 1, 4).length == 3
    assert ChunkSlice(0, 0, 0).length == 0
