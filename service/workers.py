"""``--workers N|auto``: how many processes serve a server's port (SO_REUSEPORT), and
the CPUs a server may keep busy, which ``auto`` counts by."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def parse_worker_count(text: str, auto: int) -> int:
    """A ``--workers`` value: a positive count, or ``auto``'s stand-in ``auto``."""
    if text == "auto":
        return auto
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("--workers must be at least 1")
    return count


def worker_count(per_core: int) -> Callable[[str], int]:
    """argparse ``type=`` for ``--workers``: a positive count, or ``auto``: ``per_core``
    processes per usable CPU (:func:`machine_cpus`)."""

    def parse(text: str) -> int:
        return parse_worker_count(text, auto=per_core * machine_cpus() if text == "auto" else 0)

    return parse


def usable_cpus(allowed: int, cpu_max: str | None) -> int:
    """The CPUs a process may keep busy: those it may run on (``allowed``), or fewer
    under a cgroup v2 quota (``cpu_max``: the text of ``cpu.max``, ``"max 100000"`` for
    none, ``"200000 100000"`` for two CPUs' worth). A container limited to two CPUs on
    a 96-core node may run on all 96, but only two at a time."""
    allowed = max(1, allowed)
    if cpu_max is None:
        return allowed
    quota, _, period = cpu_max.strip().partition(" ")
    try:
        share = int(quota) / int(period or "100000")
    except (ValueError, ZeroDivisionError):  # "max": no quota
        return allowed
    return max(1, min(allowed, math.ceil(share)))


def _cgroup_cpu_max() -> str | None:
    """This process's CPU quota as cgroup v2's ``cpu.max`` says it, if there is one to
    read: v2's own file, else v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (as
    mounted in a container: its own cgroup's)."""
    return _cgroup_v2_cpu_max() or _cgroup_v1_cpu_max()


def _cgroup_v2_cpu_max() -> str | None:
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            unified = [line.split(":", 2)[2].strip() for line in f if line.startswith("0::")]
        if not unified:
            return None
        with open(f"/sys/fs/cgroup{unified[0].rstrip('/')}/cpu.max", encoding="ascii") as f:
            return f.read()
    except (OSError, IndexError):
        return None


def _cgroup_v1_cpu_max() -> str | None:
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            quota = f.read().strip()
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            period = f.read().strip()
    except OSError:
        return None
    return None if quota.startswith("-") else f"{quota} {period}"


def machine_cpus() -> int:
    """The usable CPUs of this machine, container or cpuset (:func:`usable_cpus`)."""
    return usable_cpus(len(os.sched_getaffinity(0)), _cgroup_cpu_max())
