"""The Range reader's one-pass path for ``bytes=a-b,c-d,...``: whatever the header, it
answers exactly as the general reader does (ranges, None, or the same 416)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.ranges import MAX_RANGES, ByteRange, _parse_general, parse_range

Outcome = list[ByteRange] | None | tuple[type[ProtocolError], str]


def _outcome(
    read: Callable[[str, int], list[ByteRange] | None], header: str, size: int
) -> Outcome:
    try:
        return read(header, size)
    except ProtocolError as exc:
        return type(exc), str(exc)


_NUMBER = st.one_of(st.integers(0, 300), st.integers(0, 10**18 - 1),
                    st.integers(10**18, 10**20)).map(str)
# Well-formed specs mostly, and near misses: suffixes, open ends, whitespace, other
# units and case, signs, non-ASCII digits, empty elements.
_SPEC = st.one_of(
    st.tuples(_NUMBER, _NUMBER).map("-".join),
    st.tuples(_NUMBER, _NUMBER).map("-".join),
    st.sampled_from(["-5", "5-", "", " 1-2", "1 -2", "1-2 ", "+1-2", "1--2", "²-3", "0x1-2",
                     "1-2-3", "-", "a-b"]),
)
_UNIT = st.sampled_from(["bytes=", "bytes=", "bytes=", "Bytes=", "bytes =", " bytes=",
                         "items=", "bytes", ""])


@settings(max_examples=1000, deadline=None)
@given(unit=_UNIT, specs=st.lists(_SPEC, min_size=1, max_size=6),
       size=st.one_of(st.integers(0, 400), st.integers(0, 10**19)))
def test_it_reads_any_header_as_the_general_reader(unit: str, specs: list[str], size: int) -> None:
    header = unit + ",".join(specs)
    assert _outcome(parse_range, header, size) == _outcome(_parse_general, header, size)


@given(count=st.integers(MAX_RANGES - 2, MAX_RANGES + 2), size=st.integers(0, 10**6))
def test_it_counts_ranges_as_the_general_reader(count: int, size: int) -> None:
    header = "bytes=" + ",".join(f"{i * 10}-{i * 10 + 9}" for i in range(count))
    assert _outcome(parse_range, header, size) == _outcome(_parse_general, header, size)


def test_a_loaders_batch_reads_as_its_ranges() -> None:
    assert parse_range("bytes=0-9,100-199,1000-1999", 1500) == [
        ByteRange(0, 10), ByteRange(100, 200), ByteRange(1000, 1500)]
    assert parse_range("bytes=5-4,0-9", 100) is None
