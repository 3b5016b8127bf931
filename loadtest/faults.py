"""A fault script: latency spikes, connection resets, an outage, a full disk.

The soak (``python -m loadtest.soak``) runs one of these against the Toxiproxy
proxy in front of the hub, and against the spoke's cache filesystem. :func:`plan`
lays out fault windows over a run (a quiet warm-up first and a quiet tail last,
so the end-of-run checks see a settled spoke); :class:`FaultInjector` applies
and reverts them through the ``toxiproxy-python`` client and remembers when each
one really started and ended, which is what the soak uses to decide the phase a
request ran in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loadtest.diskfull import DiskFiller

LATENCY = "latency_spike"
RESET = "reset_peer"
OUTAGE = "outage"
DISK_FULL = "disk_full"
NORMAL = "normal"
RECOVERY = "recovery"
KINDS = (LATENCY, RESET, OUTAGE, DISK_FULL)

# After a fault is reverted the spoke needs a moment: its circuit breaker probes
# again after --breaker-reset (1 s by default) and retries back off. Requests that
# start in this grace period are labelled "recovery", not "normal".
RECOVERY_S = 5.0
SPIKE_TOXIC = "soak_latency_spike"
RESET_TOXIC = "soak_reset_peer"
# How often a full disk is topped up again: the spoke frees space by evicting.
DISK_TOP_UP_S = 0.1


@dataclass(frozen=True, slots=True)
class Window:
    """A planned fault: ``kind`` from ``start_s`` to ``end_s`` after the run starts."""

    kind: str
    start_s: float
    end_s: float


@dataclass(slots=True)
class Applied:
    """A fault as it really happened, in ``time.monotonic()`` seconds."""

    kind: str
    started: float
    ended: float | None = None


def plan(duration_s: float, outage_s: float = 30.0, disk_full_s: float = 0.0) -> list[Window]:
    """Fault windows over a run of ``duration_s`` seconds.

    A cycle is: latency spike, gap, resets, gap, outage, gap, and with
    ``disk_full_s`` a full disk and a gap. Runs under five minutes get a
    compressed cycle; longer ones repeat the full cycle while it fits. The first
    15 % (at least 20 s) and the last 10 % (at least 15 s) stay quiet. At least
    one outage is planned whenever the run is long enough for one.
    """
    warmup = max(20.0, 0.15 * duration_s)
    tail = max(15.0, 0.10 * duration_s)
    disk: list[tuple[str | None, float]] = []
    if duration_s < 300:
        if disk_full_s:
            disk = [(DISK_FULL, disk_full_s), (None, 15.0)]
        cycle = [(LATENCY, 10.0), (None, 10.0), (RESET, 10.0), (None, 10.0),
                 (OUTAGE, outage_s), (None, 20.0), *disk]
    else:
        if disk_full_s:
            disk = [(DISK_FULL, disk_full_s), (None, 30.0)]
        cycle = [(LATENCY, 15.0), (None, 30.0), (RESET, 10.0), (None, 30.0),
                 (OUTAGE, outage_s), (None, 45.0), *disk]
    windows: list[Window] = []
    t = warmup
    for _ in range(1000):  # bounded: a cycle is ≥ 60 s, so far fewer fit in any run
        if t + sum(length for _, length in cycle) - cycle[-1][1] > duration_s - tail:
            break
        for kind, length in cycle:
            if kind is not None:
                windows.append(Window(kind, t, t + length))
            t += length
    if not any(w.kind == OUTAGE for w in windows) and warmup + outage_s <= duration_s - tail:
        windows.append(Window(OUTAGE, warmup, warmup + outage_s))
    return windows


class FaultInjector:
    """Applies fault windows to one Toxiproxy proxy (a ``toxiproxy.Proxy``) and a disk.

    ``before_outage`` runs, while the link is still up, just before each outage
    (the soak uses it to leave an object partly cached); ``disk`` fills the cache's
    filesystem during disk-full windows.
    """

    def __init__(self, proxy: Any, spike_ms: int = 1500, spike_jitter_ms: int = 500,
                 reset_toxicity: float = 0.5, disk: DiskFiller | None = None,
                 before_outage: Callable[[], Awaitable[None]] | None = None) -> None:
        self.proxy = proxy
        self.spike_ms = spike_ms
        self.spike_jitter_ms = spike_jitter_ms
        self.reset_toxicity = reset_toxicity
        self.disk = disk
        self.before_outage = before_outage
        self.applied: list[Applied] = []

    def phase_at(self, t: float) -> str:
        """The phase at monotonic time ``t``: a fault kind, ``recovery`` or ``normal``."""
        for fault in reversed(self.applied):
            if t < fault.started:
                continue
            if fault.ended is None or t <= fault.ended:
                return fault.kind
            if t <= fault.ended + RECOVERY_S:
                return RECOVERY
            break
        return NORMAL

    def phase_during(self, t0: float, t1: float) -> str:
        """The phase of a request in flight from ``t0`` to ``t1``.

        A fault it overlapped wins, then a recovery period it overlapped: a request
        sent just before the link went down can still fail because of it.
        """
        recovering = False
        for fault in self.applied:
            end = fault.ended if fault.ended is not None else t1
            if fault.started <= t1 and t0 <= end:
                return fault.kind
            recovering |= fault.ended is not None and t0 <= end + RECOVERY_S and t1 > end
        return RECOVERY if recovering else NORMAL

    def overlapping(self, t0: float, t1: float, kind: str) -> Applied | None:
        """The ``kind`` fault that a request in flight from ``t0`` to ``t1`` overlapped."""
        for fault in self.applied:
            end = fault.ended if fault.ended is not None else t1
            if fault.kind == kind and fault.started <= t1 and t0 <= end:
                return fault
        return None

    async def run(self, windows: list[Window], run_started: float, deadline: float) -> None:
        """Apply each window at its time; always revert what was applied."""
        for window in windows:
            if not await _sleep_until(run_started + window.start_s, deadline):
                return
            if window.kind == OUTAGE and self.before_outage is not None:
                await self.before_outage()
            fault = Applied(window.kind, time.monotonic())
            # Record first: a request that starts while the API call is in flight
            # already belongs to the fault.
            self.applied.append(fault)
            try:
                await asyncio.to_thread(self._apply, window.kind)
                await self._hold(window.kind, min(run_started + window.end_s, deadline))
            finally:
                await asyncio.to_thread(self._revert, window.kind)
                fault.ended = time.monotonic()

    async def _hold(self, kind: str, until: float) -> None:
        """Keep the fault on until monotonic ``until``."""
        if kind != DISK_FULL or self.disk is None:
            await asyncio.sleep(max(0.0, until - time.monotonic()))
            return
        while time.monotonic() < until:
            await asyncio.to_thread(self.disk.top_up)
            await asyncio.sleep(min(DISK_TOP_UP_S, max(0.0, until - time.monotonic())))

    def _apply(self, kind: str) -> None:
        if kind == LATENCY:
            self.proxy.add_toxic(name=SPIKE_TOXIC, type="latency", stream="downstream",
                                 attributes={"latency": self.spike_ms,
                                             "jitter": self.spike_jitter_ms})
        elif kind == RESET:
            # Downstream: the hub's response is cut by a TCP RST on its first bytes.
            self.proxy.add_toxic(name=RESET_TOXIC, type="reset_peer", stream="downstream",
                                 toxicity=self.reset_toxicity, attributes={"timeout": 0})
        elif kind == OUTAGE:
            # Disabling drops live connections and stops listening: the hub is gone.
            self.proxy.disable()
        elif kind == DISK_FULL and self.disk is not None:
            self.disk.top_up()

    def _revert(self, kind: str) -> None:
        if kind == LATENCY:
            self.proxy.destroy_toxic(SPIKE_TOXIC)
        elif kind == RESET:
            self.proxy.destroy_toxic(RESET_TOXIC)
        elif kind == OUTAGE:
            self.proxy.enable()
        elif kind == DISK_FULL and self.disk is not None:
            self.disk.release()


async def _sleep_until(when: float, deadline: float) -> bool:
    """Sleep until monotonic ``when``; False (after sleeping to ``deadline``) if that is later."""
    now = time.monotonic()
    if when > deadline:
        await asyncio.sleep(max(0.0, deadline - now))
        return False
    await asyncio.sleep(max(0.0, when - now))
    return True
