"""A reader worker's process: plain cache hits on the shared port, the rest to the owner.

See :mod:`spoke.workers.pool` for the design. This side keeps a :class:`Mirror` of what
the owner holds, answers plain reads from the chunk files, and hands every other
connection over. It exits when told to (SIGTERM) or when the owner is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from protocol.errors import ProtocolError
from protocol.http1 import RequestHead
from protocol.manifest import Manifest, decode_manifest
from protocol.ranges import ByteRange
from service.background import ErrorCounts, run_every
from service.fast import FastConnection, FastServer, Reply
from service.limits import ConnectionLimits
from service.metrics import Histogram
from spoke.cache.counters import SpokeStats
from spoke.cache.early import early_offset
from spoke.cache.engine import ChunkGone
from spoke.cache.integrity import ChunkChecker, Expected
from spoke.cache.open_chunks import OpenChunks
from spoke.cache.store import BadChunkFile, ChunkStore
from spoke.config import SpokeConfig
from spoke.serve.plain import OBJECTS, PlainReads
from spoke.serve.stats import READ_LATENCY_BUCKETS_S
from spoke.workers import messages
from spoke.workers.channel import MAX_INLINE_BYTES, Channel, bytes_in_fd, receiving
from spoke.workers.s3 import serve_s3

T = TypeVar("T")
logger = logging.getLogger(__name__)

REPORT_INTERVAL_S = 0.05
# How long a plain read waits for the owner to say what a path is (a hub round trip
# when it does not know either) before the connection goes to the owner anyway.
MANIFEST_WAIT_S = 2.0
MAX_REPORTED_NAMES = 1000  # per message, to stay well inside one packet
SHUTDOWN_GRACE_S = 5.0


class Mirror:
    """What the owner holds, as far as it has said; a :class:`spoke.serve.plain.HitSource`.

    Also what this process served, the chunk files it hashed and those it found bad,
    until :meth:`report` sends it to the owner.
    """

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self.manifests: dict[str, tuple[Manifest, float]] = {}
        self._asked: dict[str, asyncio.Future[None]] = {}
        self.names: dict[str, Expected] = {}  # what each chunk's file must hold
        self.stats = SpokeStats()  # only the chunk files hashed, reported as they grow
        self._reported = (0, 0)
        self.suspects: set[str] = set()
        self._fds = OpenChunks(ChunkChecker(store, self.names.get, self.stats))
        self.hits: dict[str, int] = {}
        self.paths_read: set[str] = set()
        self.served_bytes = 0
        self.latency = Histogram(READ_LATENCY_BUCKETS_S)

    def apply(self, message: messages.Message) -> None:
        match message:
            case messages.ManifestFresh(path, wire, expires_at):
                self.manifests[path] = (decode_manifest(wire), expires_at)
                self._answered(path)
            case messages.ManifestGone(path):
                self.manifests.pop(path, None)
                self._answered(path)
            case messages.ManifestUnknown(path):
                self._answered(path)
            case messages.ChunksAdded(chunks):
                for name, expected in chunks:
                    self.names[name] = expected
            case messages.ChunksGone(names):
                for name in names:
                    self.forget(name)
            case _:
                logger.error("unexpected message from the owner: %r", type(message).__name__)

    def manifest(self, path: str) -> Manifest | None:
        """``path``'s manifest if the owner holds it fresh."""
        item = self.manifests.get(path)
        if item is None or item[1] <= time.monotonic():
            return None
        return item[0]

    async def ask(
        self, path: str, channel: Channel, offset: int | None = None
    ) -> Manifest | None:
        """``path``'s manifest, asked of the owner (which may ask the hub), or None.
        ``offset``: where the read wanting it starts, for the owner to fetch that
        chunk alongside the manifest if it holds nothing of the object
        (:mod:`spoke.cache.early`); the read comes to the owner then."""
        asked = self._asked.get(path)
        if asked is None:
            asked = self._asked[path] = asyncio.get_running_loop().create_future()
            channel.tell(messages.ManifestWanted(path, offset))
        try:
            await asyncio.wait_for(asyncio.shield(asked), MANIFEST_WAIT_S)
        except TimeoutError:
            self._asked.pop(path, None)
        return self.manifest(path)

    def _answered(self, path: str) -> None:
        asked = self._asked.pop(path, None)
        if asked is not None and not asked.done():
            asked.set_result(None)

    def is_resident(self, name: str) -> bool:
        return name in self.names

    def read_hit(self, name: str, start: int, stop: int) -> bytes:
        data = self.peek(name, start, stop)
        self.hits[name] = self.hits.get(name, 0) + 1
        return data

    def peek(self, name: str, start: int, stop: int) -> bytes:
        """:meth:`read_hit`'s bytes, not counted as a hit (a check made once per chunk)."""
        data = self._checked(name, self._fds.pread, name, start, stop)
        if len(data) != stop - start:  # evicted: the owner will say so, or answer
            self.forget(name)
            raise ChunkGone(name)
        return data

    def view_hit(self, name: str, start: int, stop: int) -> memoryview:
        # :meth:`_file_hit` written out: this is every small plain read's call.
        try:
            view = self._fds.view(name, start, stop)
        except FileNotFoundError as exc:
            self._lost(name, exc)
        self.hits[name] = self.hits.get(name, 0) + 1
        return view

    def forget(self, name: str) -> None:
        self.names.pop(name, None)  # the owner finds out when it reads it, or answers
        self._fds.discard(name)

    def fd_hit(self, name: str, need_bytes: int) -> int:
        try:
            fd = self._fds.fd(name, need_bytes)
        except FileNotFoundError as exc:
            self._lost(name, exc)
        self.hits[name] = self.hits.get(name, 0) + 1
        return fd

    def open_hit(self, name: str, need_bytes: int) -> int:
        # A descriptor of its own: the open chunks' may be closed while it is sent.
        return os.dup(self.fd_hit(name, need_bytes))

    def _file_hit(self, name: str, get: Callable[..., T], *args: Any) -> T:
        """``get(*args)`` on chunk ``name``'s file (:meth:`_checked`), counted as a hit."""
        got = self._checked(name, get, *args)
        self.hits[name] = self.hits.get(name, 0) + 1
        return got

    def _checked(self, name: str, get: Callable[..., T], *args: Any) -> T:
        """``get(*args)`` on chunk ``name``'s file; ChunkGone, the chunk forgotten here
        (the owner will say so, or answer), when the file is gone, torn or bad (then the
        owner is told, to check it and drop it)."""
        try:
            return get(*args)
        except FileNotFoundError as exc:
            self._lost(name, exc)

    def _lost(self, name: str, exc: FileNotFoundError) -> NoReturn:
        if isinstance(exc, BadChunkFile):
            self.suspects.add(name)
        self.forget(name)
        raise ChunkGone(name) from None

    def served(self, manifest: Manifest, ranges: list[ByteRange]) -> None:
        self.served_bytes += sum(r.length for r in ranges)

    def report(self) -> list[messages.ToOwner]:
        """What was served since the last report (``HitsCounted``, the bytes and
        latencies in the first), the chunk files hashed since (``ChunksVerified``)
        and those found bad (``ChunksSuspect``): :mod:`spoke.workers.messages`."""
        return [*self._checks(), *self._served()]

    def _checks(self) -> list[messages.ToOwner]:
        reports: list[messages.ToOwner] = []
        verified = (self.stats.chunks_verified, self.stats.bytes_verified)
        if verified != self._reported:
            reports.append(messages.ChunksVerified(verified[0] - self._reported[0],
                                                   verified[1] - self._reported[1]))
            self._reported = verified
        suspects = list(self.suspects)
        self.suspects.clear()
        reports += [messages.ChunksSuspect(suspects[i:i + MAX_REPORTED_NAMES])
                    for i in range(0, len(suspects), MAX_REPORTED_NAMES)]
        return reports

    def _served(self) -> list[messages.HitsCounted]:
        if not self.hits and not self.latency.count:
            return []
        names, paths = list(self.hits.items()), list(self.paths_read)
        reports = [
            messages.HitsCounted(dict(names[i:i + MAX_REPORTED_NAMES]), 0, [], 0.0,
                                 paths[i:i + MAX_REPORTED_NAMES])
            for i in range(0, max(1, len(names), len(paths)), MAX_REPORTED_NAMES)
        ]
        reports[0] = reports[0]._replace(served_bytes=self.served_bytes,
                                         latency_counts=self.latency.counts,
                                         latency_sum=self.latency.sum)
        self.hits, self.paths_read, self.served_bytes = {}, set(), 0
        self.latency = Histogram(READ_LATENCY_BUCKETS_S)
        return reports

    def close(self) -> None:
        self._fds.close()


class ReaderReads:
    """The reader's :data:`service.fast.FastHandler`: plain hits, else None (handed over)."""

    def __init__(self, mirror: Mirror, channel: Channel, checks_tokens: bool) -> None:
        self.mirror = mirror
        self.channel = channel
        # With tokens on, every read carries one (not a plain read) or gets a 401:
        # the owner's to answer either way.
        self.checks_tokens = checks_tokens
        self.plain = PlainReads()

    def __call__(
        self, head: RequestHead, conn: FastConnection
    ) -> Reply | Awaitable[Reply | None] | None:
        if self.checks_tokens or not head.target.startswith(OBJECTS) or \
                not self.plain.is_plain(head):
            return None
        try:
            path = self.plain.object_path(head.target)
        except ProtocolError:
            return None
        started = time.perf_counter()
        manifest = self.mirror.manifest(path)
        if manifest is None:
            return self._once_known(head, conn, path, started)
        return self._answer(head, conn, path, manifest, started)

    async def _once_known(
        self, head: RequestHead, conn: FastConnection, path: str, started: float
    ) -> Reply | None:
        offset = early_offset(head.method, head.headers)
        manifest = await self.mirror.ask(path, self.channel, offset)
        if manifest is None:
            return None
        reply = self._answer(head, conn, path, manifest, started)
        return reply if reply is None or isinstance(reply, Reply) else await reply

    def _answer(
        self, head: RequestHead, conn: FastConnection, path: str, manifest: Manifest,
        started: float,
    ) -> Reply | Awaitable[Reply | None] | None:
        reply = self.plain.answer(self.mirror, conn, head, path, manifest)
        if reply is None:
            large = self.plain.answer_large(self.mirror, conn, head, path, manifest)
            if large is None or isinstance(large, Reply):
                if large is not None:
                    self._observe(path, started)
                return large
            return self._observed(large, path, started)
        self._observe(path, started)
        return reply

    async def _observed(
        self, answering: Awaitable[Reply | None], path: str, started: float
    ) -> Reply | None:
        reply = await answering
        if reply is not None:
            self._observe(path, started)
        return reply

    def _observe(self, path: str, started: float) -> None:
        self.mirror.latency.observe(time.perf_counter() - started)
        self.mirror.paths_read.add(path)


class HandOver(asyncio.Protocol):
    """Takes a connection the reader declines and passes it, and the bytes read of it
    so far, to the owner (an ``Adopter`` for :class:`service.fast.FastServer`). Flow
    control needs nothing of it: it waits for the write buffer to empty itself."""

    def __init__(
        self, channel: Channel, limits: ConnectionLimits,
        message: Callable[[bytes], messages.ToOwner] = messages.HandedOver,
    ) -> None:
        self.channel = channel
        self.limits = limits
        self.message = message  # which port's connection the owner is given
        self._transport: asyncio.Transport | None = None
        self._client = ""
        self._received = bytearray()

    def adopt(self, transport: asyncio.Transport, client: str) -> None:
        self._transport, self._client = transport, client
        transport.pause_reading()  # what arrives from now on is the owner's to read
        asyncio.get_running_loop().call_soon(self._pass)

    def data_received(self, data: bytes) -> None:
        self._received += data

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        if self._client:
            self.limits.close(self._client, self)  # counted by the fast path when it arrived
            self._client = ""

    def idle_at(self) -> float | None:
        return None  # never idle: on its way to the owner, which answers what it holds

    def close_idle(self) -> None:
        if self._transport is not None:  # never chosen (never idle); closed all the same
            self._transport.abort()

    def _pass(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if transport.get_write_buffer_size():
            # An answer is still going out: the owner's must not overtake it.
            asyncio.get_running_loop().call_later(0.002, self._pass)
            return
        if self.channel.closed:
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        fds = [os.dup(sock.fileno())]
        received = bytes(self._received)
        if len(received) > MAX_INLINE_BYTES:  # a body read with the head: beside the message
            fds.append(bytes_in_fd(received))
            received = b""
        self.channel.tell(self.message(received), fds)
        # Closing our descriptor leaves the connection open: the owner holds it now.
        transport.close()


async def run_reader(config: SpokeConfig, channel_fd: int) -> None:
    """Serve as a reader worker until SIGTERM or the owner goes away."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    mirror = Mirror(ChunkStore(config.cache_dir))
    channel: Channel

    def on_message(message: messages.Message, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        if isinstance(message, messages.Sync):
            channel.tell(messages.Synced(message.seq))  # every change before it is applied
        else:
            mirror.apply(message)

    channel = Channel(socket.socket(fileno=channel_fd), receiving(on_message), stop.set)
    limits = ConnectionLimits(config.max_connections_per_client, config.header_timeout_s)
    server = FastServer(
        ReaderReads(mirror, channel, checks_tokens=config.auth_secret_file is not None),
        lambda: HandOver(channel, limits), limits, idle_timeout_s=config.keepalive_timeout_s,
    )
    listener = await loop.create_server(
        server, config.host, config.port, reuse_address=True, reuse_port=True
    )
    s3 = await serve_s3(config, ReaderReads(mirror, channel, checks_tokens=False),
                        lambda: HandOver(channel, limits, messages.S3HandedOver), limits)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    channel.tell(messages.Ready())

    def report() -> None:
        for message in mirror.report():
            channel.tell(message)
        if server.front.hangups:
            channel.tell(messages.HangUps(server.front.hangups))
            server.front.hangups = 0
        if s3 is not None:
            for message in s3[0].report():
                channel.tell(message)
            if s3[1].front.hangups:
                channel.tell(messages.HangUps(s3[1].front.hangups))
                s3[1].front.hangups = 0

    async def report_step() -> None:
        report()

    # Logged here (this process has no /metrics of its own); the loop goes on.
    errors = ErrorCounts("background task", ["report"], logger)
    reporter = asyncio.create_task(run_every("report", REPORT_INTERVAL_S, report_step, errors))
    try:
        await stop.wait()
    finally:
        reporter.cancel()
        listener.close()
        if s3 is not None:
            s3[2].close()
            await s3[1].shutdown(SHUTDOWN_GRACE_S)
        await server.shutdown(SHUTDOWN_GRACE_S)
        report()
        channel.close()
        mirror.close()
