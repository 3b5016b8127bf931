"""HTTP byte ranges (RFC 9110 §14).

Inside the project ranges are half-open ``[start, stop)``; HTTP's inclusive
last-byte position exists only in this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.errors import RangeNotSatisfiable, TooManyRanges

# A loader batching samples may send a few hundred ranges; thousands are abuse. The
# cap keeps parsing cost bounded (RFC 9110 §14.2 lets a server ignore or reject
# requests with many small or overlapping ranges).
MAX_RANGES = 256
# Longer headers are never legitimate for MAX_RANGES ranges of 20-digit numbers.
MAX_RANGE_HEADER_BYTES = MAX_RANGES * 44


@dataclass(frozen=True, slots=True)
class ByteRange:
    """A half-open byte range ``[start, stop)`` within an object."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise ValueError(f"invalid byte range [{self.start}, {self.stop})")

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class _Spec:
    """One range-spec as written: ``first-last``, ``first-`` or ``-suffix``."""

    first: int | None
    last: int | None


def parse_range(header: str, size: int) -> list[ByteRange] | None:
    """Resolve a ``Range`` header against an object of ``size`` bytes.

    Returns the satisfiable ranges, clipped to the object, in the order written;
    ``None`` when the header does not parse (RFC 9110 §14.2: the server then
    ignores it and answers 200).

    Raises :class:`RangeNotSatisfiable` when it parses but nothing overlaps the
    object, and :class:`TooManyRanges` (a 416 too) when it lists more than
    ``MAX_RANGES``.
    """
    if len(header) <= MAX_RANGE_HEADER_BYTES and _PLAIN_LIST.fullmatch(header) is not None:
        return _plain_list(header, size)
    return _parse_general(header, size)


# The form loaders send, ``bytes=first-last[,first-last]...``, read in one C pass;
# digit runs this short are always valid positions. Anything else (whitespace, other
# case, suffixes, open ends, empty elements, longer numbers) is the general reader's.
_PLAIN_LIST = re.compile(r"bytes=[0-9]{1,18}-[0-9]{1,18}(?:,[0-9]{1,18}-[0-9]{1,18})*+")


def _plain_list(header: str, size: int) -> list[ByteRange] | None:
    """:func:`parse_range` of a header :data:`_PLAIN_LIST` matches, to the same answer."""
    numbers = list(map(int, header[6:].replace("-", ",").split(",")))
    if len(numbers) > 2 * MAX_RANGES:
        raise TooManyRanges(size, f"more than {MAX_RANGES} ranges in one request")
    ranges = []
    for first, last in zip(numbers[::2], numbers[1::2], strict=True):
        if last < first:
            return None  # §14.1.1: the whole header is ignored
        if first < size:
            ranges.append(ByteRange(first, min(last + 1, size)))
    if not ranges:
        raise RangeNotSatisfiable(size)
    return ranges


def _parse_general(header: str, size: int) -> list[ByteRange] | None:
    specs = _parse_specs(header, size)
    if specs is None:
        return None
    ranges = [r for r in (_resolve(spec, size) for spec in specs) if r is not None]
    if not ranges:
        raise RangeNotSatisfiable(size)
    return ranges


def first_byte_wanted(header: str | None) -> int | None:
    """The offset an answer to a ``Range`` header (or its absence) starts at, if that is
    known without the object's size: 0 without one, ``first`` for ``bytes=first-...``;
    None for a suffix range, or a header that does not parse (the size decides both)."""
    if header is None:
        return 0
    try:
        specs = _parse_specs(header, 0)
    except TooManyRanges:
        return None
    if not specs or specs[0].first is None:
        return None
    return specs[0].first


def _parse_specs(header: str, size: int) -> list[_Spec] | None:
    if len(header) > MAX_RANGE_HEADER_BYTES:
        raise TooManyRanges(size, f"Range header longer than {MAX_RANGE_HEADER_BYTES} bytes")
    unit, sep, rest = header.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return None
    parts = [p.strip() for p in rest.split(",")]
    # RFC 9110 §5.6.1: empty list elements are allowed and ignored.
    parts = [p for p in parts if p]
    if not parts:
        return None
    if len(parts) > MAX_RANGES:
        raise TooManyRanges(size, f"more than {MAX_RANGES} ranges in one request")
    specs = [_parse_spec(p) for p in parts]
    if any(s is None for s in specs):
        return None
    return [s for s in specs if s is not None]


def _parse_spec(text: str) -> _Spec | None:
    first_text, sep, last_text = text.partition("-")
    if not sep:
        return None
    first = _parse_digits(first_text)
    last = _parse_digits(last_text)
    if (first_text and first is None) or (last_text and last is None):
        return None
    if first is None and last is None:
        return None
    if first is not None and last is not None and last < first:
        return None  # §14.1.1: last-pos < first-pos makes the spec invalid
    return _Spec(first, last)


def _parse_digits(text: str) -> int | None:
    # str.isdigit() accepts non-ASCII digits such as '²'; HTTP means ASCII only.
    if not text or not text.isascii() or not text.isdigit():
        return None
    try:
        return int(text)
    except ValueError:  # more digits than sys.get_int_max_str_digits(): not a real position
        return None


def _resolve(spec: _Spec, size: int) -> ByteRange | None:
    if spec.first is None:
        assert spec.last is not None
        if spec.last == 0 or size == 0:
            return None  # a zero-length suffix, or any suffix of an empty object, selects nothing
        return ByteRange(max(0, size - spec.last), size)
    if spec.first >= size:
        return None
    stop = size if spec.last is None else min(spec.last + 1, size)
    return ByteRange(spec.first, stop)


def content_range(r: ByteRange, size: int) -> str:
    """The ``Content-Range`` value for a 206 carrying ``r`` (RFC 9110 §14.4)."""
    return f"bytes {r.start}-{r.stop - 1}/{size}"


def unsatisfied_content_range(size: int) -> str:
    """The ``Content-Range`` value for a 416 answer (RFC 9110 §15.5.17)."""
    return f"bytes */{size}"


# Byte positions and lengths beyond a file offset's range (off_t, 2**63 - 1) belong to
# no object; more digits than it has are refused before int() sees them.
MAX_POSITION = (1 << 63) - 1
_POSITION = r"([0-9]{1,19})"
# RFC 9110 §14.4: the unit (case-insensitive, §14.1), one SP, then either
# ``first-last/length`` (length may be ``*``) or ``*/length``; no other whitespace
# but the OWS around a field value (§5.5). ASCII: IGNORECASE must not match
# 'ſ' (U+017F) for 's'.
_CONTENT_RANGE = re.compile(
    rf"[ \t]*bytes (?:{_POSITION}-{_POSITION}/(?:{_POSITION}|\*)|\*/{_POSITION})[ \t]*",
    re.ASCII | re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ContentRange:
    """A ``Content-Range`` value, read (RFC 9110 §14.4)."""

    range: ByteRange | None  # the bytes an answer carries; None for ``bytes */length``
    size: int | None  # the object's length; None for ``*`` (unknown to the sender)


def parse_content_range(value: str) -> ContentRange | None:
    """What a ``Content-Range`` field value says, or ``None`` when it is not a valid
    one: malformed, last-pos before first-pos, or last-pos at or past the length."""
    match = _CONTENT_RANGE.fullmatch(value)
    if match is None:
        return None
    first, last, size, unsatisfied_size = match.groups()
    if unsatisfied_size is not None:
        unsatisfied = int(unsatisfied_size)
        return ContentRange(None, unsatisfied) if unsatisfied <= MAX_POSITION else None
    start, last_pos = int(first), int(last)
    length = None if size is None else int(size)
    if length is not None and length > MAX_POSITION:
        return None
    # §14.4: invalid when last-pos < first-pos, or last-pos >= complete-length.
    if not start <= last_pos < (MAX_POSITION if length is None else length):
        return None
    return ContentRange(ByteRange(start, last_pos + 1), length)


def range_header(r: ByteRange) -> str:
    """The ``Range`` request header asking for ``r``."""
    return f"bytes={r.start}-{r.stop - 1}"
