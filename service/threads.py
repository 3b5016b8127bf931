"""Thread pools for background work that should give way to serving when CPU is short.

On two shared cores, a spoke's threads storing new chunks (the write, the fsync, the
read-back into the page cache) compete for the CPU with its event loop, which
receives those chunks from the hub and sends them to loaders. The loop is what a
loader waits on; a store can wait, and the storing backlog
(:class:`spoke.cache.slots.Backlog`)
slows the fetches if it waits too long. So the storing threads run
``BACKGROUND_NICENESS`` steps nicer than the process: the kernel gives them the CPU
the loop leaves, and less of it while the loop wants it. Cold streaming gained from it,
side by side (docs/bench-history.md, run 14).
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

# Nice 10 above the process: CFS weighs such a thread ~1/10 of a normal one.
BACKGROUND_NICENESS = 10
MAX_NICENESS = 19


def background_pool(workers: int, name_prefix: str) -> ThreadPoolExecutor:
    """A pool whose threads each lower their own CPU priority when they start."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name_prefix,
                              initializer=lower_this_thread)


def lower_this_thread(by: int = BACKGROUND_NICENESS) -> None:
    """Make the calling thread ``by`` steps nicer (capped at 19); a no-op where the
    niceness belongs to the whole process instead of the thread (all but Linux)."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()  # on Linux, PRIO_PROCESS with a TID is that thread
    current = os.getpriority(os.PRIO_PROCESS, tid)
    target = min(current + by, MAX_NICENESS)
    if target > current:  # lowering one's own priority needs no privilege
        os.setpriority(os.PRIO_PROCESS, tid, target)
