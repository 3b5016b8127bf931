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
        self._fds: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._fds)

    def pread(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of chunk ``name``; ``FileNotFoundError`` if it is gone."""
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = self._open(name)
            if len(self._fds) > self.max_open:
                os.close(self._fds.popitem(last=False)[1])
        else:
            self._fds.move_to_end(name)
        return os.pread(fd, stop - start, start)

    def discard(self, name: str) -> None:
        """Close the descriptor of a chunk that is being deleted (frees its disk space)."""
        fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])
