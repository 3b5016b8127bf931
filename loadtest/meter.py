"""What the servers under test use: CPU of a process tree, resident memory, open files.

Read through psutil. The figures are the ones the kernel's ``/proc`` gives: CPU is
user + system time; ``rss`` is ``VmRSS``; ``anon`` is ``RssAnon``, the memory the
process itself holds (buffers, queues, tasks), which is RSS less the file-backed and
shared pages (``statm``'s shared: the chunk files a spoke maps, page cache it may drop).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import psutil

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (nginx workers, a spoke's worker processes)."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except _GONE:
        return [pid]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (those that are gone count nothing)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except _GONE:
            continue
        total += times.user + times.system
    return total


def rss_bytes(pids: list[int]) -> int:
    """Resident bytes of ``pids`` summed (``VmRSS``)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except _GONE:
            continue
    return total


@dataclass(frozen=True)
class Memory:
    rss: int  # VmRSS
    anon: int  # RssAnon: RSS less file-backed and shared pages
    file: int  # RssFile + RssShmem


def memory(pid: int | None = None) -> Memory:
    """The resident memory of ``pid`` (default: this process), in bytes."""
    info = psutil.Process(pid).memory_info()
    return Memory(rss=info.rss, anon=info.rss - info.shared, file=info.shared)


def open_fds(pid: int) -> int:
    fds: int = psutil.Process(pid).num_fds()
    return fds


def open_sockets(pid: int) -> int:
    """Sockets ``pid`` holds open (listening ones included)."""
    return len(psutil.Process(pid).net_connections(kind="all"))


def machine_busy_seconds() -> float:
    """CPU seconds spent not idle by the whole machine (all cores) since boot."""
    t = psutil.cpu_times()
    busy: float = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
    return busy


@dataclass(frozen=True)
class DiskUse:
    """A block device's counters since boot: bytes read and written, and milliseconds
    it had a request in flight (``io_ticks``: 1,000 a second is a device always busy)."""

    read_bytes: int
    write_bytes: int
    busy_ms: int

    def __sub__(self, before: DiskUse) -> DiskUse:
        return DiskUse(self.read_bytes - before.read_bytes,
                       self.write_bytes - before.write_bytes, self.busy_ms - before.busy_ms)


def disk_of(path: str) -> str | None:
    """The block device ``path`` lives on (``vda``, ``nvme0n1p2``), or None where there
    is none to read (tmpfs, overlay, a network filesystem)."""
    dev = os.stat(path).st_dev
    link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.exists(link):
        return None
    name = os.path.basename(os.path.realpath(link))
    return name if name in psutil.disk_io_counters(perdisk=True) else None


def disk_use(name: str) -> DiskUse:
    counters = psutil.disk_io_counters(perdisk=True)[name]
    return DiskUse(counters.read_bytes, counters.write_bytes, counters.busy_time)


def self_cpu() -> float:
    """CPU seconds of this process alone (children excluded)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuMeter:
    """CPU used by a server's process tree, by our whole tree and by the machine."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.server_pids = process_tree(self.server_pid) if self.server_pid else []
        self.server0 = cpu_seconds(self.server_pids)
        self.ours0 = cpu_seconds(process_tree(os.getpid()))
        self.self0 = self_cpu()
        self.machine0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        # Processes that came and went in between (wrk) are counted through rusage.
        self.server = cpu_seconds(self.server_pids) - self.server0
        self.ours = cpu_seconds(process_tree(os.getpid())) - self.ours0
        self.self_cpu = self_cpu() - self.self0
        self.machine = machine_busy_seconds() - self.machine0

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.seconds if self.seconds else 0.0
