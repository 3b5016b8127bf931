"""``--workers N|auto``: how many processes serve a server's port (SO_REUSEPORT)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def usable_cores() -> int:
    """The CPUs this process may run on (``taskset``, cgroup cpusets), at least one."""
    return max(1, len(os.sched_getaffinity(0)))


def worker_count(per_core: int) -> Callable[[str], int]:
    """argparse ``type=`` for ``--workers``: a positive count, or ``auto``: ``per_core``
    processes per usable core."""

    def parse(text: str) -> int:
        if text == "auto":
            return per_core * usable_cores()
        try:
            count = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
        if count < 1:
            raise argparse.ArgumentTypeError("--workers must be at least 1")
        return count

    return parse
