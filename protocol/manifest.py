"""The manifest: what a spoke needs to know to cache an object chunk by chunk.

Encoded as a msgpack map with the keys ``path, size, etag, chunk_size,
digest_alg, digests`` (one digest per chunk), ``mtime`` (seconds since the
epoch, for ``Last-Modified``) and ``mtime_ns`` (the same instant in nanoseconds, which
tells a spoke whether that date may validate a range; a manifest without it, from an
older hub, stands for the whole second). Everything that comes off the wire is validated:
a manifest that decodes is a manifest the spoke can trust structurally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.chunks import chunk_count
from protocol.conditional import NS
from protocol.errors import ManifestError, ProtocolError
from protocol.paths import validate_path

DIGEST_SIZES = {"xxh3-128": 16, "blake3": 32, "sha256": 32}
# 64 GiB objects with 64 KiB chunks stay well under this; it bounds decoding work.
MAX_MANIFEST_BYTES = 64 << 20
_MAX_INT64 = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Manifest:
    """One version (etag) of one object, and the digest of each of its chunks."""

    path: str
    size: int
    etag: str
    chunk_size: int
    digest_alg: str
    digests: tuple[bytes, ...]
    mtime: int = 0
    mtime_ns: int = 0  # 0: derived from ``mtime`` (and the other way round)

    def __post_init__(self) -> None:
        if self.mtime_ns == 0:
            object.__setattr__(self, "mtime_ns", self.mtime * NS)
        elif self.mtime == 0:
            object.__setattr__(self, "mtime", self.mtime_ns // NS)
        _validate(self)

    @property
    def chunk_count(self) -> int:
        return len(self.digests)


def encode_manifest(manifest: Manifest) -> bytes:
    """The msgpack bytes of ``manifest``."""
    return msgpack.packb(
        {
            "path": manifest.path,
            "size": manifest.size,
            "etag": manifest.etag,
            "chunk_size": manifest.chunk_size,
            "digest_alg": manifest.digest_alg,
            "digests": list(manifest.digests),
            "mtime": manifest.mtime,
            # msgpack ints end at 64 bits (the year 2262 in nanoseconds): later dates
            # go as whole seconds only.
            **({"mtime_ns": manifest.mtime_ns} if manifest.mtime_ns <= _MAX_INT64 else {}),
        },
        use_bin_type=True,
    )


def decode_manifest(data: bytes) -> Manifest:
    """Decode and validate manifest bytes; raises :class:`ManifestError` on anything off."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a zoo of types for bad input
        raise ManifestError(f"manifest does not decode: {exc}") from None
    if not isinstance(raw, dict):
        raise ManifestError("manifest is not a map")
    try:
        return Manifest(
            path=_field(raw, "path", str),
            size=_field(raw, "size", int),
            etag=_field(raw, "etag", str),
            chunk_size=_field(raw, "chunk_size", int),
            digest_alg=_field(raw, "digest_alg", str),
            digests=tuple(_digests(raw)),
            mtime=_optional_int(raw, "mtime"),
            mtime_ns=_optional_int(raw, "mtime_ns"),
        )
    except ManifestError:
        raise
    except ProtocolError as exc:
        raise ManifestError(str(exc)) from None


def _field(raw: dict[Any, Any], name: str, kind: type[Any]) -> Any:
    value = raw.get(name)
    # bool is an int subclass; a manifest saying size=True is malformed.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ManifestError(f"manifest field {name!r} missing or not {kind.__name__}")
    return value


def _optional_int(raw: dict[Any, Any], name: str) -> int:
    """An optional int field: 0 when absent, -1 (refused) when it is not an int."""
    value = raw.get(name, 0)
    return value if type(value) is int else -1


def _digests(raw: dict[Any, Any]) -> list[bytes]:
    digests = raw.get("digests")
    if not isinstance(digests, list) or not all(isinstance(d, bytes) for d in digests):
        raise ManifestError("manifest field 'digests' missing or not a list of bytes")
    return digests


def _validate(m: Manifest) -> None:
    validate_path(m.path)
    if m.size < 0 or m.chunk_size <= 0 or m.mtime < 0 or m.mtime_ns < 0:
        raise ManifestError("manifest size, chunk_size or mtime out of range")
    if m.mtime_ns // NS != m.mtime:
        raise ManifestError("manifest mtime and mtime_ns name different seconds")
    if not (
        m.etag.startswith('"')
        and m.etag.endswith('"')
        and len(m.etag) >= 2
        and all(c == "!" or "#" <= c <= "~" or "\x80" <= c <= "\xff" for c in m.etag[1:-1])
    ):  # RFC 9110 §8.8.3: etagc = %x21 / %x23-7E / obs-text
        raise ManifestError("manifest etag is not a strong entity tag")
    digest_size = DIGEST_SIZES.get(m.digest_alg)
    if digest_size is None:
        raise ManifestError(f"unknown digest algorithm {m.digest_alg!r}")
    if len(m.digests) != chunk_count(m.size, m.chunk_size):
        raise ManifestError("manifest digest count does not match size and chunk_size")
    if any(len(d) != digest_size for d in m.digests):
        raise ManifestError(f"{m.digest_alg} digests must be {digest_size} bytes")
