"""IndexThread: the chunk index's own thread, and the disk writes the spoke can do without.

SQLite connections belong to one thread, so every index call goes through this one,
in order. A write the disk refuses (full, read-only) costs caching, never an answer:
it is counted under its kind in ``disk_errors`` and the spoke serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.background import ErrorCounts
from spoke.cache.index import ChunkIndex, ChunkRow
from spoke.cache.resident import Resident
from spoke.cache.space import Space
from spoke.cache.store import ChunkStore

T = TypeVar("T")


class IndexThread:
    def __init__(self, store: ChunkStore, index: ChunkIndex, disk_errors: ErrorCounts) -> None:
        self.store = store
        self.index = index
        self.disk_errors = disk_errors
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="spoke-index")
        # New chunks' rows waiting for the index thread, and whether a job drains them.
        self._rows: deque[tuple[ChunkRow, asyncio.Future[None]]] = deque()
        self._rows_lock = threading.Lock()
        self._draining = False
        self.row_batches = 0  # transactions that wrote queued rows

    def add_row(self, row: ChunkRow) -> asyncio.Future[None]:
        """Add ``row`` to the index; done once it is written (or with the disk's error).

        Rows queued while the index thread is busy go in together, one transaction:
        under a cold stream a dozen chunks land at once, and a transaction and a
        thread hop each is most of what their rows cost. Rows keep their order with
        every other index call: the job that writes a row is queued before any call
        made after the row was.
        """
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._rows_lock:
            self._rows.append((row, done))
            if self._draining:
                return done
            self._draining = True
        loop.run_in_executor(self.executor, self._write_rows, loop)
        return done

    def _write_rows(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._rows_lock:
                if not self._rows:
                    self._draining = False
                    return
                batch = list(self._rows)
                self._rows.clear()
            error: Exception | None = None
            try:
                self.index.add_many(row for row, _ in batch)
            except Exception as exc:  # each waiting publish handles it as its own
                error = exc
            self.row_batches += 1
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(_settle, [done for _, done in batch], error)

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, call, *args)

    async def write(self, kind: str, call: Callable[..., object], *args: Any) -> bool:
        """``call(*args)`` on the index thread; False, counted under ``kind``, if the
        disk refused it. For writes the spoke can go on without: a removal the index
        did not record leaves rows whose files are gone, which start-up drops."""
        try:
            await self.run(call, *args)
        except (OSError, sqlite3.Error) as exc:
            self.disk_errors.record(kind, exc)
            return False
        return True

    def queue_removal(self, names: list[str]) -> None:
        """Remove ``names``' rows, queued (not awaited) before any later row of them."""
        removal = asyncio.get_running_loop().run_in_executor(
            self.executor, self.index.remove, names)
        removal.add_done_callback(self._removal_done)

    def _removal_done(self, removal: asyncio.Future[None]) -> None:
        error = None if removal.cancelled() else removal.exception()
        if error is not None:
            self.disk_errors.record("removal", error)

    async def drop_files(self, names: list[str], rows: list[str]) -> bool:
        """Delete chunk files ``names`` and index rows ``rows``."""
        return await self.write("removal", self._drop_files, names, rows)

    def _drop_files(self, names: list[str], rows: list[str]) -> None:
        for name in names:
            self.store.delete(name)
        self.index.remove(rows)

    async def reconcile(self, space: Space) -> tuple[int, int, int]:
        """At start-up, make the index, the files and ``space`` agree: rows whose file is
        gone and rows past the capacity (lowered since the last run) are dropped, files
        without a row deleted, the rest made resident. Returns the counts of rows
        dropped, of files without a row and of temp files swept."""
        rows, (on_disk, stray), temps = await self.run(self._scan)
        stale = [r.name for r in rows if r.name not in on_disk]
        present = [r for r in rows if r.name in on_disk]
        known = {r.name for r in rows}
        orphans = [name for name in on_disk if name not in known]
        keep, over = space.keep_within(present)
        stale += [r.name for r in over]
        for row in keep:  # least recently used first, so the policy order survives
            space.add(row.name, Resident(row.size, row.path, row.tenant, row.stored_at,
                                         row.digest_alg, row.digest))
        await self.drop_files(stale + orphans, stale)
        await self.run(self._drop_strays, stray)
        return len(stale), len(orphans), temps

    def _scan(self) -> tuple[list[ChunkRow], tuple[set[str], list[str]], int]:
        temps = self.store.remove_temp_files()
        return self.index.rows(), self.store.scan(), temps

    def _drop_strays(self, paths: list[str]) -> None:
        for path in paths:
            self.store.delete_stray(path)

    async def close(self) -> None:
        await self.run(self.index.close)
        self.executor.shutdown(wait=True)


def _settle(waiting: list[asyncio.Future[None]], error: Exception | None) -> None:
    for done in waiting:
        if done.cancelled():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
