"""Chunk identity: a chunk belongs to one version (etag) of one object."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

from protocol.manifest import Manifest


@lru_cache(maxsize=65536)  # asked for every chunk of every read: hash each version once
def version_id(path: str, etag: str, chunk_size: int) -> str:
    """A filesystem-safe name for one object version at one chunk size."""
    ident = f"{path}\0{etag}\0{chunk_size}".encode()
    return hashlib.blake2b(ident, digest_size=16).hexdigest()


# The manifest asked about last and its version: reads come object after object, a
# batch range after range of one, so the hash is taken once per manifest, not per read.
_last_version: tuple[Manifest | None, str] = (None, "")


def manifest_version(manifest: Manifest) -> str:
    """:func:`version_id` of ``manifest``'s version."""
    global _last_version
    known, version = _last_version  # one read of the pair: safe from any thread
    if known is not manifest:
        version = version_id(manifest.path, manifest.etag, manifest.chunk_size)
        _last_version = (manifest, version)
    return version


def chunk_name(version: str, index: int) -> str:
    """Chunk ``index``'s file name in ``version`` (a :func:`version_id`)."""
    return f"{version}-{index}"


@dataclass(frozen=True, slots=True)
class ChunkKey:
    """Chunk ``index`` of object ``path`` at version ``etag``."""

    path: str
    etag: str
    chunk_size: int
    index: int

    @property
    def name(self) -> str:
        """The chunk's file name; unique per (path, etag, chunk_size, index)."""
        return chunk_name(version_id(self.path, self.etag, self.chunk_size), self.index)

    @classmethod
    def of(cls, manifest: Manifest, index: int) -> ChunkKey:
        return cls(manifest.path, manifest.etag, manifest.chunk_size, index)
