"""Table-driven tests for :mod:`protocol.manifest`."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from protocol.errors import BadPath, ManifestError, ProtocolError
from protocol.manifest import (
    DIGEST_SIZES,
    MAX_MANIFEST_BYTES,
    Manifest,
    decode_manifest,
    encode_manifest,
)

D16 = [bytes([i]) * 16 for i in range(3)]

VALID: dict[str, Any] = {
    "path": "dataset/shard-0001.bin",
    "size": 10,
    "etag": '"abc123"',
    "chunk_size": 4,
    "digest_alg": "xxh3-128",
    "digests": D16,
    "mtime": 784111777,
    "mtime_ns": 784111777_250_000_000,
}


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def with_(**changes: Any) -> bytes:
    raw = {**VALID, **changes}
    return pack({k: v for k, v in raw.items() if v is not _MISSING})


_MISSING = object()

# (name, manifest fields) that are valid
VALID_CASES: list[tuple[str, dict[str, Any]]] = [
    ("basic", VALID),
    ("empty object", {**VALID, "size": 0, "digests": []}),
    ("exact multiple", {**VALID, "size": 8, "digests": D16[:2]}),
    ("one byte", {**VALID, "size": 1, "digests": D16[:1]}),
    ("blake3", {**VALID, "digest_alg": "blake3", "digests": [b"\x01" * 32] * 3}),
    ("sha256", {**VALID, "digest_alg": "sha256", "digests": [b"\x02" * 32] * 3}),
    ("empty etag", {**VALID, "etag": '""'}),
    ("etag with obs-text", {**VALID, "etag": '"caf\xe9"'}),
    ("mtime zero", {**VALID, "mtime": 0, "mtime_ns": 0}),
    ("unicode path", {**VALID, "path": "données/日本.bin"}),
]


@pytest.mark.parametrize(("name", "fields"), VALID_CASES, ids=[c[0] for c in VALID_CASES])
def test_round_trip(name: str, fields: dict[str, Any]) -> None:
    m = Manifest(**{**fields, "digests": tuple(fields["digests"])})
    data = encode_manifest(m)
    assert msgpack.unpackb(data, raw=False) == fields
    decoded = decode_manifest(data)
    assert decoded == m
    assert decoded.chunk_count == len(fields["digests"])
    assert decode_manifest(pack(fields)) == m


def test_missing_mtime_defaults_to_zero() -> None:
    assert decode_manifest(with_(mtime=_MISSING, mtime_ns=_MISSING)).mtime == 0


def test_a_manifest_without_mtime_ns_stands_for_the_whole_second() -> None:
    """An older hub's manifest: the version's date still decides, at second resolution."""
    assert decode_manifest(with_(mtime_ns=_MISSING)).mtime_ns == 784111777 * 10**9


def test_unknown_keys_are_ignored() -> None:
    assert decode_manifest(pack({**VALID, "future": [1, 2]})) == decode_manifest(pack(VALID))


def test_digest_sizes() -> None:
    assert DIGEST_SIZES == {"xxh3-128": 16, "blake3": 32, "sha256": 32}


GOOD = pack(VALID)
INVALID_UTF8_STR = b"\x81\xa4path\xa2\xff\xfe"  # {"path": <str with invalid UTF-8>}

# (name, bytes, message fragment)
REJECTED: list[tuple[str, bytes, str]] = [
    # does not decode
    ("empty", b"", "does not decode"),
    ("truncated by one", GOOD[:-1], "does not decode"),
    ("truncated to half", GOOD[: len(GOOD) // 2], "does not decode"),
    ("truncated to header", GOOD[:1], "does not decode"),
    ("trailing data", GOOD + b"\x00", "does not decode"),
    ("reserved byte", b"\xc1", "does not decode"),
    ("invalid utf-8 string", INVALID_UTF8_STR, "does not decode"),
    ("non-string key", pack({1: 2}), "does not decode"),
    # not a map
    ("list", pack([1, 2]), "not a map"),
    ("string", pack("manifest"), "not a map"),
    ("nil", pack(None), "not a map"),
    ("int", pack(7), "not a map"),
    ("bytes", pack(GOOD), "not a map"),
    ("empty map", pack({}), "'path' missing"),
    # wrong types
    ("size as str", with_(size="10"), "'size' missing or not int"),
    ("size True", with_(size=True), "'size' missing or not int"),
    ("size float", with_(size=10.0), "'size' missing or not int"),
    ("size nil", with_(size=None), "'size' missing or not int"),
    ("size missing", with_(size=_MISSING), "'size' missing or not int"),
    ("chunk_size as str", with_(chunk_size="4"), "'chunk_size' missing or not int"),
    ("chunk_size False", with_(chunk_size=False), "'chunk_size' missing or not int"),
    ("path as int", with_(path=1), "'path' missing or not str"),
    ("path as bytes", with_(path=b"dataset/x"), "'path' missing or not str"),
    ("etag as bytes", with_(etag=b'"abc123"'), "'etag' missing or not str"),
    ("etag missing", with_(etag=_MISSING), "'etag' missing or not str"),
    ("digest_alg as int", with_(digest_alg=1), "'digest_alg' missing or not str"),
    ("digests not list", with_(digests=b"\x00" * 48), "'digests' missing or not a list"),
    ("digests as map", with_(digests={"0": D16[0]}), "'digests' missing or not a list"),
    ("digests nil", with_(digests=None), "'digests' missing or not a list"),
    ("digests missing", with_(digests=_MISSING), "'digests' missing or not a list"),
    ("digest as str", with_(digests=[D16[0], "x" * 16, D16[2]]), "not a list of bytes"),
    ("digest as int", with_(digests=[D16[0], 1, D16[2]]), "not a list of bytes"),
    ("mtime as str", with_(mtime="784111777"), "out of range"),
    ("mtime True", with_(mtime=True), "out of range"),
    ("mtime float", with_(mtime=1.5), "out of range"),
    ("mtime_ns as str", with_(mtime_ns="784111777250000000"), "out of range"),
    ("mtime_ns float", with_(mtime_ns=7.8e17), "out of range"),
    ("mtime_ns of another second", with_(mtime_ns=784111778 * 10**9), "different seconds"),
    # out of range
    ("negative size", with_(size=-1), "out of range"),
    ("chunk_size zero", with_(chunk_size=0, digests=[]), "out of range"),
    ("chunk_size negative", with_(chunk_size=-4), "out of range"),
    ("negative mtime", with_(mtime=-5), "out of range"),
    # digests do not fit
    ("digest too short", with_(digests=[D16[0], b"\x00" * 15, D16[2]]), "must be 16 bytes"),
    ("digest too long", with_(digests=[D16[0], b"\x00" * 17, D16[2]]), "must be 16 bytes"),
    ("blake3 with 16-byte digests", with_(digest_alg="blake3"), "must be 32 bytes"),
    ("too few digests", with_(digests=D16[:2]), "digest count"),
    ("too many digests", with_(digests=[*D16, D16[0]]), "digest count"),
    ("no digests", with_(digests=[]), "digest count"),
    ("empty object with a digest", with_(size=0, digests=D16[:1]), "digest count"),
    # unknown algorithm
    ("md5", with_(digest_alg="md5"), "unknown digest algorithm"),
    ("algorithm case", with_(digest_alg="XXH3-128"), "unknown digest algorithm"),
    ("empty algorithm", with_(digest_alg=""), "unknown digest algorithm"),
    # etags: strong and well-formed only
    ("unquoted etag", with_(etag="abc123"), "not a strong entity tag"),
    ("weak etag", with_(etag='W/"abc123"'), "not a strong entity tag"),
    ("single quote char", with_(etag='"'), "not a strong entity tag"),
    ("open quote only", with_(etag='"abc'), "not a strong entity tag"),
    ("empty etag", with_(etag=""), "not a strong entity tag"),
    ("quote inside", with_(etag='"a"b"'), "not a strong entity tag"),
    ("space inside", with_(etag='"a b"'), "not a strong entity tag"),
    ("CRLF inside", with_(etag='"a\r\nSet-Cookie: x"'), "not a strong entity tag"),
    ("non-latin-1 inside", with_(etag='"日本"'), "not a strong entity tag"),
    # bad paths are ManifestErrors when decoding
    ("empty path", with_(path=""), "empty object path"),
    ("absolute path", with_(path="/etc/passwd"), "absolute"),
    ("dotdot path", with_(path="a/../b"), "'.' and '..'"),
    ("encoded dotdot path", with_(path="%2e%2e/x"), "'.' and '..'"),
    ("NUL in path", with_(path="a\x00"), "control"),
]


@pytest.mark.parametrize(("name", "data", "message"), REJECTED, ids=[c[0] for c in REJECTED])
def test_decode_rejects(name: str, data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        decode_manifest(data)
    assert type(info.value) is ManifestError
    assert isinstance(info.value, ProtocolError)
    assert info.value.status_hint == 502


def test_decode_rejects_oversized_input_before_decoding() -> None:
    with pytest.raises(ManifestError, match="larger than"):
        decode_manifest(GOOD + b"\x00" * MAX_MANIFEST_BYTES)


def test_constructor_validates_too() -> None:
    fields = {**VALID, "digests": tuple(D16)}
    with pytest.raises(ManifestError, match="digest count"):
        Manifest(**{**fields, "size": 100})
    with pytest.raises(BadPath):
        Manifest(**{**fields, "path": "../x"})
