"""OpenChunks: a bounded LRU of open chunk file descriptors, for the event loop.

A warm read of a small range is a ``pread`` on a chunk the page cache holds:
microseconds, cheaper than a hop to a thread pool. Keeping the descriptors of
recently read chunks open saves the ``open``/``close`` pair too. Only code on
the event loop thread uses these descriptors, synchronously, so one can never be
closed (evicted, purged) in the middle of a read that uses it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable


class OpenChunks:
    def __init__(self, opener: Callable[[str], int], max_open: int = 256) -> None:
        self._open = opener
        self.max_open = max_open
        self._fds: OrderedDict[str, tuple[int, int]] = OrderedDict()  # name: (fd, size)

    def __len__(self) -> int:
        return len(self._fds)

    def pread(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of chunk ``name``; ``FileNotFoundError`` if it is gone."""
        return os.pread(self._entry(name)[0], stop - start, start)

    def fd(self, name: str, need_bytes: int) -> int:
        """Chunk ``name``'s descriptor, open until ``max_open`` other chunks have been
        asked for since, or :meth:`discard`. ``FileNotFoundError`` if it is gone or
        shorter than ``need_bytes`` (torn: the caller cannot see a short read when the
        kernel sends the file for it)."""
        fd, size = self._entry(name)
        if size < need_bytes:
            self.discard(name)
            raise FileNotFoundError(f"chunk {name} holds {size} bytes, not {need_bytes}")
        return fd

    def _entry(self, name: str) -> tuple[int, int]:
        entry = self._fds.get(name)
        if entry is None:
            fd = self._open(name)
            entry = self._fds[name] = (fd, os.fstat(fd).st_size)
            if len(self._fds) > self.max_open:
                os.close(self._fds.popitem(last=False)[1][0])
        else:
            self._fds.move_to_end(name)
        return entry

    def discard(self, name: str) -> None:
        """Close the descriptor of a chunk that is being deleted (frees its disk space)."""
        entry = self._fds.pop(name, None)
        if entry is not None:
            os.close(entry[0])

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1][0])
