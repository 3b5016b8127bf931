"""Reader workers: more processes answering cache hits on the spoke's port (``--workers``).

One process, the owner, is the spoke: it alone fetches from the hub, verifies, stores,
evicts and keeps the index, so a chunk is never fetched twice (single-flight lives in
one process) and the policy sees one stream of accesses. With ``--workers N`` it starts
N - 1 reader processes listening on the same port (``SO_REUSEPORT``: the kernel spreads
new connections over all N). A reader decides nothing. It answers plain reads
(:mod:`spoke.serve.plain`) of chunks the owner has told it are stored, of a manifest the
owner holds fresh; any other request (a miss, a conditional, a plan, every other
route) goes to the owner with its connection: the reader passes the socket itself and
the bytes it had read of it, and the owner answers it, and whatever follows on it, as
if it had accepted it.

Over a :class:`~spoke.workers.channel.Channel` per reader, in the records of
:mod:`spoke.workers.messages`, the owner tells every change (a manifest fresh until
when, or forgotten; a chunk stored, or gone) and the reader tells which chunks it
served, every 50 ms, so the policy counts those accesses and ``/stats`` the hits. A
purge answers only once every reader has applied it. Chunk files are never rewritten in
place: a reader's read of a chunk evicted a moment ago still gets that chunk's verified
bytes, or fails and hands the request over. A stored chunk is told with what its file
must hold (size, digest): a reader checks each file itself before it serves it
(:mod:`spoke.cache.integrity`); one it finds bad it lets go, tells the owner of (which
hashes it again, and drops it if it is bad), and hands the read over.

Why processes: one Python process saturates one core on warm small reads
(docs/architecture.md, *Reader workers*, has the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web

from protocol.manifest import Manifest, encode_manifest
from service.front import FRONT, FrontStats
from service.metrics import Histogram
from service.runner import Companion, StartedSite
from spoke.cache.engine import ChunkCache
from spoke.s3.stats import S3_STATS, S3Stats
from spoke.workers import messages
from spoke.workers.channel import (
    MAX_MESSAGE_BYTES,
    Channel,
    bytes_from_fd,
    channel_pair,
    receiving,
)

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 20.0
SYNC_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 5.0
# Room for a manifest message's other fields; a bigger manifest (an object of
# thousands of chunks) is not mirrored, and its reads go to the owner.
MAX_MIRRORED_MANIFEST_BYTES = MAX_MESSAGE_BYTES - 4096
SNAPSHOT_BATCH = 500  # chunks per message, each with its size and digest: ~40 KiB
RESTART_PAUSE_S = 1.0


@dataclass(frozen=True)
class S3Port:
    """The S3 front end's port, which the readers serve too: ``take_over`` makes the
    protocol of a connection to it that a reader hands over; ``stats``: its counters."""

    port: int
    take_over: Callable[[bytes], asyncio.Protocol]
    stats: S3Stats


@dataclass(eq=False)
class _Reader:
    proc: asyncio.subprocess.Process
    ready: asyncio.Future[None]
    channel: Channel = field(init=False)
    cpu: int | None = None  # bound to (--cpu-affinity spread); a replacement takes it over
    killed: bool = False  # by us: not to be replaced
    listening: bool = False
    synced: dict[int, asyncio.Future[None]] = field(default_factory=dict)


class ReaderPool:
    """The owner's side: starts the readers, keeps them told, takes what they hand over.

    Also the cache's :class:`~spoke.cache.engine.CacheWatcher` while it runs.
    """

    def __init__(self) -> None:
        self.readers: list[_Reader] = []
        self.handed_over = 0  # connections readers passed to this process
        self.restarts = 0  # readers replaced after dying on their own
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._argv: list[str] = []
        self._stopping = False
        self.s3: S3Port | None = None

    async def start(
        self, cache: ChunkCache, latency: dict[str, Histogram],
        take_over: Callable[[bytes], asyncio.Protocol], count: int, argv: Sequence[str],
        port: int, cpus: Sequence[int] | None = None, front: FrontStats | None = None,
        s3: S3Port | None = None,
    ) -> None:
        """Start ``count`` readers of ``python -m spoke *argv`` on ``port``, mirroring
        ``cache``; returns once each listens (or has failed, logged). ``take_over``
        makes the protocol of a connection a reader hands over; reader ``i`` is bound
        to ``cpus[i]`` when given. ``s3``: the readers serve the S3 port too."""
        self.cache, self.latency, self.take_over = cache, latency, take_over
        self.front = front or FrontStats()
        self.s3 = s3
        self._argv = [*argv, "--port", str(port)]
        if s3 is not None:
            self._argv += ["--s3-port", str(s3.port)]
        cache.watcher = self
        started = [await self._spawn(None if cpus is None else cpus[i]) for i in range(count)]
        waits = [asyncio.wait_for(asyncio.shield(r.ready), READY_TIMEOUT_S) for r in started]
        for reader, outcome in zip(
            started, await asyncio.gather(*waits, return_exceptions=True), strict=True
        ):
            if outcome is not None:
                logger.error("reader worker %d did not start: %r", reader.proc.pid, outcome)
                self._kill(reader)
        logger.info("%d reader workers listening", self.alive)

    async def _spawn(self, cpu: int | None) -> _Reader:
        ours, theirs = channel_pair()
        # The reader binds itself, before it starts any thread (spoke.workers.cpus).
        placed = [] if cpu is None else ["--reader-cpu", str(cpu)]
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "spoke", *self._argv, *placed,
                "--reader-channel", str(theirs.fileno()),
                pass_fds=[theirs.fileno()], stdin=asyncio.subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        reader = _Reader(proc, asyncio.get_running_loop().create_future(), cpu=cpu)
        reader.channel = Channel(
            ours, receiving(partial(self._on_message, reader)), partial(self._on_close, reader)
        )
        self.readers.append(reader)
        self._send_snapshot(reader.channel)
        return reader

    async def _replace(self, gone: _Reader) -> None:
        """A reader died on its own: reap it and, after a pause (no crash loop at full
        speed), start another in its place."""
        await gone.proc.wait()
        self.readers.remove(gone)
        await asyncio.sleep(RESTART_PAUSE_S)
        if self._stopping:
            return
        reader = await self._spawn(gone.cpu)
        try:
            await asyncio.wait_for(asyncio.shield(reader.ready), READY_TIMEOUT_S)
        except (TimeoutError, ConnectionError) as exc:
            logger.error("reader worker %d did not start: %r", reader.proc.pid, exc)
            self._kill(reader)
            return
        self.restarts += 1
        logger.warning("reader worker %d replaces %d", reader.proc.pid, gone.proc.pid)

    async def sync(self) -> None:
        """Return once every reader has applied every change told so far (a purge's
        answer waits on this: no reader serves purged bytes after it). A reader that
        does not answer in time is stopped."""
        self._seq += 1
        loop = asyncio.get_running_loop()
        waits = []
        for reader in self.readers:
            if reader.channel.closed:
                continue
            reader.synced[self._seq] = loop.create_future()
            reader.channel.tell(messages.Sync(self._seq))
            waits.append((reader, reader.synced[self._seq]))
        for reader, waiter in waits:
            try:
                await asyncio.wait_for(waiter, SYNC_TIMEOUT_S)
            except (TimeoutError, ConnectionError):
                logger.error("reader worker %d did not confirm a change; stopping it",
                             reader.proc.pid)
                self._kill(reader)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        if self.readers and self.cache.watcher is self:
            self.cache.watcher = None
        for reader in self.readers:
            if reader.proc.returncode is None:
                reader.proc.send_signal(signal.SIGTERM)
        for reader in self.readers:
            try:
                await asyncio.wait_for(reader.proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                self._kill(reader)
                await reader.proc.wait()
            reader.channel.close()

    @property
    def alive(self) -> int:
        """Readers listening now."""
        return sum(1 for r in self.readers if r.listening and not r.channel.closed)

    # -- CacheWatcher ---------------------------------------------------------

    def manifest_fresh(self, path: str, manifest: Manifest, expires_at: float) -> None:
        self._tell(self._manifest_message(path, manifest, expires_at))

    def manifest_gone(self, path: str) -> None:
        self._tell(messages.ManifestGone(path))

    def chunk_added(self, name: str) -> None:
        expected = self.cache.expected(name)
        if expected is not None:
            self._tell(messages.ChunksAdded([messages.ToldChunk(name, expected)]))

    def chunk_gone(self, name: str) -> None:
        self._tell(messages.ChunksGone([name]))

    # -- plumbing ---------------------------------------------------------------

    def _tell(self, message: messages.Message) -> None:
        wire = messages.encode(message)
        for reader in self.readers:
            reader.channel.send(wire)

    @staticmethod
    def _manifest_message(
        path: str, manifest: Manifest, expires_at: float
    ) -> messages.ManifestFresh | messages.ManifestGone:
        wire = encode_manifest(manifest)
        if len(wire) > MAX_MIRRORED_MANIFEST_BYTES:
            return messages.ManifestGone(path)  # not mirrored: never let an older version stand
        return messages.ManifestFresh(path, wire, expires_at)

    def _send_snapshot(self, channel: Channel) -> None:
        manifests, _ = self.cache.snapshot()
        for path, manifest, expires_at in manifests:
            channel.tell(self._manifest_message(path, manifest, expires_at))
        chunks = [messages.ToldChunk(name, expected)
                  for name, expected in self.cache.expectations()]
        for i in range(0, len(chunks), SNAPSHOT_BATCH):
            channel.tell(messages.ChunksAdded(chunks[i:i + SNAPSHOT_BATCH]))

    def _on_message(self, reader: _Reader, message: messages.Message, fds: list[int]) -> None:
        if isinstance(message, messages.HandedOver) and len(fds) in (1, 2):
            self._adopt(fds[0], _received(message.received, fds), self.take_over)
            return
        if (isinstance(message, messages.S3HandedOver) and len(fds) in (1, 2)
                and self.s3 is not None):
            self._adopt(fds[0], _received(message.received, fds), self.s3.take_over)
            return
        for fd in fds:
            os.close(fd)
        match message:
            case messages.HitsCounted(hits, served, counts, total, paths):
                self.cache.count_hits_elsewhere(hits, served)
                if counts:
                    self.latency["hit"].merge(counts, total)
                for path in paths:
                    self.cache.revalidate(path)  # the reader's copy must not expire
            case messages.S3Counted(requests, counts, total) if self.s3 is not None:
                self.s3.stats.requests.update(requests)
                if counts:
                    self.s3.stats.read_latency["hit"].merge(counts, total)
            case messages.HangUps(clients):  # for /metrics here
                self.front.hangups += clients
            case messages.ChunksVerified(files, nbytes):
                self.cache.stats.chunks_verified += files
                self.cache.stats.bytes_verified += nbytes
            case messages.ChunksSuspect(names):
                for name in names:
                    self._spawn_task(self.cache.recheck(name))
            case messages.Synced(seq):
                waiter = reader.synced.pop(seq, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            case messages.ManifestWanted(path, offset):
                # With where the read starts: its first chunk goes with the manifest.
                self.cache.fetch_early(path, offset)
                self._spawn_task(self._tell_manifest(reader, path))
            case messages.Ready():
                reader.listening = True
                if not reader.ready.done():
                    reader.ready.set_result(None)
            case _:
                logger.error("unexpected message from reader worker %d: %r",
                             reader.proc.pid, type(message).__name__)

    async def _tell_manifest(self, reader: _Reader, path: str) -> None:
        """A reader wants ``path``'s manifest: fresh from here, else from the hub (all
        readers hear of it then), else "unknown" (the reader hands the read over)."""
        manifest = self.cache.fresh_manifest(path)
        if manifest is None:
            try:
                manifest, stale = await self.cache.manifest(path)
            except Exception as exc:  # the owner answers the read, error and all
                logger.debug("no manifest of %s for a reader worker: %s", path, exc)
                stale = True
            if not stale:
                return  # told to every reader by the cache's watcher
        else:
            expires_at = time.monotonic() + self.cache.manifest_time_left(path)
            reader.channel.tell(self._manifest_message(path, manifest, expires_at))
            return
        reader.channel.tell(messages.ManifestUnknown(path))

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A reader's errand is over; its error (a replacement that could not start)
        is counted and logged as the cache's other background errors are."""
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.cache.background_errors.record("reader-pool", error)

    def _adopt(
        self, fd: int, received: bytes, take_over: Callable[[bytes], asyncio.Protocol]
    ) -> None:
        sock = socket.socket(fileno=fd)
        self.handed_over += 1
        loop = asyncio.get_running_loop()
        task = loop.create_task(
            loop.connect_accepted_socket(lambda: take_over(received), sock)
        )
        self._tasks.add(task)
        task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("could not take over a connection: %s", task.exception())

    def _on_close(self, reader: _Reader) -> None:
        for waiter in reader.synced.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("reader worker gone"))
        reader.synced.clear()
        if not reader.ready.done():
            reader.ready.set_exception(ConnectionError("reader worker gone"))
        if not self._stopping and reader.listening and not reader.killed:
            logger.error("lost touch with reader worker %d; replacing it", reader.proc.pid)
            self._spawn_task(self._replace(reader))

    def _kill(self, reader: _Reader) -> None:
        """Stop a reader now (reaped by :meth:`stop`); its connections are cut."""
        reader.killed = True
        if reader.proc.returncode is None:
            reader.proc.kill()
        reader.channel.close()


READERS = web.AppKey("readers", ReaderPool)


def readers_companion(
    app: web.Application, count: int, argv: Sequence[str],
    cache_key: web.AppKey[ChunkCache], latency_key: web.AppKey[dict[str, Histogram]],
    cpus: Sequence[int] | None = None,
) -> Companion:
    """A :data:`service.runner.Companion` running ``count`` reader workers beside ``app``
    (whose :data:`READERS` pool, set before it starts, they fill)."""

    @contextlib.asynccontextmanager
    async def companion(
        runner: web.AppRunner, port: int, extra: Sequence[StartedSite]
    ) -> AsyncIterator[None]:
        take_over = _taking_over(runner)
        s3 = None
        for site in extra:
            if site.name == "s3":  # spoke.__main__'s S3 front end
                s3 = S3Port(site.port, _taking_over(site.runner), app[S3_STATS])
        pool = app[READERS]
        try:
            await pool.start(app[cache_key], app[latency_key], take_over, count, argv, port, cpus,
                             app.get(FRONT), s3)
            yield
        finally:
            await pool.stop()

    return companion


def _taking_over(runner: web.AppRunner) -> Callable[[bytes], asyncio.Protocol]:
    take_over: Callable[[bytes], asyncio.Protocol] | None = getattr(
        runner.server, "taking_over", None)
    if take_over is None:
        raise RuntimeError("reader workers need the fast path's server")
    return take_over


def _received(inline: bytes, fds: list[int]) -> bytes:
    """A handed-over connection's bytes read so far: inline, or beside the message in a
    memory file (its second descriptor) when there were too many for one."""
    return bytes_from_fd(fds[1]) if len(fds) == 2 else inline
