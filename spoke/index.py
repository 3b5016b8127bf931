"""ChunkIndex: what is cached, in SQLite (WAL), so a restart keeps the cache.

The index records, per chunk file, which object version it belongs to, its size
and when it was last read, plus the last manifest seen for each object (so a
restarted spoke can serve cached chunks, and stale metadata when the hub is
unreachable). SQLite in WAL mode lets several worker processes share one cache
directory later. Rows are written after the chunk file is renamed into place:
start-up reconciles the two (a row without a file is dropped, a file without a
row is deleted). Blocking: use it from one dedicated thread.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    etag TEXT NOT NULL,
    size INTEGER NOT NULL,
    digest_alg TEXT NOT NULL,
    digest BLOB NOT NULL,
    stored_at REAL NOT NULL,
    last_access REAL NOT NULL,
    tenant TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS chunks_by_path ON chunks(path);
CREATE TABLE IF NOT EXISTS manifests (
    path TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    fetched_at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class ChunkRow:
    name: str
    path: str
    etag: str
    size: int
    digest_alg: str
    digest: bytes
    stored_at: float
    last_access: float
    tenant: str = ""


class ChunkIndex:
    def __init__(self, cache_dir: str) -> None:
        self._db = sqlite3.connect(
            os.path.join(cache_dir, "index.sqlite3"), check_same_thread=False,
            isolation_level=None,
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; a power cut may lose the
        # last rows, which start-up reconciliation turns into deleted files.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(chunks)")}
        if "tenant" not in columns:  # a cache made before tenants were recorded
            self._db.execute("ALTER TABLE chunks ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        self._db.close()

    def add(self, row: ChunkRow) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.name, row.path, row.etag, row.size, row.digest_alg, row.digest,
             row.stored_at, row.last_access, row.tenant),
        )

    def add_many(self, rows: Iterable[ChunkRow]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            for row in rows:
                self.add(row)

    def remove(self, names: Iterable[str]) -> None:
        self._db.executemany("DELETE FROM chunks WHERE name = ?", ((n,) for n in names))

    def touch(self, accesses: dict[str, float]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE chunks SET last_access = ? WHERE name = ?",
                ((t, n) for n, t in accesses.items()),
            )

    def rows(self) -> list[ChunkRow]:
        """Every chunk row, least recently read first."""
        cursor = self._db.execute(
            "SELECT name, path, etag, size, digest_alg, digest, stored_at, last_access, tenant "
            "FROM chunks "
            "ORDER BY last_access"
        )
        return [
            ChunkRow(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7], r[8]) for r in cursor
        ]

    def names_for_path(self, path: str) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT name FROM chunks WHERE path = ?", (path,))]

    def save_manifest(self, path: str, body: bytes, fetched_at: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO manifests VALUES (?, ?, ?)", (path, body, fetched_at)
        )

    def load_manifest(self, path: str) -> bytes | None:
        row = self._db.execute("SELECT body FROM manifests WHERE path = ?", (path,)).fetchone()
        return None if row is None else bytes(row[0])

    def delete_manifest(self, path: str) -> None:
        self._db.execute("DELETE FROM manifests WHERE path = ?", (path,))
