"""ChunkIndex: what is cached, in SQLite (WAL), so a restart keeps the cache.

The index records, per chunk file, which object version it belongs to, its size
and when it was last read, plus the last manifest seen for each object (so a
restarted spoke can serve cached chunks, and stale metadata when the hub is
unreachable). SQLite in WAL mode lets several worker processes share one cache
directory later. Rows are written after the chunk file is renamed into place:
start-up reconciles the two (a row without a file is dropped, a file without a
row is deleted). Blocking: use it from one dedicated thread.

A damaged index (not a database, torn, failing SQLite's quick check) does not stop
the spoke: it is set aside under a timestamped name and a new one is made, which
:func:`spoke.cache.scrub.salvage` refills with what can be read of the old one and is
borne out by the chunk files.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

INDEX_FILE = "index.sqlite3"
# SQLite's own files beside the database: set aside with it, as a WAL left behind
# would be replayed into the new database.
_COMPANIONS = ("", "-wal", "-shm")
# The primary result codes that mean the file itself is bad, not the disk or a lock.
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}

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


class IndexDamaged(sqlite3.DatabaseError):
    """The index file opened, but SQLite's quick check found it damaged."""


class ChunkIndex:
    def __init__(self, cache_dir: str) -> None:
        self.path = os.path.join(cache_dir, INDEX_FILE)
        # Where a damaged index was moved to at start (None: it was sound).
        self.set_aside: str | None = None
        try:
            self._db = _connect(self.path)
        except sqlite3.DatabaseError as exc:
            if not _is_damage(exc):
                raise  # a lock, a full disk, permissions: the file may be fine
            self.set_aside = _set_aside(self.path, exc)
            self._db = _connect(self.path)

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


def _connect(path: str) -> sqlite3.Connection:
    """The index at ``path``, made if missing; IndexDamaged if it fails the quick check."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a process crash; a power cut may lose the
        # last rows, which start-up reconciliation turns into deleted files.
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
        if "tenant" not in columns:  # a cache made before tenants were recorded
            db.execute("ALTER TABLE chunks ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
        # A torn file can open and answer some queries, then fail in the middle of
        # serving; checked once here instead (about as long as start-up's read of
        # every row, which comes next anyway).
        verdict = db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if verdict != "ok":
            raise IndexDamaged(f"quick check: {verdict}")
    except BaseException:
        db.close()
        raise
    return db


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    if isinstance(exc, IndexDamaged):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DAMAGED


def _set_aside(path: str, exc: BaseException) -> str:
    """Move the damaged index at ``path`` (and its WAL) out of the way; its new name."""
    aside = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    for suffix in _COMPANIONS:
        if os.path.exists(path + suffix):
            os.rename(path + suffix, aside + suffix)
    logger.warning(
        "the cache index %s is damaged (%s); set aside as %s, starting a new one from "
        "what of it the chunk files bear out", path, exc, aside,
    )
    return aside


def salvageable_rows(path: str) -> Iterator[ChunkRow]:
    """The chunk rows that can still be read from the damaged index at ``path``, as
    far as they can be read (none if it is not a database at all)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return
    try:
        cursor = db.execute(
            "SELECT name, path, etag, size, digest_alg, digest, stored_at, last_access, "
            "tenant FROM chunks"
        )
        for r in cursor:
            yield ChunkRow(str(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]),
                           bytes(r[5]), float(r[6]), float(r[7]), str(r[8]))
    except (sqlite3.Error, TypeError, ValueError):
        return  # torn from here on: what came before stands
    finally:
        db.close()
