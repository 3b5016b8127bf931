"""OpenChunks: a bounded LRU of open chunk file descriptors, for the event loop.

A warm read of a small range is a ``pread`` on a chunk the page cache holds:
microseconds, cheaper than a hop to a thread pool. Keeping the descriptors of
recently read chunks open saves the ``open``/``close`` pair too. Only code on
the event loop thread uses these descriptors, synchronously, so one can never be
closed (evicted, purged) in the middle of a read that uses it.

A batch of samples (a multi-range read) is sent from the chunk files mapped
read-only instead (:meth:`OpenChunks.view`): its 64 KiB pieces then go from the
page cache to the socket in one copy, the kernel's, not two (``pread`` into a new
``bytes``, then the socket write), which is what lets batches keep up with single
reads (docs/bench-history.md, run 10). The views are only ever handed to a plain TCP
transport, so only the kernel reads the mapped bytes: a file that shrank under
the map, or a disk error, fails that write (EFAULT, the connection is cut) where
Python touching such a page would be killed by SIGBUS. Every use of an open chunk
checks its file again (:meth:`spoke.cache.integrity.ChunkChecker.recheck`: an ``fstat``,
and the digest again if the file changed), so a file cut short or rewritten under
its map is dropped before another view of it is handed out; only views already
queued on a socket when it changed can still fail their write. A map
keeps its own duplicate of the descriptor, so a mapped chunk holds two (servers
lift their open files limit at start: :func:`service.runner.raise_open_file_limit`).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

from spoke.cache.integrity import ChunkChecker, Identity


class _Open:
    __slots__ = ("fd", "identity", "mapped", "size")

    def __init__(self, fd: int, identity: Identity) -> None:
        self.fd = fd
        self.identity = identity
        self.size = identity[1]
        self.mapped: memoryview | None = None


class OpenChunks:
    def __init__(self, checker: ChunkChecker, max_open: int = 256) -> None:
        self.checker = checker
        self.max_open = max_open
        self._chunks: OrderedDict[str, _Open] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def pread(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of chunk ``name``; ``FileNotFoundError`` if it is gone
        (:class:`~spoke.cache.store.BadChunkFile` if its file is bad)."""
        return os.pread(self._entry(name).fd, stop - start, start)

    def view(self, name: str, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of chunk ``name`` as a view of its mapped file, no
        copy: only for a plain socket's transport (see the module doc).
        ``FileNotFoundError`` if it is gone or shorter than ``stop`` (torn)."""
        entry = self._holding(name, stop)
        if entry.mapped is None:
            entry.mapped = memoryview(mmap.mmap(entry.fd, entry.size, prot=mmap.PROT_READ))
        return entry.mapped[start:stop]

    def fd(self, name: str, need_bytes: int) -> int:
        """Chunk ``name``'s descriptor, open until ``max_open`` other chunks have been
        asked for since, or :meth:`discard`. ``FileNotFoundError`` if it is gone or
        shorter than ``need_bytes`` (torn: the caller cannot see a short read when the
        kernel sends the file for it)."""
        return self._holding(name, need_bytes).fd

    def _holding(self, name: str, need_bytes: int) -> _Open:
        entry = self._entry(name)
        if entry.size < need_bytes:
            self.discard(name)
            raise FileNotFoundError(f"chunk {name} holds {entry.size} bytes, not {need_bytes}")
        return entry

    def _entry(self, name: str) -> _Open:
        """Chunk ``name``'s open file, checked (see the module doc)."""
        entry = self._chunks.get(name)
        if entry is None:
            entry = self._chunks[name] = _Open(*self.checker.open(name))
            if len(self._chunks) > self.max_open:
                _close(self._chunks.popitem(last=False)[1])
            return entry
        try:
            entry.identity = self.checker.recheck(name, entry.fd, entry.identity)
        except FileNotFoundError:
            self.discard(name)
            raise
        self._chunks.move_to_end(name)
        return entry

    def discard(self, name: str) -> None:
        """Close the descriptor of a chunk that is being deleted (frees its disk space
        once views of it still queued on sockets are sent)."""
        entry = self._chunks.pop(name, None)
        if entry is not None:
            _close(entry)

    def close(self) -> None:
        while self._chunks:
            _close(self._chunks.popitem()[1])


def _close(entry: _Open) -> None:
    # The map is not closed here: views of it may still wait in a transport. It is
    # unmapped when the entry and the last of them are gone.
    os.close(entry.fd)
