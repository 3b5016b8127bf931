"""Fixed malloc thresholds for the servers (glibc), set once at start-up.

glibc serves allocations above its *mmap threshold* (128 KiB at start) with a fresh
``mmap`` each and gives the memory back on free; it raises the threshold only once
such a block has been freed, and trims the heap top above twice that. So whether a
server's large buffers (multi-range answers of up to 16 MiB, cold answer pieces)
come from reused heap memory or from fresh pages depended on what it had served
before. Fresh pages cost a zero-fill and a fault per page, far more on a VM whose
free memory goes back to the host, and warm batches served by a spoke that had not run
cold traffic were markedly slower with glibc's default (CHANGELOG, the malloc fix).
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Up to here, blocks come from the heap: covers the largest multi-range answer.
MMAP_THRESHOLD_BYTES = 8 << 20
# Free memory at the heap top kept for reuse rather than given back: the bound on
# what this costs in resident memory.
TRIM_THRESHOLD_BYTES = 64 << 20
# Set by the operator, these win (glibc reads them at start).
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def fix_malloc_thresholds() -> bool:
    """Set the thresholds above; False (and nothing changed) when the operator set
    their own, or the C library has no ``mallopt`` (musl)."""
    if any(name in os.environ for name in _OPERATOR_SETTINGS) or "glibc.malloc." in (
        os.environ.get("GLIBC_TUNABLES", "")
    ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not done:
        logger.debug("mallopt refused the thresholds; glibc's defaults stay")
    return done
