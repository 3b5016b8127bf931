"""Errors of work nobody waits on, counted and logged without flooding the log.

A long-lived task (the spoke's access-time saving, its ``--max-age`` expiry) that
let an exception out would stop for good, and nothing would say so: one full-disk
moment used to end expiry until the next restart. :func:`run_every` runs a step on
an interval and lives through the step's errors. :class:`ErrorCounts` counts such
errors by kind for ``/metrics`` and logs them once per kind per
:data:`LOG_INTERVAL_S` (a disk that stays full fails every write; the log gets one
line a minute about it, not one per chunk).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable

from service.logs import RateLimitedLog

LOG_INTERVAL_S = 60.0


class ErrorCounts:
    """Errors counted by kind (a task's name, a kind of write), logged rate-limited."""

    def __init__(
        self, what: str, kinds: Iterable[str], logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic, level: int = logging.ERROR,
    ) -> None:
        self.what = what  # says what failed in the log line: "background task", ...
        self.level = level
        # Every known kind from the start: /metrics shows a 0 before the first error.
        self.counts: dict[str, int] = dict.fromkeys(kinds, 0)
        self._log = RateLimitedLog(logger, LOG_INTERVAL_S, clock)

    def record(self, kind: str, exc: BaseException) -> None:
        """Count ``exc`` under ``kind``; log it unless ``kind`` was logged lately."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._log.log(self.level, kind, "%s %s failed: %s", self.what, kind,
                      exc or type(exc).__name__, first_exc=exc)
        release_frames(exc)

    def total(self) -> int:
        return sum(self.counts.values())


def release_frames(exc: BaseException) -> None:
    """Drop the locals of the finished frames that ``exc`` (and what it chained) passed
    through, once it is handled.

    A frame that caught an exception in ``except ... as exc`` and raised again holds
    it, and it holds the frame: a reference cycle that only the cyclic collector
    frees, often minutes later once it has aged into the oldest generation. Until
    then the frame's locals stay alive, and on a failed chunk write they are the
    chunk's buffer: a disk that stays full made the spoke's memory climb by one
    buffer per refused write. Frames still running are left as they are.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


async def run_every(
    name: str, interval_s: float, step: Callable[[], Awaitable[object]], errors: ErrorCounts,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run ``step`` every ``interval_s`` until cancelled; its errors go to ``errors``
    under ``name`` and the next round runs as usual."""
    while True:
        await sleep(interval_s)
        try:
            await step()
        except Exception as exc:  # counted and logged: the loop must go on
            errors.record(name, exc)
