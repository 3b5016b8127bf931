"""IndexThread.add_row: new chunks' rows written together when they queue up, each
publish told of its own row's fate, in order with every other index call."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from service.background import ErrorCounts
from spoke.cache.index import ChunkIndex, ChunkRow
from spoke.cache.index_thread import IndexThread
from spoke.cache.store import ChunkStore


def _row(i: int) -> ChunkRow:
    return ChunkRow(f"ab{i:04d}", "data/x.bin", '"v1"', 4096, "xxh3-128", bytes(16), 1.0, 1.0)


def _thread(tmp_path: Path) -> IndexThread:
    store = ChunkStore(str(tmp_path / "cache"))
    index = ChunkIndex(str(tmp_path / "cache"))
    return IndexThread(store, index, ErrorCounts("disk write of a", ["removal"],
                                                 logging.getLogger("test")))


async def _hold(thread: IndexThread) -> tuple[threading.Event, asyncio.Future[None]]:
    """Keep the index thread busy until the event is set."""
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(timeout=60)

    job = asyncio.get_running_loop().run_in_executor(thread.executor, busy)
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 60)
    return release, job


def test_rows_queued_while_the_index_is_busy_go_in_one_transaction(tmp_path: Path) -> None:
    async def main() -> None:
        thread = _thread(tmp_path)
        release, job = await _hold(thread)
        waiting = [thread.add_row(_row(i)) for i in range(6)]
        assert not any(w.done() for w in waiting)
        release.set()
        await job
        await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
        assert thread.row_batches == 1
        names = {r.name for r in await thread.run(thread.index.rows)}
        assert names == {f"ab{i:04d}" for i in range(6)}
        await thread.close()

    asyncio.run(main())


def test_a_row_then_its_removal_leaves_no_row(tmp_path: Path) -> None:
    async def main() -> None:
        thread = _thread(tmp_path)
        release, job = await _hold(thread)
        added = thread.add_row(_row(1))
        thread.queue_removal([_row(1).name])
        later = thread.add_row(_row(2))
        release.set()
        await asyncio.wait_for(asyncio.gather(job, added, later), timeout=60)
        names = {r.name for r in await thread.run(thread.index.rows)}
        assert names == {"ab0002"}
        await thread.close()

    asyncio.run(main())


def test_a_refused_batch_fails_every_row_in_it_and_the_next_rows_still_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        thread = _thread(tmp_path)
        real_add = thread.index.add

        def full(row: ChunkRow) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        release, job = await _hold(thread)
        monkeypatch.setattr(thread.index, "add", full)
        waiting = [thread.add_row(_row(i)) for i in range(3)]
        release.set()
        await job
        results = await asyncio.wait_for(
            asyncio.gather(*waiting, return_exceptions=True), timeout=60)
        assert all(isinstance(r, sqlite3.OperationalError) for r in results)
        monkeypatch.setattr(thread.index, "add", real_add)
        await asyncio.wait_for(thread.add_row(_row(7)), timeout=60)
        names = {r.name for r in await thread.run(thread.index.rows)}
        assert names == {"ab0007"}
        await thread.close()

    asyncio.run(main())
