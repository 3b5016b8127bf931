"""Per-chunk digests of an object version, computed once per (path, etag).

Hashing a multi-GiB shard takes seconds, so results are kept in an LRU keyed by
path, etag and chunk size, and concurrent requests for the same uncomputed
manifest share one computation. A backend whose reads are costly (an object store)
also gets a persistent :class:`DigestStore` behind the LRU.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from cachetools import LRUCache

from hub.backend import Backend, OpenObject
from protocol.conditional import NS
from protocol.digests import digest
from protocol.errors import ProtocolError
from protocol.manifest import Manifest

logger = logging.getLogger(__name__)

ManifestKey = tuple[str, str, int]


class DigestStore(Protocol):
    """Manifests kept beyond this process (``hub.store.index``); blocking."""

    def load(self, path: str, etag: str, chunk_size: int, digest_alg: str) -> Manifest | None: ...

    def save(self, manifest: Manifest) -> None: ...

    def close(self) -> None: ...


class ObjectChanged(ProtocolError):
    """The file changed while it was being hashed; the client should retry."""

    status_hint = 409
    title = "Object changed"


def compute_manifest(obj: OpenObject, chunk_size: int, digest_alg: str) -> Manifest:
    """Hash every chunk of ``obj`` (blocking: run it in an executor)."""
    info = obj.info
    will_read = getattr(obj, "will_read", None)
    if will_read is not None:
        will_read(0, info.size)  # one streamed read of the whole version, chunk by chunk
    digests = []
    for offset in range(0, info.size, chunk_size):
        data = obj.read(offset, min(chunk_size, info.size - offset))
        if len(data) != min(chunk_size, info.size - offset):
            raise ObjectChanged(f"{info.path} shrank while it was hashed")
        digests.append(digest(digest_alg, data))
    return Manifest(
        path=info.path,
        size=info.size,
        etag=info.etag,
        chunk_size=chunk_size,
        digest_alg=digest_alg,
        digests=tuple(digests),
        mtime=info.mtime_ns // NS,
        mtime_ns=info.mtime_ns,
    )


class ManifestCache:
    """Manifests by (path, etag, chunk_size), computed at most once concurrently."""

    def __init__(self, backend: Backend, chunk_size: int, digest_alg: str, max_entries: int = 4096,
                 store: DigestStore | None = None):
        self._backend = backend
        self._store = store
        self.chunk_size = chunk_size
        self.digest_alg = digest_alg
        self._cache: LRUCache[ManifestKey, Manifest] = LRUCache(maxsize=max_entries)
        self._computing: dict[ManifestKey, asyncio.Future[Manifest]] = {}

    async def get(self, path: str) -> Manifest:
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(None, self._backend.stat, path)
        key = (path, info.etag, self.chunk_size)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        pending = self._computing.get(key)
        if pending is None:
            pending = loop.run_in_executor(None, self._compute, path)
            self._computing[key] = pending
            pending.add_done_callback(lambda _: self._computing.pop(key, None))
        # shield: a client that hangs up must not cancel the hash others wait for.
        manifest = await asyncio.shield(pending)
        self._cache[(path, manifest.etag, self.chunk_size)] = manifest
        return manifest

    def _compute(self, path: str) -> Manifest:
        """Open, hash and close ``path`` (blocking; owns its own file handle)."""
        obj = self._backend.open(path)
        if self._store is not None:
            kept = self._store.load(path, obj.info.etag, self.chunk_size, self.digest_alg)
            if kept is not None and kept.size == obj.info.size:
                obj.close()
                return kept
        try:
            manifest = compute_manifest(obj, self.chunk_size, self.digest_alg)
        finally:
            obj.close()
        # The fd pins the inode, but an in-place rewrite could have changed bytes
        # under us: only trust digests of a version that is still current.
        if not self._backend.still_current(obj.info):
            raise ObjectChanged(f"{path} changed while it was hashed; retry")
        if self._store is not None:
            self._store.save(manifest)
        return manifest
