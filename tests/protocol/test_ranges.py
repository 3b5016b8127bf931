"""Table-driven tests for :mod:`protocol.ranges` (h11 ``SIMPLE_CASES`` style)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ProtocolError, RangeNotSatisfiable, TooManyRanges
from protocol.ranges import (
    MAX_POSITION,
    MAX_RANGE_HEADER_BYTES,
    MAX_RANGES,
    ByteRange,
    ContentRange,
    content_range,
    first_byte_wanted,
    parse_content_range,
    parse_range,
    range_header,
    unsatisfied_content_range,
)

HUGE = "9" * 25  # more than 20 digits: beyond any 64-bit size
UNSATISFIABLE = "416"

# (header, size, expected): expected is a list of (start, stop) half-open ranges,
# None (header ignored: answer 200) or UNSATISFIABLE (RangeNotSatisfiable(size)).
SIMPLE_CASES: list[tuple[str, int, list[tuple[int, int]] | str | None]] = [
    # first-last, inclusive on the wire, half-open inside
    ("bytes=0-0", 10, [(0, 1)]),
    ("bytes=0-9", 10, [(0, 10)]),
    ("bytes=2-5", 10, [(2, 6)]),
    ("bytes=5-5", 10, [(5, 6)]),
    ("bytes=9-9", 10, [(9, 10)]),
    ("bytes=00005-00007", 10, [(5, 8)]),
    # last beyond the object is clipped
    ("bytes=0-10", 10, [(0, 10)]),
    ("bytes=8-100", 10, [(8, 10)]),
    (f"bytes=5-{HUGE}", 10, [(5, 10)]),
    # open ranges a-
    ("bytes=0-", 10, [(0, 10)]),
    ("bytes=5-", 10, [(5, 10)]),
    ("bytes=9-", 10, [(9, 10)]),
    ("bytes=10-", 10, UNSATISFIABLE),
    (f"bytes={HUGE}-", 10, UNSATISFIABLE),
    # suffix ranges -n
    ("bytes=-1", 10, [(9, 10)]),
    ("bytes=-3", 10, [(7, 10)]),
    ("bytes=-10", 10, [(0, 10)]),
    ("bytes=-11", 10, [(0, 10)]),
    (f"bytes=-{HUGE}", 10, [(0, 10)]),
    ("bytes=-0", 10, UNSATISFIABLE),
    # first-pos at or beyond the end
    ("bytes=10-20", 10, UNSATISFIABLE),
    (f"bytes={HUGE}-{HUGE}", 10, UNSATISFIABLE),
    # first > last: the spec is invalid, so the whole header is ignored
    ("bytes=5-4", 10, None),
    ("bytes=1-0", 10, None),
    (f"bytes={HUGE}-5", 10, None),
    ("bytes=0-1,5-4", 10, None),
    # one-byte object
    ("bytes=0-0", 1, [(0, 1)]),
    ("bytes=-1", 1, [(0, 1)]),
    ("bytes=-5", 1, [(0, 1)]),
    ("bytes=1-", 1, UNSATISFIABLE),
    # empty object: every parseable range is unsatisfiable
    ("bytes=0-", 0, UNSATISFIABLE),
    ("bytes=0-0", 0, UNSATISFIABLE),
    ("bytes=0-100", 0, UNSATISFIABLE),
    ("bytes=-1", 0, UNSATISFIABLE),
    ("bytes=-0", 0, UNSATISFIABLE),
    (f"bytes=-{HUGE}", 0, UNSATISFIABLE),
    ("bytes=0-0,-1,5-", 0, UNSATISFIABLE),
    ("bytes=5-4", 0, None),
    ("garbage", 0, None),
    # several ranges: order as written, overlaps kept (merging is the response's job)
    ("bytes=0-1,4-5", 10, [(0, 2), (4, 6)]),
    ("bytes=4-5,0-1", 10, [(4, 6), (0, 2)]),
    ("bytes=0-5,3-8", 10, [(0, 6), (3, 9)]),
    ("bytes=0-1,0-1", 10, [(0, 2), (0, 2)]),
    ("bytes=-2,0-0", 10, [(8, 10), (0, 1)]),
    ("bytes=0-1,10-20", 10, [(0, 2)]),
    ("bytes=10-20,-0,3-", 10, [(3, 10)]),
    ("bytes=10-20,-0", 10, UNSATISFIABLE),
    # unit: case-insensitive, anything else is ignored
    ("BYTES=0-1", 10, [(0, 2)]),
    ("Bytes=0-1", 10, [(0, 2)]),
    ("items=0-1", 10, None),
    ("bits=0-1", 10, None),
    ("byte=0-1", 10, None),
    ("bytes 0-1", 10, None),
    ("bytes:0-1", 10, None),
    # whitespace: optional around list elements, not inside a range-spec
    ("bytes=0-1 , 3-4", 10, [(0, 2), (3, 5)]),
    ("bytes= 0-1\t", 10, [(0, 2)]),
    ("bytes=0 -1", 10, None),
    ("bytes=0- 1", 10, None),
    ("bytes=- 1", 10, None),
    # empty list elements are ignored (RFC 9110 §5.6.1)
    ("bytes=0-1,,3-4", 10, [(0, 2), (3, 5)]),
    ("bytes=,0-1,", 10, [(0, 2)]),
    ("bytes=", 10, None),
    ("bytes=,", 10, None),
    ("bytes= , ", 10, None),
    # garbage
    ("", 10, None),
    ("bytes", 10, None),
    ("=", 10, None),
    ("bytes=-", 10, None),
    ("bytes=--1", 10, None),
    ("bytes=1-2-3", 10, None),
    ("bytes=abc", 10, None),
    ("bytes=a-b", 10, None),
    ("bytes=0x1-2", 10, None),
    ("bytes=+1-2", 10, None),
    ("bytes=-+1", 10, None),
    ("bytes=-1-", 10, None),
    ("bytes=1.5-2", 10, None),
    ("bytes=1_0-20", 10, None),
    ("bytes=1e3-", 10, None),
    ("bytes=0-1;q=1", 10, None),
    ("bytes=0-1,garbage", 10, None),
    # non-ASCII digits (str.isdigit() would accept them)
    ("bytes=٣-5", 10, None),
    ("bytes=0-٥", 10, None),
    ("bytes=²-5", 10, None),
    ("bytes=-²", 10, None),
    ("bytes=０-5", 10, None),
    ("bytes=𝟎-5", 10, None),
    # a position longer than int() converts (4300 digits) is no real position
    ("bytes=0-" + "9" * 5000, 10, None),
    ("bytes=-" + "9" * 5000, 10, None),
    ("bytes=" + "0" * 4999 + "1-", 10, None),
]


def _ids(case: tuple[str, int, object]) -> str:
    header, size, _ = case
    return f"{header[:40]!r}@{size}"


@pytest.mark.parametrize(("header", "size", "expected"), SIMPLE_CASES, ids=map(_ids, SIMPLE_CASES))
def test_parse_range(header: str, size: int, expected: list[tuple[int, int]] | str | None) -> None:
    if isinstance(expected, str):  # UNSATISFIABLE
        with pytest.raises(RangeNotSatisfiable) as info:
            parse_range(header, size)
        assert info.value.size == size
        assert info.value.status_hint == 416
    else:
        result = parse_range(header, size)
        if expected is None:
            assert result is None
        else:
            assert result == [ByteRange(a, b) for a, b in expected]


TOO_MANY_CASES: list[tuple[str, str]] = [
    ("257 ranges", "bytes=" + ",".join(["0-0"] * (MAX_RANGES + 1))),
    ("257 disjoint", "bytes=" + ",".join(f"{i}-{i}" for i in range(MAX_RANGES + 1))),
    ("257 garbage elements", "bytes=" + ",".join(["x"] * (MAX_RANGES + 1))),
    ("header too long", "bytes=0-" + "0" * MAX_RANGE_HEADER_BYTES),
    ("long non-bytes header", "x" * (MAX_RANGE_HEADER_BYTES + 1)),
]


@pytest.mark.parametrize(("name", "header"), TOO_MANY_CASES, ids=[c[0] for c in TOO_MANY_CASES])
def test_too_many_ranges(name: str, header: str) -> None:
    with pytest.raises(TooManyRanges) as info:
        parse_range(header, 1000)
    assert isinstance(info.value, ProtocolError)
    # RFC 9110 §15.5.17: an excessive request of ranges is a 416, saying the size
    assert info.value.status_hint == 416
    assert isinstance(info.value, RangeNotSatisfiable) and info.value.size == 1000


def test_exactly_max_ranges_is_accepted() -> None:
    header = "bytes=" + ",".join(f"{i}-{i}" for i in range(MAX_RANGES))
    assert parse_range(header, 1000) == [ByteRange(i, i + 1) for i in range(MAX_RANGES)]


def test_header_of_exactly_max_length_is_parsed() -> None:
    header = "bytes=0-" + "0" * (MAX_RANGE_HEADER_BYTES - len("bytes=0-") - 1) + "4"
    assert len(header) == MAX_RANGE_HEADER_BYTES
    # 11k digits is over int()'s limit: not a real position, so the header is ignored
    assert parse_range(header, 10) is None


FORMAT_CASES: list[tuple[ByteRange, int, str, str]] = [
    # range, size, Content-Range, Range request header
    (ByteRange(0, 1), 1, "bytes 0-0/1", "bytes=0-0"),
    (ByteRange(0, 10), 10, "bytes 0-9/10", "bytes=0-9"),
    (ByteRange(7, 10), 10, "bytes 7-9/10", "bytes=7-9"),
    (ByteRange(4, 8), 1 << 40, "bytes 4-7/1099511627776", "bytes=4-7"),
]


@pytest.mark.parametrize(("r", "size", "cr", "rh"), FORMAT_CASES)
def test_formatting(r: ByteRange, size: int, cr: str, rh: str) -> None:
    assert content_range(r, size) == cr
    assert range_header(r) == rh
    assert parse_range(rh, size) == [r]


@pytest.mark.parametrize(("size", "expected"), [(0, "bytes */0"), (10, "bytes */10")])
def test_unsatisfied_content_range(size: int, expected: str) -> None:
    assert unsatisfied_content_range(size) == expected


@pytest.mark.parametrize(("start", "stop", "length"), [(0, 0, 0), (0, 1, 1), (3, 10, 7)])
def test_byte_range_length(start: int, stop: int, length: int) -> None:
    assert ByteRange(start, stop).length == length


@pytest.mark.parametrize(("start", "stop"), [(-1, 0), (5, 4), (-3, -1), (1, 0)])
def test_byte_range_rejects_invalid(start: int, stop: int) -> None:
    with pytest.raises(ValueError, match="invalid byte range"):
        ByteRange(start, stop)


def test_range_not_satisfiable_message_names_size() -> None:
    err = RangeNotSatisfiable(1234)
    assert err.size == 1234
    assert "1234" in str(err)


@pytest.mark.parametrize(("header", "first"), [
    (None, 0),  # no Range: the whole object, from its first byte
    ("bytes=5-9", 5),
    ("bytes=5-", 5),
    (" bytes = 70000-70099", 70000),
    ("bytes=10-20,0-5", 10),  # an answer's parts go in the order asked
    ("bytes=-5", None),  # a suffix: where it starts depends on the size
    ("bytes=abc", None),
    ("items=1-2", None),
    ("bytes=" + ",".join(["0-1"] * 1000), None),  # too many ranges: refused later
])
def test_first_byte_wanted_is_known_without_the_size_or_not_at_all(
    header: str | None, first: int | None
) -> None:
    assert first_byte_wanted(header) == first


BIG = MAX_POSITION  # the largest length an object may have

# (Content-Range value, expected): expected is ((start, stop) or None for ``*/``,
# length or None for ``*``), or None when the value is not a valid Content-Range.
CONTENT_RANGE_CASES: list[tuple[str, tuple[tuple[int, int] | None, int | None] | None]] = [
    # valid: RFC 9110 §14.4's three shapes
    ("bytes 0-9/10", ((0, 10), 10)),
    ("bytes 0-0/1", ((0, 1), 1)),
    ("bytes 9-9/10", ((9, 10), 10)),
    ("bytes 4-7/1099511627776", ((4, 8), 1 << 40)),
    ("bytes 0-9/*", ((0, 10), None)),
    ("bytes */10", (None, 10)),
    ("bytes */0", (None, 0)),
    ("bytes 0005-0007/0010", ((5, 8), 10)),
    ("BYTES 0-9/10", ((0, 10), 10)),  # §14.1: range units are case-insensitive
    ("Bytes */10", (None, 10)),
    # malformed
    ("", None),
    ("bytes", None),
    ("bytes ", None),
    ("bytes 0-9", None),
    ("bytes 0-9/", None),
    ("bytes 0-/10", None),
    ("bytes -9/10", None),
    ("bytes 0/10", None),
    ("bytes=0-9/10", None),
    ("bytes0-9/10", None),
    ("items 0-9/10", None),
    ("byteſ 0-9/10", None),  # U+017F folds to 's' under a Unicode IGNORECASE
    ("bytes */*", None),
    ("bytes */", None),
    ("bytes *", None),
    ("bytes 0-9/10, bytes 20-29/30", None),
    ("bytes 0-9/10/11", None),
    ("bytes 0x1-9/10", None),
    ("bytes +1-9/10", None),
    ("bytes -1-9/10", None),
    ("bytes 1.0-9/10", None),
    ("bytes ²-9/10", None),  # str.isdigit() says yes; int() says no
    ("bytes ٣-9/10", None),  # an Arabic-Indic three
    ("bytes 0-9/１０", None),  # full-width digits
    # whitespace: OWS around the value only (§5.5), one SP after the unit
    (" bytes 0-9/10", ((0, 10), 10)),
    ("bytes 0-9/10 \t", ((0, 10), 10)),
    ("bytes  0-9/10", None),
    ("bytes\t0-9/10", None),
    ("bytes 0 -9/10", None),
    ("bytes 0- 9/10", None),
    ("bytes 0-9 /10", None),
    ("bytes 0-9/ 10", None),
    ("bytes * /10", None),
    ("bytes 0-9/10\r\n", None),
    ("bytes 0-9/10\n", None),
    ("\x0bbytes 0-9/10", None),
    ("bytes 0-9/10\xa0", None),
    # first > last
    ("bytes 9-0/10", None),
    ("bytes 1-0/*", None),
    # last >= length
    ("bytes 0-10/10", None),
    ("bytes 0-9/9", None),
    ("bytes 0-0/0", None),
    ("bytes 10-10/10", None),
    # overflow: positions past any file offset, and past int()'s digit limit
    (f"bytes 0-{BIG - 1}/{BIG}", ((0, BIG), BIG)),
    (f"bytes {BIG - 1}-{BIG - 1}/*", ((BIG - 1, BIG), None)),
    (f"bytes */{BIG}", (None, BIG)),
    (f"bytes 0-{BIG}/*", None),
    (f"bytes 0-9/{BIG + 1}", None),
    (f"bytes */{BIG + 1}", None),
    ("bytes 0-9/" + "9" * 20, None),
    ("bytes 0-" + "9" * 5000 + "/*", None),
    ("bytes " + "1" * 5000 + "-1/2", None),
    ("bytes */" + "9" * 5000, None),
]


@pytest.mark.parametrize(("value", "expected"), CONTENT_RANGE_CASES)
def test_parse_content_range(
    value: str, expected: tuple[tuple[int, int] | None, int | None] | None
) -> None:
    parsed = parse_content_range(value)
    if expected is None:
        assert parsed is None
        return
    span, size = expected
    assert parsed == ContentRange(None if span is None else ByteRange(*span), size)


@given(start=st.integers(0, BIG - 1), length=st.integers(1, BIG), extra=st.integers(0, BIG))
def test_parse_content_range_reads_what_content_range_writes(
    start: int, length: int, extra: int
) -> None:
    r = ByteRange(start, min(start + length, BIG))
    size = min(r.stop + extra, BIG)
    assert parse_content_range(content_range(r, size)) == ContentRange(r, size)
    assert parse_content_range(unsatisfied_content_range(size)) == ContentRange(None, size)
