"""Table-driven tests for :mod:`protocol.paths`."""

from __future__ import annotations

import pytest

from protocol.errors import BadPath, ProtocolError
from protocol.paths import MAX_PATH_BYTES, MAX_SEGMENT_BYTES, validate_path, validate_prefix

SEG = "a" * MAX_SEGMENT_BYTES  # the longest segment allowed

ACCEPTED: list[str] = [
    "a",
    "shard-0001.bin",
    "dataset/shard-0001.bin",
    "a/b/c/d/e/f.tar",
    "données/日本語.bin",
    "emoji/🦀.bin",
    "with space/and+plus.bin",
    "...",  # three dots is an ordinary name
    ".hidden",
    "a.",
    "..a",
    "a..",
    "%2ea",  # decodes to '.a'
    "a%20b",  # decodes to 'a b'
    "100%",  # a lone '%' is not an escape
    "%zz",
    "%25",  # decodes to '%'
    "%2525",  # decodes to '%25', then '%'
    "a\x80b",  # C1 range is not ASCII control
    SEG,
    "/".join([SEG] * 4),  # 1023 bytes
    "é" * (MAX_SEGMENT_BYTES // 2),  # 254 bytes of two-byte characters
]


@pytest.mark.parametrize("path", ACCEPTED, ids=[p[:30] for p in ACCEPTED])
def test_accepts(path: str) -> None:
    assert validate_path(path) == path


# (path, message fragment)
REJECTED: list[tuple[str, str]] = [
    ("", "empty object path"),
    ("/abs", "absolute"),
    ("/", "absolute"),
    ("//a", "absolute"),
    ("a//b", "empty path segment"),
    ("a/", "empty path segment"),
    ("a/b/", "empty path segment"),
    (".", "'.' and '..'"),
    ("..", "'.' and '..'"),
    ("./a", "'.' and '..'"),
    ("a/.", "'.' and '..'"),
    ("a/../b", "'.' and '..'"),
    ("../etc/passwd", "'.' and '..'"),
    ("%2e", "'.' and '..'"),
    ("%2e%2e", "'.' and '..'"),
    ("%2E%2e/x", "'.' and '..'"),
    ("a/%2E%2E", "'.' and '..'"),
    ("%252e%252e", "'.' and '..'"),  # double-encoded
    ("%25252e%25252e", "'.' and '..'"),  # triple-encoded
    ("%2525252e%2525252e", "'.' and '..'"),  # four times: the last decoding round
    ("%252525252e%252525252e", "encoded too many times"),  # five times
    ("a%252525252525b", "encoded too many times"),
    (".%2e", "'.' and '..'"),
    ("%2e.", "'.' and '..'"),
    ("a\\b", "backslash"),
    ("..\\x", "backslash"),
    ("%5c", "backslash"),
    ("%5C..", "backslash"),
    ("a%2fb", "encoded slashes"),
    ("a%2Fb", "encoded slashes"),
    ("a%252fb", "encoded slashes"),
    ("%2e%2e%2fetc", "encoded slashes"),
    ("a\x00b", "control"),
    ("\x00", "control"),
    ("a%00b", "control"),
    ("a%2500", "control"),
    ("a\x01", "control"),
    ("a\tb", "control"),
    ("a\nb", "control"),
    ("a\rb", "control"),
    ("a\x1fb", "control"),
    ("a\x7fb", "control"),
    ("a%0a", "control"),
    ("a%7F", "control"),
    ("a%ff", "UTF-8"),  # percent-decodes to an invalid UTF-8 byte
    ("a\ud800", "UTF-8"),  # lone surrogate
    ("a" * (MAX_SEGMENT_BYTES + 1), "segment longer"),
    ("é" * 128, "segment longer"),  # 256 bytes
    ("/".join([SEG] * 4) + "/b", "longer than 1024 bytes"),  # 1025 bytes
    ("a/" * 600, "longer than 1024 bytes"),
]


@pytest.mark.parametrize(("path", "message"), REJECTED, ids=[repr(p[0])[:30] for p in REJECTED])
def test_rejects(path: str, message: str) -> None:
    with pytest.raises(BadPath, match=message) as info:
        validate_path(path)
    assert isinstance(info.value, ProtocolError)
    assert info.value.status_hint == 400


def test_length_limits_are_the_documented_ones() -> None:
    assert MAX_PATH_BYTES == 1024
    assert MAX_SEGMENT_BYTES == 255
    assert len("/".join([SEG] * 4).encode()) == MAX_PATH_BYTES - 1


PREFIX_ACCEPTED = ["", "a", "a/", "a/b", "a/b/", "dataset/shard-00", "données/"]


@pytest.mark.parametrize("prefix", PREFIX_ACCEPTED)
def test_prefix_accepts(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


PREFIX_REJECTED = ["a//", "../", "a/../", "/a", "a\\", "%2e%2e/", "a\x00/", "a//b/"]


@pytest.mark.parametrize("prefix", PREFIX_REJECTED)
def test_prefix_rejects(prefix: str) -> None:
    with pytest.raises(BadPath):
        validate_prefix(prefix)
