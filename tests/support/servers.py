"""Real hub and spoke servers on 127.0.0.1, for tests.

In-process servers (same event loop as the test) for most tests; subprocesses
(``python -m hub|spoke serve``) where a test needs to kill or restart one.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass

from aiohttp import web

from hub.app import make_app as make_hub_app
from hub.backend import Backend, FilesystemBackend, ObjectInfo, OpenObject
from hub.config import HubConfig
from loadtest.procs import Process, start_process
from service.runner import start_site
from spoke.app import make_app as make_spoke_app
from spoke.cache.clock import SYSTEM_CLOCK, Clock
from spoke.config import SpokeConfig
from tests.support.waits import settled_stats


@dataclass
class RunningServer:
    url: str
    runner: web.AppRunner
    app: web.Application

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_hub(config: HubConfig, backend: Backend | None = None) -> RunningServer:
    app = make_hub_app(config, backend)
    runner, port = await start_site(app, "127.0.0.1", 0)
    return RunningServer(f"http://127.0.0.1:{port}", runner, app)


async def start_spoke(config: SpokeConfig, clock: Clock = SYSTEM_CLOCK) -> RunningServer:
    """A spoke in this process; ``clock`` is its cache's (a :class:`FakeClock`'s to step
    past TTLs)."""
    app = make_spoke_app(config, clock)
    runner, port = await start_site(app, "127.0.0.1", 0)
    return RunningServer(f"http://127.0.0.1:{port}", runner, app)


def write_dataset(root: str, files: dict[str, int], seed: int = 7) -> dict[str, bytes]:
    """Create files of the given sizes with random bytes; returns their contents."""
    rng = random.Random(seed)
    contents: dict[str, bytes] = {}
    for path, size in files.items():
        data = rng.randbytes(size)
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        contents[path] = data
    return contents


class GatedBackend:
    """The real filesystem backend, with object reads held until a gate opens.

    Lets a test line up concurrent cold readers before the hub answers, the way
    groupcache's tests hold their getter. ``fail_next`` makes held reads fail;
    ``corrupt`` flips a byte in every read; ``cut_once_at`` makes the next read at
    that offset come back empty, once (the hub then cuts its answer there).
    """

    def __init__(self, root: str) -> None:
        self.inner = FilesystemBackend(root)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Semaphore(0)
        self.fail_reads = False
        self.corrupt = False
        self.cut_once_at: int | None = None

    def drain(self) -> None:
        """Forget the reads counted so far, so ``waiting`` counts only the next ones."""
        self.waiting = threading.Semaphore(0)  # reads release whichever is current

    def stat(self, path: str) -> ObjectInfo:
        return self.inner.stat(path)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def still_current(self, info: ObjectInfo) -> bool:
        return self.inner.still_current(info)

    def open(self, path: str) -> OpenObject:
        return _GatedObject(self, self.inner.open(path))


class _GatedObject:
    def __init__(self, backend: GatedBackend, inner: OpenObject) -> None:
        self._backend = backend
        self._inner = inner
        self.info = inner.info

    def read(self, offset: int, length: int) -> bytes:
        self._backend.waiting.release()
        if not self._backend.gate.wait(timeout=30):
            raise TimeoutError("test gate never opened")
        if self._backend.fail_reads:
            raise OSError("injected read failure")
        if offset == self._backend.cut_once_at:
            self._backend.cut_once_at = None
            return b""
        data = self._inner.read(offset, length)
        if self._backend.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def close(self) -> None:
        self._inner.close()


__all__ = ["GatedBackend", "Process", "RunningServer", "settled_stats", "start_hub",
           "start_process", "start_spoke", "write_dataset"]
