"""``--cpu-affinity spread``: each of the spoke's processes bound to one CPU, in turn.

It trades throughput when the CPUs are not all busy for a steadier tail when they are:
saturated, the bound processes' tail stays flat at the same requests/s; not saturated
(one Python client), a request for a process bound to the client's own CPU waits for
the client to yield it while the other CPU idles, where unbound the kernel wakes the
process there. Figures: docs/architecture.md, *CPU affinity*.

So it is off by default, in ``make bench`` too: it is for CPUs that are the spoke's
alone and busy (confine it with ``taskset`` or a cpuset; the spread stays within
them), not for a GPU node where it shares them with loaders and the training job.
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
