"""Table-driven tests for :mod:`protocol.sizes`."""

from __future__ import annotations

import pytest

from protocol.errors import BadSize, ProtocolError
from protocol.sizes import format_size, parse_size

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# (text, bytes)
PARSE_CASES: list[tuple[str, int]] = [
    ("0", 0),
    ("1", 1),
    ("123", 123),
    ("1048576", MiB),
    ("007", 7),
    ("1B", 1),
    ("1b", 1),
    ("1K", KiB),
    ("1k", KiB),
    ("1KiB", KiB),
    ("1kib", KiB),
    ("4M", 4 * MiB),
    ("4MiB", 4 * MiB),
    ("4mib", 4 * MiB),
    ("4MIB", 4 * MiB),
    ("10G", 10 * GiB),
    ("10GiB", 10 * GiB),
    ("2T", 2 * TiB),
    ("2TiB", 2 * TiB),
    ("0K", 0),
    ("1.5K", 1536),
    ("0.5MiB", MiB // 2),
    ("1.9B", 1),  # fractional bytes are truncated
    ("0.0001K", 0),
    (" 4 MiB ", 4 * MiB),
    ("\t2K\n", 2 * KiB),
    ("4MiB ", 4 * MiB),
    ("99999999999999999999999T", 99999999999999999999999 * TiB),
]


@pytest.mark.parametrize(("text", "expected"), PARSE_CASES)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


# (text, message fragment)
BAD_CASES: list[tuple[str, str]] = [
    ("", "not a size"),
    (" ", "not a size"),
    ("abc", "not a size"),
    ("MiB", "not a size"),
    ("-1", "not a size"),
    ("+1", "not a size"),
    ("1.5.5", "not a size"),
    (".5K", "not a size"),
    ("5.", "not a size"),
    ("1e6", "not a size"),
    ("1,024", "not a size"),
    ("4 M iB", "not a size"),
    ("4MB", "unknown size unit"),
    ("4KB", "unknown size unit"),
    ("1P", "unknown size unit"),
    ("1PiB", "unknown size unit"),
    ("10 bytes", "unknown size unit"),
    ("4Mi", "unknown size unit"),
    ("1e", "unknown size unit"),
    ("4MiB/s", "not a size"),
    ("0x10", "not a size"),
    ("1_000", "not a size"),
    ("1" * 400 + ".5", "too large"),  # float overflows to inf
    ("1" * 400 + ".5T", "too large"),
    ("1" * 5000, "too large"),  # over int()'s digit limit
]


@pytest.mark.parametrize(("text", "message"), BAD_CASES, ids=[c[0][:20] for c in BAD_CASES])
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(BadSize, match=message) as info:
        parse_size(text)
    assert isinstance(info.value, ProtocolError)
    assert info.value.title == "Bad size"


# (bytes, text)
FORMAT_CASES: list[tuple[int, str]] = [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (KiB, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (MiB - 1, "1024.0 KiB"),
    (4 * MiB, "4.0 MiB"),
    (GiB, "1.0 GiB"),
    (TiB, "1.0 TiB"),
    (5 * TiB, "5.0 TiB"),
    (2048 * TiB, "2048.0 TiB"),
]


@pytest.mark.parametrize(("size", "expected"), FORMAT_CASES)
def test_format_size(size: int, expected: str) -> None:
    assert format_size(size) == expected


@pytest.mark.parametrize("size", [0, 1, 1023, KiB, 4 * MiB, 10 * GiB, 3 * TiB])
def test_format_then_parse_round_trips_exact_units(size: int) -> None:
    number, unit = format_size(size).split()
    assert parse_size(number + unit) == size
