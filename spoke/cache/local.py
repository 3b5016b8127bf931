"""LocalChunks: the chunks on this disk, read as a loader's hits, checked, let go when bad.

Every read answered without the upstream comes through here: a lookup, a pread, a
descriptor for ``sendfile`` or a view of a mapped file, each counted as a hit and seen
by the policy as an access. A chunk file found gone, torn or bad is forgotten (a bad one
deleted for good) and the read that found it fetches it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cachetools import LRUCache

from protocol.manifest import Manifest
from spoke.cache.clock import Clock
from spoke.cache.counters import SpokeStats
from spoke.cache.flight import Filling
from spoke.cache.index_thread import IndexThread
from spoke.cache.integrity import ChunkChecker, Expected, verify_stored
from spoke.cache.keys import ChunkKey, chunk_name, manifest_version
from spoke.cache.open_chunks import OpenChunks
from spoke.cache.space import Space
from spoke.cache.store import BadChunkFile

logger = logging.getLogger(__name__)

T = TypeVar("T")
# Reads up to this size of cached chunks are a pread on the event loop: chunks were
# written here recently, so the page cache usually holds them and a pread is a
# memcpy, cheaper than a thread hop. Larger ones (the reader asks for at most 1 MiB)
# go to the thread pool.
INLINE_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk ready to read: its bytes in memory (just fetched) or its name on disk,
    or (``fill``, from :meth:`ChunkCache.stream`) on its way from the upstream."""

    key: ChunkKey
    data: bytes | None
    hit: bool
    fill: Filling | None = None


class ChunkGone(Exception):
    """A resident chunk's file vanished between lookup and read (evicted, purged)."""


class CacheWatcher(Protocol):
    """Told of every change to what the cache can answer from (see :mod:`spoke.workers.pool`)."""

    def manifest_fresh(self, path: str, manifest: Manifest, expires_at: float) -> None:
        """``manifest`` is ``path``'s until ``expires_at`` (the clock's ``monotonic``)."""
        ...

    def manifest_gone(self, path: str) -> None: ...

    def chunk_added(self, name: str) -> None: ...

    def chunk_gone(self, name: str) -> None: ...


class LocalChunks:
    def __init__(
        self, space: Space, db: IndexThread, stats: SpokeStats, clock: Clock,
    ) -> None:
        self.space = space
        self.store = db.store
        self.db = db
        self.stats = stats
        self.policy = space.policy
        self._resident = space.resident
        self._wall = clock.wall
        self.watcher: CacheWatcher | None = None
        # Chunk files are checked (and hashed once) before this process serves them.
        self.checker = ChunkChecker(self.store, self.expected, stats)
        self.fds = OpenChunks(self.checker)
        self._accesses: dict[str, float] = {}
        # Chunks fetched in the background and not read since: prefetch accuracy.
        self.prefetched: LRUCache[str, None] = LRUCache(maxsize=1_000_000)
        space.on_drop = self._let_go

    def _let_go(self, name: str) -> None:
        """Chunk ``name`` stops being resident: nothing keeps its file or its check."""
        self.fds.discard(name)
        self.checker.forget(name)
        if self.watcher is not None:
            self.watcher.chunk_gone(name)

    def added(self, name: str) -> None:
        if self.watcher is not None:
            self.watcher.chunk_added(name)

    # -- hits -----------------------------------------------------------------

    def is_cached(self, manifest: Manifest, index: int) -> bool:
        return chunk_name(manifest_version(manifest), index) in self._resident

    def is_resident(self, name: str) -> bool:
        """Whether chunk ``name`` (a :attr:`ChunkKey.name`) is on disk."""
        return name in self._resident

    def lookup(self, manifest: Manifest, index: int) -> Chunk | None:
        """Chunk ``index`` if it is on disk, counted as a loader's hit; else None, uncounted."""
        key = ChunkKey.of(manifest, index)
        if key.name not in self._resident:
            return None
        self._count_hit(key.name)
        return Chunk(key, None, True)

    def read_hit(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of resident chunk ``name``, counted as a loader's hit
        (the caller has checked :meth:`is_resident`); :meth:`read_now`'s errors."""
        self._count_hit(name)
        return self._pread(name, start, stop)

    def peek(self, name: str, start: int, stop: int) -> bytes:
        """:meth:`read_hit`'s bytes, not counted as a hit (a check made once per chunk)."""
        return self._pread(name, start, stop)

    def view_hit(self, name: str, start: int, stop: int) -> memoryview:
        """:meth:`read_hit`'s bytes as a view of the chunk's mapped file, no copy: only
        for a plain socket's transport (see :mod:`spoke.cache.open_chunks`). Raises ChunkGone (and
        forgets the chunk) when its file is gone or shorter than ``stop``."""
        return self._file_hit(name, self.fds.view, name, start, stop)

    def fd_hit(self, name: str, need_bytes: int) -> int:
        """Resident chunk ``name``'s open descriptor, counted as a loader's hit; valid
        within the calling callback (see :meth:`OpenChunks.fd`). Raises ChunkGone (and
        forgets the chunk) when its file is gone or shorter than ``need_bytes``."""
        return self._file_hit(name, self.fds.fd, name, need_bytes)

    def _file_hit(self, name: str, get: Callable[..., T], *args: Any) -> T:
        """``get(*args)`` on resident chunk ``name``'s file, counted as a loader's hit;
        ChunkGone, the chunk forgotten, when ``get`` finds the file gone, torn or bad."""
        try:
            got = get(*args)
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        self._count_hit(name)
        return got

    def count_hits_elsewhere(self, hits: dict[str, int], served_bytes: int) -> None:
        """Hits a reader worker answered from this cache's files: counted, and
        seen by the policy as accesses, as if answered here."""
        for name, n in hits.items():
            if name in self._resident:
                self._count_hit(name)
                n -= 1
            self.stats.hits += n
        self.stats.bytes_served_hit += served_bytes

    def _count_hit(self, name: str) -> None:
        self.count_local_read(name)
        self.policy.touch(name)
        self._resident.touched(name)
        self._accesses[name] = self._wall()

    def count_local_read(self, name: str) -> None:
        """A loader's read of chunk ``name`` answered without the upstream."""
        self.stats.hits += 1
        if name in self.prefetched:
            del self.prefetched[name]
            self.stats.prefetch_used += 1

    def open_fd(self, manifest: Manifest, index: int, need_bytes: int) -> int:
        """A new descriptor on cached chunk ``index``'s file, which the caller closes.

        Its own descriptor, so it stays valid across awaits (``sendfile`` waiting on a
        slow socket) even if the chunk is evicted meanwhile: chunk files are never
        rewritten in place, so the bytes stay the ones verified. Raises
        :class:`ChunkGone` when the file is gone or holds fewer than ``need_bytes``
        (torn), and forgets it, so the next read fetches it again.
        """
        name = ChunkKey.of(manifest, index).name
        try:
            return os.dup(self.fds.fd(name, need_bytes))
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None

    def read_now(self, chunk: Chunk, start: int, stop: int) -> bytes:
        """:meth:`read` without the event-loop hop, for small reads of cached chunks."""
        if chunk.data is not None:
            return chunk.data[start:stop]
        return self._pread(chunk.key.name, start, stop)

    def _pread(self, name: str, start: int, stop: int) -> bytes:
        try:
            data = self.fds.pread(name, start, stop)
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        if len(data) != stop - start:
            self.forget(name)
            raise ChunkGone(name)
        return data

    async def read(self, chunk: Chunk, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``chunk``; raises :class:`ChunkGone` if its file vanished."""
        if chunk.data is not None or stop - start <= INLINE_READ_BYTES:
            return self.read_now(chunk, start, stop)
        name = chunk.key.name
        try:
            # Checked here; read on a thread, from a descriptor of its own (the open
            # chunks' may be closed meanwhile).
            fd = os.dup(self.fds.fd(name, stop))
        except FileNotFoundError as exc:
            raise self._unusable(name, exc) from None
        loop = asyncio.get_running_loop()
        data = await loop.run_in_executor(None, _pread_closing, fd, start, stop)
        if len(data) != stop - start:
            self.forget(chunk.key.name)
            raise ChunkGone(chunk.key.name)
        return data

    # -- chunks found unusable --------------------------------------------------

    def forget(self, name: str) -> None:
        """Chunk ``name``'s file turned out unusable: the next read fetches it again."""
        if self.space.drop(name) is not None:
            self.policy.remove(name)
            self.stats.chunks_dropped += 1

    def _unusable(self, name: str, exc: FileNotFoundError) -> ChunkGone:
        """Chunk ``name``'s file was found gone, torn (``exc``) or bad: forgotten, and a
        bad one dropped for good; the ChunkGone to raise (the read fetches it again)."""
        if isinstance(exc, BadChunkFile):
            self.drop_bad(name, exc.cause)
        else:
            self.forget(name)
        return ChunkGone(name)

    def expected(self, name: str) -> Expected | None:
        """What resident chunk ``name``'s file must hold; None if it is not resident."""
        resident = self._resident.get(name)
        if resident is None:
            return None
        return Expected(resident.size, resident.digest_alg, resident.digest)

    def expectations(self) -> list[tuple[str, Expected]]:
        """Every resident chunk's name and what its file must hold."""
        return [(name, Expected(r.size, r.digest_alg, r.digest))
                for name, r in self._resident.items()]

    def drop_bad(self, name: str, cause: str) -> None:
        """Chunk ``name``'s file is not its bytes (``cause``: see
        :data:`spoke.cache.store.CORRUPT_CAUSES`): if it is resident, counted, forgotten, its
        file deleted and its row removed. The next read fetches it again."""
        resident = self._resident.get(name)
        if resident is None:
            return  # dropped already (found by another read, or by a reader worker)
        self.stats.corrupt_chunks[cause] += 1
        logger.warning("chunk %s of %s is corrupt on disk (%s); dropping it", name,
                       resident.path, cause)
        self.forget(name)
        try:
            # Now, not queued: a fetch of it again must not have its new file deleted.
            self.store.delete(name)
        except OSError as exc:  # left for start-up's reconcile; never served again here
            self.db.disk_errors.record("removal", exc)
        # Queued before any new row of it can be (one thread, in order).
        self.db.queue_removal([name])

    async def recheck(self, name: str) -> None:
        """Hash resident chunk ``name``'s file again now (a reader worker found it bad):
        dropped if it is bad, else told to the readers again."""
        expected = self.expected(name)
        if expected is None:
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, verify_stored, self.store, name, expected)
        except BadChunkFile as exc:
            if self.expected(name) == expected:
                self.drop_bad(name, exc.cause)
            return
        except FileNotFoundError:
            self.forget(name)
            return
        if name in self._resident:
            self.added(name)  # a reader that let it go may serve it again

    async def flush_accesses(self) -> None:
        """Persist the access times read since the last flush (for the policy order
        after a restart); ones the index refused are kept for the next round."""
        if not self._accesses:
            return
        batch, self._accesses = self._accesses, {}
        try:
            await self.db.run(self.db.index.touch, batch)
        except BaseException:
            self._accesses = {**batch, **self._accesses}  # reads meanwhile are newer
            raise


def _pread_closing(fd: int, start: int, stop: int) -> bytes:
    try:
        return os.pread(fd, stop - start, start)
    finally:
        os.close(fd)
