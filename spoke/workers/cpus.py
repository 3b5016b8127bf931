"""``--cpu-affinity spread``: each of the spoke's processes bound to one CPU, in turn.

It trades throughput when the CPUs are not all busy for a steadier tail when they are.
Measured on 2 cores, side by side, ``--workers auto`` (two processes per core):

- Saturated (wrk, warm 64 KiB reads over 64 connections, 4 rounds each in two
  sittings): p99 6.7 -> 5.1 ms and 12.6 -> 5.8 ms at the same requests/s; the
  bound side's single rounds stayed within 4.7-6.3 ms while the unbound side's went
  from 6.1 to 41 with the machine's other load. Binding only the reader workers did
  nothing. 4 MiB reads, batches and cold streaming: unchanged.
- Not saturated (the training replay: one Python client, 32 workers, 16 KiB samples,
  2 rounds each): warm samples/s 9.5-10.4k -> 6.1-7.2k. A request for a process
  bound to the client's own CPU waits for the client to yield it, while the other
  CPU idles; unbound, the kernel wakes the process there.

So it is off by default, in ``make bench`` too: it is for CPUs that are the spoke's
alone and busy (confine it with ``taskset`` or a cpuset; the spread stays within
them), not for a GPU node where it shares them with loaders and the training job.
nginx's ``worker_cpu_affinity auto`` did not help nginx either (48.4k -> 47.8k req/s,
p99 3.3 -> 3.5 ms).
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def spread(allowed: Iterable[int], processes: int) -> list[int]:
    """The CPU of each of ``processes`` processes: the allowed ones in order, round
    robin (the spoke itself first, then its reader workers)."""
    cpus = sorted(set(allowed))
    if not cpus:
        raise ValueError("no CPU to spread over")
    return [cpus[i % len(cpus)] for i in range(processes)]


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on (``taskset``, cgroup cpusets)."""
    return os.sched_getaffinity(0)


def bind_to(cpu: int) -> None:
    """Bind the calling thread, and every thread it starts from now on, to ``cpu``.
    Call it before the process starts threads: those already running stay free."""
    os.sched_setaffinity(0, {cpu})
