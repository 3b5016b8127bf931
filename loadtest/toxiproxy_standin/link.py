"""The data plane: a proxied connection's two links, each source → toxics → destination."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence

from loadtest.toxiproxy_standin.toxics import (
    DOWNSTREAM,
    RUNTIMES,
    UPSTREAM,
    Chunk,
    Outlet,
    Runtime,
    Toxic,
)
from service.buffers import has_views

logger = logging.getLogger(__name__)

# Toxiproxy's io.Copy moves 32 KiB at a time; here a chunk is whatever one read of
# the socket returned (up to uvloop's 256 KiB), because Python pays per chunk. Data
# a link passes on is gathered and written with one system call once it has this
# much, or before the link waits for anything.
FLUSH_BYTES = 1 << 20
# Sockets are read into buffers of this size (the most uvloop reads at once). A view
# holds its whole buffer, so reads smaller than COPY_BELOW_BYTES are copied out (the
# buffer serves again at once): memory held is at most 4x the bytes in flight.
RECEIVE_BYTES = 256 << 10
COPY_BELOW_BYTES = 64 << 10
# Buffers lent and still viewed beyond this many are left to the garbage collector.
MAX_LENT_BUFFERS = 1024
# A destination socket's transport buffers this much before the link waits for it.
WRITE_HIGH_WATER = 1 << 20
# A link stops reading its source once this many bytes wait in its buffer. It must
# cover the bandwidth-delay product of a latency toxic (e.g. 60 ms at 500 MB/s =
# 30 MB); bounding by bytes rather than by chunk count keeps small-packet traffic
# from being throttled by the buffer instead of by the toxic.
BUFFER_LIMIT = 32 * 1024 * 1024


class _ChunkBuffer:
    """A FIFO of chunks bounded by bytes; ``None`` marks the end of the stream.

    Filled by a protocol's ``data_received`` (which cannot wait): above the limit
    it pauses its source, and resumes it once the pump has taken the buffer below.
    """

    def __init__(
        self, limit: int, pause_source: Callable[[], None], resume_source: Callable[[], None]
    ) -> None:
        self._items: collections.deque[Chunk | None] = collections.deque()
        self._bytes = 0
        self._limit = limit
        self._discarding = False
        self._source_paused = False
        self._pause_source = pause_source
        self._resume_source = resume_source
        self._ready: asyncio.Future[None] | None = None

    def put(self, chunk: Chunk) -> None:
        if self._discarding:
            return
        self._items.append(chunk)
        self._bytes += len(chunk.data)
        if self._bytes >= self._limit and not self._source_paused:
            self._source_paused = True
            self._pause_source()
        self._wake()

    def put_eof(self) -> None:
        self._items.append(None)
        self._wake()

    def get_nowait(self) -> Chunk | bool | None:
        """The next item, or False when there is none yet."""
        if not self._items:
            return False
        item = self._items.popleft()
        if item is not None:
            self._bytes -= len(item.data)
            if self._source_paused and self._bytes < self._limit:
                self._source_paused = False
                self._resume_source()
        return item

    async def get(self) -> Chunk | None:
        while True:
            item = self.get_nowait()
            if item is not False:
                assert not isinstance(item, bool)
                return item
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready

    def discard(self) -> None:
        """Nobody will read any more: drop what is queued, never block the reader."""
        self._discarding = True
        self._items.clear()
        self._bytes = 0
        if self._source_paused:
            self._source_paused = False
            self._resume_source()

    def _wake(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_result(None)


class ReceiveBuffers:
    """Buffers sockets read into, each used again once nothing views its bytes.

    The loop reads straight into one (a buffered protocol), and the bytes travel
    the link as a view of it: no copy out of the loop's own read buffer, which for
    a plain protocol is a copy of every byte proxied. A buffer is lent for one read
    and taken again, oldest first, once no view of it is alive (its bytes were
    written, or dropped; :func:`service.buffers.has_views`).
    """

    def __init__(self) -> None:
        self._lent: collections.deque[bytearray] = collections.deque()

    def take(self) -> bytearray:
        if self._lent and not has_views(self._lent[0]):
            buffer = self._lent.popleft()
        else:
            buffer = bytearray(RECEIVE_BYTES)
            if len(self._lent) >= MAX_LENT_BUFFERS:
                self._lent.popleft()  # still viewed: freed when its views are
        self._lent.append(buffer)
        return buffer


class End(asyncio.BufferedProtocol):
    """One socket of a proxied connection: the source of one link, the destination of
    the other. A buffered protocol rather than asyncio streams: what the loop reads
    goes to the link as it is (no copies through a StreamReader's buffer, nor out of
    the loop's read buffer)."""

    buffers = ReceiveBuffers()

    def __init__(self, on_made: Callable[[End], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self._on_made = on_made
        self._sink: _ChunkBuffer | None = None
        self._early: list[Chunk | None] = []  # what arrived before the link existed
        self._loop = asyncio.get_running_loop()
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._lost = False
        self._receiving = bytearray()

    # ---- asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> bytearray:
        self._receiving = self.buffers.take()
        return self._receiving

    def buffer_updated(self, nbytes: int) -> None:
        received = memoryview(self._receiving)[:nbytes]
        # Small reads (API calls, requests) are copied: a view would hold a whole buffer.
        self._received(received if nbytes >= COPY_BELOW_BYTES else bytes(received))

    def _received(self, data: bytes | memoryview) -> None:
        chunk = Chunk(data, self._loop.time())
        if self._sink is not None:
            self._sink.put(chunk)
            return
        self._early.append(chunk)
        if sum(len(c.data) for c in self._early if c is not None) >= BUFFER_LIMIT:
            self.pause_reading()

    def eof_received(self) -> bool:
        self._end_of_stream()
        return True  # keep the socket open for the other direction

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:  # e.g. the peer reset: an end of stream like any other
            logger.debug("connection lost: %s", exc)
        self._lost = True
        self._end_of_stream()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()

    # ---- as a source

    def feed(self, sink: _ChunkBuffer) -> None:
        """Send what is read from now on (and what came before) to ``sink``."""
        self._sink = sink
        early, self._early = self._early, []
        for chunk in early:
            if chunk is None:
                sink.put_eof()
            else:
                sink.put(chunk)
        self.resume_reading()

    def _end_of_stream(self) -> None:
        if self._sink is not None:
            self._sink.put_eof()
        else:
            self._early.append(None)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # ---- as a destination

    def is_closing(self) -> bool:
        return self._lost or self.transport is None or self.transport.is_closing()

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        if self.is_closing():
            raise ConnectionResetError("destination closed")
        assert self.transport is not None
        if len(parts) == 1:
            self.transport.write(parts[0])
        else:
            self.transport.writelines(parts)

    async def drain(self) -> None:
        while self._writing_paused and not self._lost:
            self._drained = self._loop.create_future()
            await self._drained
        if self._lost:
            raise ConnectionResetError("destination closed")

    def _wake_writer(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self, *, rst: bool = False) -> None:
        if self.transport is None:
            return
        if rst:
            # SO_LINGER {on, 0 s} makes close() send a TCP RST instead of a FIN.
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


class Link:
    """One direction of a proxied connection: source → toxics → destination."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        source: End,
        dest: End,
        toxics: Sequence[Toxic],
    ) -> None:
        self.connection = connection
        self.stream = stream
        self._source = source
        self._dest = dest
        self._loop = asyncio.get_running_loop()
        self._buffer = _ChunkBuffer(BUFFER_LIMIT, source.pause_reading, source.resume_reading)
        self._runtimes: list[Runtime] = []
        self._waiters: set[asyncio.Future[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump_task: asyncio.Task[None] | None = None
        self._closing = False
        self._done = asyncio.Event()
        # Written data not yet handed to the socket: writes are gathered while the
        # pump has more at hand, and go out in one system call before it waits.
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        for toxic in toxics:
            self.attach(toxic, live=False)

    # ---- toxic management (called by the proxy on API changes)

    def attach(self, toxic: Toxic, *, live: bool = True) -> None:
        """Add ``toxic`` at the end of the chain; ``live`` when the link already runs."""
        if self._closing:
            return
        runtime = RUNTIMES[toxic.type](toxic, self)
        # Toxiproxy interrupts the toxic before the new one and runs it again: it
        # rolls its toxicity again and starts over (a timeout's countdown too).
        if live and self._runtimes:
            self._runtimes[-1].updated()
        self._runtimes.append(runtime)
        runtime.attached()
        self.notify()

    def update(self, name: str) -> None:
        for runtime in self._runtimes:
            if runtime.toxic.name == name:
                runtime.updated()
        self.notify()

    def detach(self, name: str) -> None:
        for index, runtime in enumerate(self._runtimes):
            if runtime.toxic.name == name:
                del self._runtimes[index]
                runtime.detached(index)
                if index > 0 and not self._closing:  # its predecessor runs again, as on attach
                    self._runtimes[index - 1].updated()
                break
        self.notify()

    def notify(self) -> None:
        """Wake a sleeping toxic so it re-reads its (possibly changed) settings."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a toxic change (``notify``) ends it early."""
        self._flush()
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.add(waiter)
        timer = self._loop.call_later(seconds, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)

    # ---- lifecycle

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("link %s task failed", self.stream, exc_info=task.exception())
            self.connection.kill()

    async def run(self) -> None:
        self._pump_task = self._spawn(self._pump())
        self._source.feed(self._buffer)
        try:
            await self._done.wait()
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop at once: no flushing (the connection is being killed or is done)."""
        self._closing = True
        self._out.clear()
        self._buffer.discard()
        for runtime in self._runtimes:
            runtime.stopped()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self._done.set()

    async def _pump(self) -> None:
        try:
            while not self._closing:
                item = self._buffer.get_nowait()
                if item is False:
                    self._flush()  # nothing more at hand: send what was gathered
                    item = await self._buffer.get()
                assert not isinstance(item, bool)
                chain = tuple(self._runtimes)
                if item is None:
                    await self.finish_through(chain)
                    return
                await self.through(chain, 0, item)
        except OSError as exc:
            # The destination broke: nothing more can be delivered on this link.
            logger.debug("link %s destination failed: %s", self.stream, exc)
            self._dest.abort()
            self._closing = True
            self._out.clear()
            self._buffer.discard()
            self._done.set()

    async def through(self, chain: tuple[Runtime, ...], index: int, chunk: Chunk) -> None:
        """Run ``chunk`` through ``chain[index:]`` and write what comes out."""
        while index < len(chain) and not chain[index].engaged:
            index += 1
        if self._closing:
            return
        if index == len(chain):
            await self._write(chunk.data)
            return
        await chain[index].pipe(chunk, Outlet(self, chain, index + 1))

    async def _write(self, data: bytes | memoryview) -> None:
        if self._dest.is_closing():
            raise ConnectionResetError("destination closed")
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
            await self._dest.drain()

    def _flush(self) -> None:
        if not self._out or self._closing:
            return
        parts, self._out, self._out_bytes = self._out, [], 0
        self._dest.writelines(parts)

    async def finish_through(self, chain: Sequence[Runtime]) -> None:
        """End of stream: let ``chain`` see it (slow_close waits), then close."""
        if self._closing:
            return
        self._flush()
        self._closing = True
        self._buffer.discard()
        for runtime in chain:
            if runtime.engaged:
                await runtime.eof()
        # Toxiproxy closes the destination fully (no half-close); the other link
        # then sees EOF on the same socket and closes its own destination.
        self._dest.close()
        self._done.set()

    def close_from(self, index: int) -> None:
        """End the stream at chain position ``index`` from outside the pump (timers, API)."""
        if self._closing:
            return
        rest = tuple(self._runtimes[index:])
        if self._pump_task is not None:
            self._pump_task.cancel()
        self._spawn(self.finish_through(rest))

    def close_after(self, runtime: Runtime) -> None:
        if runtime in self._runtimes:
            self.close_from(self._runtimes.index(runtime) + 1)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(
        self, toxics_for: Callable[[str], list[Toxic]], client: End, upstream: End
    ) -> None:
        self._ends = (client, upstream)
        self.links = {
            UPSTREAM: Link(self, UPSTREAM, client, upstream, toxics_for(UPSTREAM)),
            DOWNSTREAM: Link(self, DOWNSTREAM, upstream, client, toxics_for(DOWNSTREAM)),
        }

    async def run(self) -> None:
        try:
            await asyncio.gather(*(link.run() for link in self.links.values()))
        finally:
            for end in self._ends:
                end.close()

    def kill(self, *, rst: bool = False) -> None:
        """Drop both sockets now (RST if ``rst``, else close) and stop both links."""
        for link in self.links.values():
            link.cancel()
        for end in self._ends:
            end.abort(rst=rst)

    def reset(self) -> None:
        logger.debug("resetting connection (reset_peer)")
        self.kill(rst=True)
