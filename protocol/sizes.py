"""Human sizes: ``4MiB``, ``10G``, ``123`` (binary units throughout)."""

from __future__ import annotations

import re

from protocol.errors import BadSize

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GIB": 1 << 30,
    "T": 1 << 40,
    "TIB": 1 << 40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes named by ``text``; ``K M G T`` and ``KiB MiB GiB TiB`` are binary units."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise BadSize(f"not a size: {text!r} (try 4MiB, 10GiB or 1048576)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise BadSize(f"unknown size unit {unit!r} in {text!r}; use KiB, MiB, GiB or TiB")
    try:
        return int(float(number) * factor) if "." in number else int(number) * factor
    except (OverflowError, ValueError):  # float inf, or more digits than int() accepts
        raise BadSize(f"size {text!r} is too large") from None


def format_size(size_bytes: int) -> str:
    """A short human form of ``size_bytes`` (``4.0 MiB``)."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
