"""Per-chunk digests of object versions, kept in SQLite across hub restarts.

Hashing an object means reading all of it from the store; the index keeps the answer per
(scope, path, ETag, chunk size, algorithm), so a restarted hub, or one that
``python -m hub index`` prepared, serves manifests without reading the bucket again. The
scope names the endpoint, bucket and prefix: one index file can serve several roots.
A row is written whole in one transaction: an interrupted pass leaves no row, and
``hub index`` resumes at the first object without one.
"""

from __future__ import annotations

import os
import sqlite3
import threading

from protocol.errors import ProtocolError
from protocol.manifest import DIGEST_SIZES, Manifest

INDEX_FILE = "digests.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS digests (
    scope TEXT NOT NULL, path TEXT NOT NULL, etag TEXT NOT NULL,
    chunk_size INTEGER NOT NULL, digest_alg TEXT NOT NULL,
    size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, digests BLOB NOT NULL,
    PRIMARY KEY (scope, path, etag, chunk_size, digest_alg)
)
"""


class DigestIndex:
    """The index file under ``directory`` (created), for the objects of ``scope``."""

    def __init__(self, directory: str, scope: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, INDEX_FILE)
        self.scope = scope
        # One connection shared by the executor threads, each call under the lock.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._closed = False
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)

    def load(self, path: str, etag: str, chunk_size: int, digest_alg: str) -> Manifest | None:
        with self._lock:
            if self._closed:  # a hash still running as the hub stops: computed anew
                return None
            row = self._db.execute(
                "SELECT size, mtime_ns, digests FROM digests WHERE scope=? AND path=? AND "
                "etag=? AND chunk_size=? AND digest_alg=?",
                (self.scope, path, etag, chunk_size, digest_alg),
            ).fetchone()
        if row is None:
            return None
        size, mtime_ns, blob = int(row[0]), int(row[1]), bytes(row[2])
        width = DIGEST_SIZES[digest_alg]
        digests = tuple(blob[i:i + width] for i in range(0, len(blob), width))
        try:
            return Manifest(path=path, size=size, etag=etag, chunk_size=chunk_size,
                            digest_alg=digest_alg, digests=digests, mtime_ns=mtime_ns)
        except (ProtocolError, ValueError):
            return None  # a row that does not make a manifest is recomputed, not served

    def save(self, manifest: Manifest) -> None:
        with self._lock:
            if self._closed:
                return
            self._db.execute(
                "INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.scope, manifest.path, manifest.etag, manifest.chunk_size,
                 manifest.digest_alg, manifest.size, manifest.mtime_ns,
                 b"".join(manifest.digests)),
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()
