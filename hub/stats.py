"""The hub's counters (exported on /metrics), totals over its processes.

With ``--workers N`` each process counts into its own slot of one shared memory
block (a memfd the first process makes and hands to each sibling), and /metrics, which
any of them may answer, sums the slots. A slot has one writer, its process, so there is
no lock; a reader sees each count whole (8 aligned bytes).
"""

from __future__ import annotations

import mmap
import os

from service.metrics import Series

FIELDS = ("requests", "bytes_sent", "manifests_served")
_WIDTH = 8  # bytes per count: a signed 64-bit integer


class SharedCounts:
    """``processes`` slots of :data:`FIELDS` counts, in a memfd a sibling can map too."""

    def __init__(self, processes: int, fd: int = -1) -> None:
        """Over the memfd ``fd``, else in this process's memory alone."""
        self.fd = fd
        self.processes = processes
        self._map = mmap.mmap(fd, processes * len(FIELDS) * _WIDTH)
        self.view = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, processes: int) -> SharedCounts:
        """A block the first process hands its siblings (:meth:`open`)."""
        fd = os.memfd_create("hubspoke-hub-counts")
        os.ftruncate(fd, processes * len(FIELDS) * _WIDTH)
        return cls(processes, fd)

    @classmethod
    def open(cls, fd: int) -> SharedCounts:
        """The block a sibling was handed (its size says how many processes)."""
        return cls(os.fstat(fd).st_size // (len(FIELDS) * _WIDTH), fd)

    def total(self, field: int) -> int:
        step = len(FIELDS)
        return sum(self.view[field::step])


class _Count:
    """One of :data:`FIELDS`, as an attribute of :class:`HubStats`: its process's slot."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = FIELDS.index(name)

    def __get__(self, stats: HubStats, owner: type | None = None) -> int:
        return int(stats._view[stats._base + self.field])

    def __set__(self, stats: HubStats, value: int) -> None:
        stats._view[stats._base + self.field] = value


class HubStats:
    """One process's counts (``slot`` of ``shared``, else its own), read as the totals of
    all of them."""

    __slots__ = ("_base", "_shared", "_view")
    requests = _Count()
    bytes_sent = _Count()
    manifests_served = _Count()

    def __init__(self, shared: SharedCounts | None = None, slot: int = 0) -> None:
        self._shared = shared if shared is not None else SharedCounts(1)
        if not 0 <= slot < self._shared.processes:
            raise ValueError(f"no counter slot {slot} among {self._shared.processes}")
        self._view = self._shared.view
        self._base = slot * len(FIELDS)

    def series(self) -> list[Series]:
        total = self._shared.total
        return [
            Series("hub_requests_total", "counter",
                   "HTTP requests received, by all the hub's processes", lambda: total(0)),
            Series("hub_bytes_sent_total", "counter",
                   "object data bytes sent, by all the hub's processes", lambda: total(1)),
            Series("hub_manifests_served_total", "counter",
                   "manifests served, by all the hub's processes", lambda: total(2)),
            Series("hub_processes", "gauge", "processes serving the hub's port (--workers)",
                   lambda: self._shared.processes),
        ]
