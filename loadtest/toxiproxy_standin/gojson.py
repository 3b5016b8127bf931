"""Go's ``encoding/json`` as Toxiproxy uses it, so the stand-in reads and writes JSON alike.

Toxiproxy decodes request bodies with ``json.NewDecoder(body).Decode(&value)`` and
answers with ``json.Marshal``. Both differ from Python's ``json`` in ways a client
can see, and the stand-in must match them:

* decoding reads the first JSON value only (trailing bytes are ignored), matches
  object keys to struct fields case-insensitively (the last matching key wins),
  leaves a field alone when its value is ``null``, and refuses a number with a
  fraction or exponent (``1.0``, ``1e3``) for an integer field;
* a type mismatch is an error naming the field (``json: cannot unmarshal string
  into Go struct field Proxy.name of type string``);
* encoding is compact, escapes ``<``, ``>``, ``&``, U+2028 and U+2029, and writes a
  float32 in its shortest form (``1``, not ``1.0``).
"""

from __future__ import annotations

import json
import struct
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Go writes floats without an exponent in this range (strconv 'f' format), else with one.
_PLAIN_FLOAT_LIMIT = 1e21
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
            "\u2029": "\\u2029"}  # fmt: skip
ABSENT: Any = object()  # a field the object does not have


class DecodeError(ValueError):
    """The body is not what Go's decoder accepts; the message is Go's, roughly."""


class Fields(list[tuple[str, Any]]):
    """A JSON object as its key/value pairs in document order."""

    def get_field(self, name: str) -> Any:
        """The value Go would decode into field ``name``, or :data:`ABSENT`."""
        folded = name.casefold()
        value = ABSENT
        for key, item in self:
            if key == name or key.casefold() == folded:
                value = item  # Go assigns every matching key in turn: the last wins
        return value


class FloatLiteral(float):
    """A number written with a fraction or an exponent, which Go's int fields refuse."""

    literal: str


def _parse_float(text: str) -> FloatLiteral:
    value = FloatLiteral(text)
    value.literal = text
    return value


def _refuse_constant(text: str) -> Any:
    raise DecodeError(f"invalid character {text[0]!r} looking for beginning of value")


_DECODER = json.JSONDecoder(
    object_pairs_hook=Fields, parse_float=_parse_float, parse_constant=_refuse_constant
)


def decode(raw: bytes) -> Any:
    """The first JSON value in ``raw``, objects as :class:`Fields`; :exc:`DecodeError` if none."""
    text = raw.decode("utf-8", "replace").lstrip(" \t\r\n")
    if not text:
        raise DecodeError("EOF")
    try:
        value, _end = _DECODER.raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise DecodeError("unexpected EOF") from exc
        raise DecodeError(f"invalid character {text[exc.pos]!r}: {exc.msg}") from exc
    return value


def kind(value: Any) -> str:
    """How Go's type errors name a JSON value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, FloatLiteral):
        return f"number {value.literal}"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) and not isinstance(value, Fields) else "object"


def _mismatch(value: Any, where: str, go_type: str) -> DecodeError:
    # Go quotes the number only when it was decoding into a number.
    numeric = go_type in ("int64", "float32")
    plain = kind(value) if numeric else kind(value).split()[0]
    return DecodeError(f"json: cannot unmarshal {plain} into Go struct field {where} of type "
                       f"{go_type}")  # fmt: skip


def struct_fields(value: Any, go_type: str) -> Fields | None:
    """``value`` as an object to decode a struct from; ``None`` (null) decodes nothing."""
    if value is None or isinstance(value, Fields):
        return value
    raise DecodeError(f"json: cannot unmarshal {kind(value).split()[0]} into Go value of type "
                      f"{go_type}")  # fmt: skip


def _given(
    obj: Fields | None, name: str, where: str, go_type: str, fits: type | tuple[type, ...]
) -> Any:
    """Field ``name``'s value, checked against ``fits``; :data:`ABSENT` if missing or null
    (Go then leaves the field as it was)."""
    value = ABSENT if obj is None else obj.get_field(name)
    if value is None or value is ABSENT:
        return ABSENT
    if not isinstance(value, fits):
        raise _mismatch(value, f"{where}.{name}", go_type)
    return value


def string_field(obj: Fields | None, name: str, where: str, current: str) -> str:
    value = _given(obj, name, where, "string", str)
    return current if value is ABSENT else str(value)


def bool_field(obj: Fields | None, name: str, where: str, current: bool | None) -> bool | None:
    value = _given(obj, name, where, "bool", bool)
    return current if value is ABSENT else bool(value)


def int64_field(obj: Fields | None, name: str, where: str, current: int) -> int:
    value = _given(obj, name, where, "int64", int)
    if value is ABSENT:
        return current
    # bool is an int in Python, and Go's int64 holds a narrower range than ours.
    if isinstance(value, bool) or not INT64_MIN <= value <= INT64_MAX:
        raise _mismatch(value, f"{where}.{name}", "int64")
    return int(value)


def float32_field(obj: Fields | None, name: str, where: str, current: float) -> float:
    value = _given(obj, name, where, "float32", (int, float))
    if value is ABSENT:
        return current
    if isinstance(value, bool):  # an int to Python, no number to Go
        raise _mismatch(value, f"{where}.{name}", "float32")
    try:
        return float32(float(value))
    except (OverflowError, struct.error) as exc:
        raise _mismatch(value, f"{where}.{name}", "float32") from exc


def object_field(obj: Fields | None, name: str, where: str, go_type: str) -> Fields | None:
    """A nested struct field: its object, or ``None`` when absent or null."""
    value = _given(obj, name, where, go_type, Fields)
    return None if value is ABSENT else value


def float32(value: float) -> float:
    """``value`` rounded to float32, as the shortest decimal that rounds back to it."""
    (rounded,) = struct.unpack("<f", struct.pack("<f", value))
    for digits in range(1, 10):  # nine significant digits always round-trip a float32
        shortest = float(f"{rounded:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", shortest))[0] == rounded:
            return shortest
    return float(rounded)


def number(value: float) -> int | float:
    """A float as Go's encoder writes it: whole numbers without ``.0``."""
    if value.is_integer() and abs(value) < _PLAIN_FLOAT_LIMIT:
        return int(value)
    return value


def encode(data: Any) -> bytes:
    """``json.Marshal(data)``: compact, HTML-safe, UTF-8."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    for char, escape in _ESCAPES.items():
        text = text.replace(char, escape)
    return text.encode()
