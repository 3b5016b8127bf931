"""Scrub: re-hash every cached chunk against the digest recorded at fill time.

Finds bit rot and tampering on the spoke's disk; bad chunks are deleted so the
next read fetches them again. Blocking: meant for ``python -m spoke verify`` and
for start-up (``--verify-on-start``), before the cache is opened for serving.

Salvage is its kin for a damaged index (:class:`spoke.index.ChunkIndex` set it
aside): the rows still readable in the old file go into the new one when the
chunk file they name is there and hashes to their digest. A chunk file's name
alone does not say which object, version or digest it holds, so a chunk with no
readable row cannot be kept; opening the cache then deletes it as an orphan.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from protocol.digests import digest
from spoke.index import ChunkIndex, ChunkRow, salvageable_rows
from spoke.store import ChunkStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScrubReport:
    checked: int
    bad: int
    missing: int


def scrub(store: ChunkStore, index: ChunkIndex) -> ScrubReport:
    """Check every indexed chunk; delete and unindex the bad and the missing."""
    checked = bad = missing = 0
    dropped: list[str] = []
    for row in index.rows():
        intact = _intact(store, row)
        if intact is None:
            missing += 1
            dropped.append(row.name)
            continue
        checked += 1
        if not intact:
            logger.warning("chunk %s of %s is corrupt on disk; dropping it", row.name, row.path)
            bad += 1
            store.delete(row.name)
            dropped.append(row.name)
    index.remove(dropped)
    return ScrubReport(checked, bad, missing)


@dataclass(frozen=True, slots=True)
class SalvageReport:
    kept: int  # rows read back whose chunk file bore them out
    refused: int  # rows read back whose file was missing or did not match


def open_index(store: ChunkStore, cache_dir: str) -> ChunkIndex:
    """The cache's index; a damaged one set aside and salvaged into a new one."""
    index = ChunkIndex(cache_dir)
    if index.set_aside is not None:
        report = salvage(store, index, index.set_aside)
        logger.warning(
            "salvaged %d chunks from the damaged index (%d rows not borne out by their "
            "files); chunk files it no longer names are deleted", report.kept, report.refused,
        )
    return index


def salvage(store: ChunkStore, index: ChunkIndex, damaged_path: str) -> SalvageReport:
    """Refill ``index`` (new, empty) from the damaged index at ``damaged_path``."""
    kept: list[ChunkRow] = []
    refused = 0
    for row in salvageable_rows(damaged_path):
        if _intact(store, row):
            kept.append(row)
        else:
            refused += 1
    index.add_many(kept)
    return SalvageReport(len(kept), refused)


def _intact(store: ChunkStore, row: ChunkRow) -> bool | None:
    """Whether ``row``'s chunk file holds the bytes it records; None if there is none."""
    try:
        data = store.read(row.name)
    except FileNotFoundError:
        return None
    try:
        return len(data) == row.size and digest(row.digest_alg, data) == row.digest
    except ValueError:  # an algorithm this build does not know (or a torn row's garbage)
        return False
