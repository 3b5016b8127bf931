"""Chunk digests. Pure functions over bytes; which algorithm is the hub's choice.

xxh3-128 is the default: the fastest of the three by far (``python -m
loadtest.bench_digests`` measures them side by side; figures in docs/performance.md), so
hashing every cold fill costs a small part of a core where sha256 would cost a large one.
The digest guards against
corruption on the WAN and on disk, not against a malicious hub (the hub is the
source of truth; TLS protects the link).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

import xxhash

DEFAULT_DIGEST_ALG = "xxh3-128"


def _blake3(data: bytes | memoryview) -> bytes:
    import blake3  # optional: only needed when a hub is configured to use it

    return bytes(blake3.blake3(data).digest())


_DIGESTERS: dict[str, Callable[[bytes | memoryview], bytes]] = {
    "xxh3-128": lambda data: xxhash.xxh3_128_digest(data),
    "sha256": lambda data: hashlib.sha256(data).digest(),
    "blake3": _blake3,
}


def digest(alg: str, data: bytes | memoryview) -> bytes:
    """The ``alg`` digest of ``data``; ``ValueError`` for an unknown algorithm."""
    try:
        digester = _DIGESTERS[alg]
    except KeyError:
        raise ValueError(f"unknown digest algorithm {alg!r}") from None
    return digester(data)


class Hasher(Protocol):
    """A digest taken piece by piece: the pieces in order give :func:`digest` of the whole."""

    def update(self, data: bytes | memoryview, /) -> object: ...

    def digest(self) -> bytes: ...


def _blake3_hasher() -> Hasher:
    import blake3

    hasher: Hasher = blake3.blake3()
    return hasher


_HASHERS: dict[str, Callable[[], Hasher]] = {
    "xxh3-128": xxhash.xxh3_128,
    "sha256": hashlib.sha256,
    "blake3": _blake3_hasher,
}


def hasher(alg: str) -> Hasher:
    """A new piece-by-piece ``alg`` digest; ``ValueError`` for an unknown algorithm."""
    try:
        return _HASHERS[alg]()
    except KeyError:
        raise ValueError(f"unknown digest algorithm {alg!r}") from None


def digest_algorithms() -> tuple[str, ...]:
    return tuple(_DIGESTERS)
