"""The soak's fault script: its plan, the disk that fills up, the hook before outages."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import tempfile
import time
from typing import Any

import pytest

from loadtest.diskfull import DiskFiller, can_mount, small_filesystem
from loadtest.faults import DISK_FULL, OUTAGE, FaultInjector, Window, plan


@pytest.mark.parametrize("duration_s", [150.0, 600.0, 1800.0])
def test_plan_has_disk_full_windows_apart_from_the_others(duration_s: float) -> None:
    windows = plan(duration_s, outage_s=20.0, disk_full_s=15.0)
    kinds = [w.kind for w in windows]
    assert DISK_FULL in kinds and OUTAGE in kinds
    for earlier, later in itertools.pairwise(windows):
        assert earlier.end_s <= later.start_s  # one fault at a time
    assert windows[0].start_s >= 20.0 and windows[-1].end_s <= duration_s - 15.0
    assert all(w.end_s - w.start_s == 15.0 for w in windows if w.kind == DISK_FULL)


def test_plan_without_disk_full_has_none() -> None:
    assert DISK_FULL not in {w.kind for w in plan(600.0, outage_s=30.0)}


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
def test_disk_filler_fills_the_filesystem_and_gives_it_back() -> None:
    with tempfile.TemporaryDirectory() as root, small_filesystem(root, 8 << 20):
        filler = DiskFiller(root)
        assert filler.top_up() > 0
        assert filler.free_bytes() < 1 << 20
        with pytest.raises(OSError) as refused, open(os.path.join(root, "x"), "wb") as f:
            f.write(bytes(2 << 20))
            f.flush()
            os.fsync(f.fileno())
        assert refused.value.errno == errno.ENOSPC
        os.unlink(os.path.join(root, "x"))
        filler.release()
        assert filler.free_bytes() > 6 << 20


class _RecordingProxy:
    """Stands in for a toxiproxy.Proxy: records what the injector asks of it."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def disable(self) -> None:
        self.calls.append("disable")

    def enable(self) -> None:
        self.calls.append("enable")

    def add_toxic(self, **_: Any) -> None:
        self.calls.append("add_toxic")

    def destroy_toxic(self, _: str) -> None:
        self.calls.append("destroy_toxic")


async def test_before_outage_runs_while_the_link_is_still_up() -> None:
    calls: list[str] = []

    async def prepare() -> None:
        calls.append("prepare")

    injector = FaultInjector(_RecordingProxy(calls), before_outage=prepare)
    started = time.monotonic()
    await asyncio.wait_for(injector.run([Window(OUTAGE, 0.0, 0.05)], started, started + 5),
                           timeout=5)
    assert calls == ["prepare", "disable", "enable"]
    assert injector.applied[0].kind == OUTAGE and injector.applied[0].ended is not None
