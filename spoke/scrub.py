"""Scrub: re-hash every cached chunk against the digest recorded at fill time.

Finds bit rot and tampering on the spoke's disk; bad chunks are deleted so the
next read fetches them again. Blocking: meant for ``python -m spoke verify`` and
for start-up (``--verify-on-start``), before the cache is opened for serving.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from protocol.digests import digest
from spoke.index import ChunkIndex
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
        try:
            data = store.read(row.name)
        except FileNotFoundError:
            missing += 1
            dropped.append(row.name)
            continue
        checked += 1
        if len(data) != row.size or digest(row.digest_alg, data) != row.digest:
            logger.warning("chunk %s of %s is corrupt on disk; dropping it", row.name, row.path)
            bad += 1
            store.delete(row.name)
            dropped.append(row.name)
    index.remove(dropped)
    return ScrubReport(checked, bad, missing)
