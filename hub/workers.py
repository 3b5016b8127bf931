"""``--workers N``: N hub processes serving one port.

The hub keeps nothing a request needs from another: a manifest is computed from the
file (each process keeps its own, so a file's first manifest is hashed once per
process), tokens are checked with the shared secret alone, files are opened per
process. So the processes are peers: the first (the one started) binds the port, and
starts N - 1 siblings that bind the same port with ``SO_REUSEPORT``, so the kernel
spreads connections over all N. Why processes: one Python process saturates one core
on small reads, where nginx runs one worker per core (docs/performance.md).

Each sibling holds one end of a socket pair whose other end only the first process
holds: on it, it receives the shared block of counters (:mod:`hub.stats`) and its slot
in it, says it listens by writing a byte, and stops when it reads the end of it, so a
first process killed outright (SIGKILL) leaves no sibling behind. SIGTERM or
SIGINT to the first process stops the siblings, then itself. A sibling that dies is
started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

from hub.config import LIFELINE_FLAG
from hub.stats import HubStats, SharedCounts
from service.runner import Companion, StartedSite, start_site

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
RESTART_PAUSE_S = 1.0
READY = b"r"


class SiblingError(RuntimeError):
    """A sibling did not start."""


@dataclass(eq=False)
class _Sibling:
    proc: asyncio.subprocess.Process
    lifeline: socket.socket  # the first process's end


class Siblings:
    """The first process's side: starts the siblings, restarts one that dies, stops them."""

    def __init__(self, count: int, argv: Sequence[str], port: int, counts: SharedCounts) -> None:
        if counts.processes != count + 1:
            raise ValueError(f"{counts.processes} counter slots for {count + 1} processes")
        self.count = count
        self.counts = counts
        # The first process's own arguments, the port made the bound one: the last
        # occurrence of a flag wins.
        self.argv = [*argv, "--port", str(port), "--workers", "1"]
        self.siblings: list[_Sibling] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.siblings]

    async def start(self) -> None:
        """All at once (a sibling takes a second or so to import); the first that fails
        is raised, once those that started are known to :meth:`stop`."""
        started = await asyncio.gather(*(self._spawn(i) for i in range(self.count)),
                                       return_exceptions=True)
        self.siblings = [s for s in started if isinstance(s, _Sibling)]
        for error in started:
            if isinstance(error, BaseException):
                raise error
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(self.count)]

    async def _spawn(self, index: int) -> _Sibling:
        mine, theirs = socket.socketpair()
        try:
            # Before the sibling starts: its first read finds it whole.
            socket.send_fds(mine, [(index + 1).to_bytes(4, "big")], [self.counts.fd])
            mine.setblocking(False)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hub", *self.argv, LIFELINE_FLAG, str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        sibling = _Sibling(proc, mine)
        try:
            said = await asyncio.wait_for(
                asyncio.get_running_loop().sock_recv(mine, len(READY)), READY_TIMEOUT_S)
        except (TimeoutError, OSError):
            said = b""
        except asyncio.CancelledError:  # stopping while it starts: stopped too
            await self._end(sibling)
            raise
        if said != READY:
            await self._end(sibling)
            raise SiblingError(f"a hub worker did not start (exit code {proc.returncode})")
        return sibling

    async def _watch(self, index: int) -> None:
        while not self._stopping:
            sibling = self.siblings[index]
            code = await sibling.proc.wait()
            if self._stopping:
                return
            logger.warning("hub worker %d exited (code %s); starting another", sibling.proc.pid,
                           code)
            sibling.lifeline.close()
            await asyncio.sleep(RESTART_PAUSE_S)
            if self._stopping:
                return
            try:
                self.siblings[index] = await self._spawn(index)
            except SiblingError as exc:
                logger.error("%s; the port is served by the others", exc)
                return

    async def stop(self) -> None:
        self._stopping = True
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await asyncio.gather(*(self._end(s) for s in self.siblings))

    async def _end(self, sibling: _Sibling) -> None:
        """SIGTERM, then SIGKILL if it has not stopped in time; waited for (no zombie)."""
        proc = sibling.proc
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        sibling.lifeline.close()


def siblings(count: int, argv: Sequence[str], counts: SharedCounts) -> Companion:
    """The first process's companion (:func:`service.runner.serve_forever`): ``count``
    siblings on its bound port while it serves, counting into ``counts``."""

    @contextlib.asynccontextmanager
    async def run(
        _runner: web.AppRunner, port: int, _extra: Sequence[StartedSite],
    ) -> AsyncIterator[None]:
        pool = Siblings(count, argv, port, counts)
        try:
            await pool.start()
            yield
        finally:
            await pool.stop()

    return run


def sibling_stats(lifeline: socket.socket) -> HubStats:
    """A sibling's counters: its slot of the block the first process sent (blocking)."""
    data, fds, _flags, _addr = socket.recv_fds(lifeline, 4, 1)
    if len(data) != 4 or len(fds) != 1:
        raise SiblingError("the first hub process sent no counters")
    return HubStats(SharedCounts.open(fds[0]), int.from_bytes(data, "big"))


async def serve_sibling(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None,
    lifeline: socket.socket,
) -> None:
    """A sibling's life: serve ``port`` beside the first process until SIGTERM, or until
    the first process is gone. It prints no ``listening on`` line: the first one does."""
    lifeline.setblocking(False)
    loop = asyncio.get_running_loop()
    runner, _ = await start_site(app, host, port, ssl_context, reuse_port=True)
    stop = asyncio.Event()
    watch = asyncio.ensure_future(loop.sock_recv(lifeline, 1))
    try:
        await loop.sock_sendall(lifeline, READY)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        watch.add_done_callback(lambda _: stop.set())  # the first process is gone
        await stop.wait()
    finally:
        watch.cancel()
        await runner.cleanup()
        lifeline.close()
