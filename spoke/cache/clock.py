"""Clock: the time the cache reads, passed in so that tests can move it.

Two readings, as the cache has two uses for time: ``monotonic`` for what lasts a while
in this process (manifest TTLs, retry deadlines), ``wall`` for what is written down and
must mean the same after a restart (when a chunk was stored or last read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Clock:
    monotonic: Callable[[], float]
    wall: Callable[[], float]


# A running spoke's: reader workers compare expiries on the same monotonic clock.
SYSTEM_CLOCK = Clock(monotonic=time.monotonic, wall=time.time)
