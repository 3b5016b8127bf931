"""A connection protocol that answers plain reads itself and the rest through aiohttp.

aiohttp's request machinery costs several times what nginx spends on a whole cache
hit. For a 64 KiB sample read from the page cache that overhead is the read. A
:class:`FastProtocol` reads each request head with
:mod:`protocol.http1` and offers it to the app's :data:`FastHandler`, which answers
on the connection directly (synchronously when the bytes are at hand) or declines.
On the first decline, the connection and every byte not yet answered go to
aiohttp's own protocol for good, so anything unusual (other routes, bodies,
malformed requests, auth failures, limits) gets exactly the answer it always got.

Connection limits (a client at its cap gets its idlest connection closed for a new
one), the header timeout, the keep-alive timeout, request ids and the access log
apply here as they do under aiohttp.
"""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import functools
import logging
import os
import socket
import sys
import termios
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol, cast

from aiohttp import web

from protocol.conditional import http_date
from protocol.headers import REQUEST_ID_HEADER, SERVER
from protocol.http1 import (
    MAX_REQUEST_HEAD_BYTES,
    RequestHead,
    could_start_plain_read,
    parse_request_head,
)
from service import logs
from service.front import FrontStats

logger = logging.getLogger(__name__)

# Requests a client pipelines beyond this wait in the kernel, not in our memory.
MAX_BUFFERED_BYTES = 256 << 10
# Flow control: stop writing at HIGH; resume only once the socket took everything,
# so sendfile (which bypasses the transport's buffer) never overtakes buffered bytes.
WRITE_HIGH_WATER = 256 << 10
# A request's fields by lower-case name, read without Headers' case folding.
_REQUEST_ID_FIELD = REQUEST_ID_HEADER.lower()
_field = dict.get
# How often idle connections are looked for; at most the keep-alive timeout itself,
# so a connection is closed within twice that.
IDLE_SWEEP_S = 5.0


# Not frozen: a frozen dataclass's __init__ costs several times a plain one's, and
# one is made per answer.
@dataclass(slots=True)
class Reply:
    """How a request was answered, for the access log."""

    status: int
    body_bytes: int
    x_cache: str | None = None


# None: not for the fast path (aiohttp takes the connection). A Reply: answered.
# An awaitable: answering; the connection reads no further request until it is done.
# It may still decline with None, having sent nothing: the request then goes to aiohttp.
FastHandler = Callable[
    [RequestHead, "FastConnection"], Reply | Awaitable[Reply | None] | None
]


FAST: web.AppKey[FastHandler] = web.AppKey("fast_handler")


class Tracked(Protocol):
    """A connection as the per-client cap sees it: idle or not, and closable when idle."""

    def idle_at(self) -> float | None:
        """When (``time.monotonic()``) the connection went idle between requests; None
        while it is busy: a request being read or answered, or an answer still going out."""

    def close_idle(self) -> None:
        """Close the connection, idle now, to make room for another of its client."""


def has_unread_bytes(transport: asyncio.BaseTransport) -> bool:
    """Whether the kernel holds bytes of the connection not read yet: a request may be
    arriving, so the connection is not idle (closing it would lose that request)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4))
    except OSError:
        return False
    return int.from_bytes(waiting, sys.byteorder) > 0


class Limits(Protocol):
    header_timeout_s: float
    header_timeouts: int
    keepalive_timeouts: int

    def open(self, client: str, conn: Tracked) -> bool: ...

    def close(self, client: str, conn: Tracked) -> None: ...

    def moved(self, client: str, old: Tracked, new: Tracked) -> None: ...


class Adopter(Tracked, Protocol):
    """aiohttp's connection protocol, able to take over a connection already counted."""

    def adopt(self, transport: asyncio.Transport, client: str) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def pause_writing(self) -> None: ...


class FastServer:
    """Makes :class:`FastProtocol` connections and tracks them until shutdown."""

    def __init__(
        self, handler: FastHandler, slow: Callable[[], Adopter], limits: Limits,
        idle_timeout_s: float, front: FrontStats | None = None,
    ) -> None:
        self.handler = handler
        # A handler with ``takes_queries`` set decodes targets itself: it is offered
        # those with percent-encodings and a query too.
        self.with_query = bool(getattr(handler, "takes_queries", False))
        # One with ``request_id_header`` set names its front end's own field for the
        # request id (S3's x-amz-request-id): every head written here carries it too.
        self.request_id_alias: str | None = getattr(handler, "request_id_header", None)
        self._protocol = FastProtocol if self.request_id_alias is None else _AliasedIdProtocol
        self.slow = slow
        self.limits = limits
        self.idle_timeout_s = idle_timeout_s
        self.front = front or FrontStats()
        self.connections: set[FastProtocol] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def __call__(self, received: bytes = b"") -> FastProtocol:
        """A connection's protocol; ``received``: bytes of it already read elsewhere (a
        connection handed over by another process), answered first."""
        if self._sweeper is None and self.idle_timeout_s > 0:
            self._sweeper = asyncio.get_running_loop().call_later(
                min(IDLE_SWEEP_S, self.idle_timeout_s), self._sweep
            )
        protocol = self._protocol(self)
        protocol._buf += received
        return protocol

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            idle_at = conn.idle_at()
            if idle_at is not None and now - idle_at > self.idle_timeout_s:
                self.limits.keepalive_timeouts += 1
                conn.close()
        self._sweeper = asyncio.get_running_loop().call_later(
            min(IDLE_SWEEP_S, self.idle_timeout_s), self._sweep
        )

    async def shutdown(self, grace_s: float) -> None:
        """Let requests being answered finish (up to ``grace_s``), then close everything."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self.connections):
            conn.close()


class FastConnection(Protocol):
    """What a :data:`FastHandler` may do with the connection."""

    request_id: str
    client: str

    @property
    def can_sendfile(self) -> bool: ...

    def write(self, data: bytes | memoryview) -> None: ...

    def writelines(self, parts: Sequence[bytes | memoryview]) -> None: ...

    def head(self, status: int, headers: list[tuple[str, str]], keep_alive: bool) -> bytes: ...

    def head_end(self, keep_alive: bool) -> str: ...

    async def drain(self) -> None: ...

    async def sendfile(self, fd: int, offset: int, count: int) -> bool: ...

    def send_now(self, head: bytes, pieces: list[tuple[int, int, int]]) -> bool: ...

    def sendfile_now(self, head: bytes, fd: int, offset: int, count: int) -> int: ...

    def socket_copy(self) -> int | None: ...

    def abort(self) -> None: ...


class FastProtocol(asyncio.Protocol):
    def __init__(self, server: FastServer) -> None:
        self.server = server
        self.client = "-"
        self.request_id = "-"
        self.task: asyncio.Task[None] | None = None
        self.idle_since: float | None = time.monotonic()
        self._counted = False
        self._lost = False  # the client went away while an answer was under way
        self._answered = 0  # requests answered on this connection
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._sock_fd: int | None = None
        self._sock: socket.socket | None = None  # a duplicate, to send with flags
        self._poll_fd: int | None = None

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # uvloop's does not subclass it
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple | list) and peer else "-"
        if not self.server.limits.open(client, self):
            transport.close()
            return
        self.client, self._counted, self._transport = client, True, transport
        self.server.connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=0)
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock_fd = sock.fileno()  # plain TCP: sendfile can write to it
        self._arm_header_timer()
        if self._buf:
            self.idle_since = None
            self._process()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self._disarm_header_timer()
        self._stop_polling()
        if self._counted:
            self._counted = False
            self.server.limits.close(self.client, self)
        self.server.connections.discard(self)
        if self.task is not None:
            # Counted as a hang-up by the task, unless its answer turns out whole: the
            # last bytes may have gone (from a thread, or a drained buffer) before the
            # task could resume to count them (see finish_after_hang_up).
            self._lost = True
            self.task.cancel()
        self._wake_writer(ConnectionResetError("connection lost"))

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self.idle_since = None
        if self.task is None and not self._writing_paused:
            self._process()
        if len(self._buf) > MAX_BUFFERED_BYTES and self._transport is not None \
                and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer(None)
        if self.task is None:
            self._process()

    # -- for the connection limits --------------------------------------------

    def idle_at(self) -> float | None:
        transport = self._transport
        if transport is None or self.task is not None or self._buf or self._writing_paused \
                or transport.get_write_buffer_size() or has_unread_bytes(transport):
            return None
        return self.idle_since

    def close_idle(self) -> None:
        self.close()

    # -- for handlers -------------------------------------------------------

    @property
    def can_sendfile(self) -> bool:
        return self._sock_fd is not None

    def write(self, data: bytes | memoryview) -> None:
        if self._transport is None:
            raise ConnectionResetError("connection lost")
        self._transport.write(data)

    def writelines(self, parts: Sequence[bytes | memoryview]) -> None:
        if self._transport is None:
            raise ConnectionResetError("connection lost")
        self._transport.writelines(parts)

    def head(self, status: int, headers: list[tuple[str, str]], keep_alive: bool) -> bytes:
        lines = [f"HTTP/1.1 {status} {_reason(status)}"]
        lines += [f"{name}: {value}" for name, value in headers]
        lines.append(self.head_end(keep_alive))
        return "\r\n".join(lines).encode("latin-1")

    def head_end(self, keep_alive: bool) -> str:
        """The fields that end every head (Date, request id, close) and the blank line."""
        close = "" if keep_alive else "Connection: close\r\n"
        return (
            f"Date: {_date_now()}\r\nServer: {SERVER}\r\n"
            f"{REQUEST_ID_HEADER}: {self.request_id}\r\n{close}\r\n"
        )

    async def drain(self) -> None:
        if self._transport is None:
            raise ConnectionResetError("connection lost")
        if self._writing_paused:
            await self._until_drained()

    async def sendfile(self, fd: int, offset: int, count: int) -> bool:
        """Send ``count`` bytes of ``fd`` from ``offset`` with ``os.sendfile``.

        False, having sent nothing, when this connection cannot (TLS, or bytes still
        in the transport's buffer that must go first): the caller writes instead.
        uvloop has no ``loop.sendfile``, so this waits for the socket through a
        duplicate descriptor the loop does not own.
        """
        transport, sock_fd = self._transport, self._sock_fd
        if transport is None:
            raise ConnectionResetError("connection lost")
        if sock_fd is None or transport.get_write_buffer_size():
            return False
        while count:
            try:
                sent = os.sendfile(sock_fd, fd, offset, count)
            except BlockingIOError:
                sent = -1
            except (BrokenPipeError, ConnectionError) as exc:
                raise ConnectionResetError(str(exc)) from None
            if sent == 0:
                raise EOFError("the file ended before the range did")
            if sent > 0:
                offset += sent
                count -= sent
            if count:
                await self._socket_writable()
        return True

    def socket_copy(self) -> int | None:
        """A duplicate of this connection's plain TCP socket (the caller closes it), for a
        thread to send on while no answer is written here; None over TLS, or while bytes
        wait in the transport's buffer (they must go first)."""
        transport, sock_fd = self._transport, self._sock_fd
        if transport is None:
            raise ConnectionResetError("connection lost")
        if sock_fd is None or transport.get_write_buffer_size():
            return None
        return os.dup(sock_fd)

    def send_now(self, head: bytes, pieces: list[tuple[int, int, int]]) -> bool:
        """``head``, then each (fd, offset, count) piece of a file, within this callback:
        with ``os.sendfile`` while the socket takes it (no copy through Python, for a
        connection that :attr:`can_sendfile`), the rest read and queued on the
        transport, in order. The descriptors need only stay open until this returns.
        False when a file was shorter than its piece: the connection is cut then.
        """
        transport, sock_fd = self._transport, self._sock_fd
        if transport is None:
            raise ConnectionResetError("connection lost")
        # Once anything waits in the transport, the rest must queue behind it.
        queued = sock_fd is None or transport.get_write_buffer_size() > 0
        if queued or not pieces or pieces[-1][2] <= 0:  # held back only if bytes follow
            transport.write(head)
        else:
            queued = not self._send_more(head)
        for fd, offset, count in pieces:
            while count and not queued:
                assert sock_fd is not None
                try:
                    sent = os.sendfile(sock_fd, fd, offset, count)
                except BlockingIOError:
                    queued = True
                    break
                except OSError as exc:
                    logger.debug("sendfile to %s failed: %s", self.client, exc)
                    self.abort()
                    return True  # the client's side failed, not the file
                if sent == 0:
                    count = -1  # the file ended early
                    break
                offset, count = offset + sent, count - sent
            if count > 0:
                data = os.pread(fd, count, offset)
                transport.write(data)
                count -= len(data)
            if count:
                logger.warning("a cached file ended before its range; cutting the answer")
                self.abort()
                return False
        return True

    def sendfile_now(self, head: bytes, fd: int, offset: int, count: int) -> int:
        """``head``, then as many of the ``count`` bytes of ``fd`` from ``offset`` as the
        socket takes now, within this callback: how many of the file's bytes went (the
        caller sends the rest with :meth:`sendfile`, which waits). The head leaves held
        back (``MSG_MORE``) to share a segment with the file's first bytes. Over TLS, or
        behind bytes queued in the transport, the head is queued and 0 returned.
        """
        transport, sock_fd = self._transport, self._sock_fd
        if transport is None:
            raise ConnectionResetError("connection lost")
        if sock_fd is None or transport.get_write_buffer_size():
            transport.write(head)
            return 0
        if not self._send_more(head):
            return 0  # the rest of the head is queued: the file's bytes go behind it
        try:
            sent = os.sendfile(sock_fd, fd, offset, count)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionError) as exc:
            raise ConnectionResetError(str(exc)) from None
        if sent == 0 and count:
            raise EOFError("the file ended before the range did")
        return sent

    def _send_more(self, head: bytes) -> bool:
        """``head`` on the socket itself, held back (``MSG_MORE``) to leave in the same
        segment as the file bytes the next ``sendfile`` appends: on a connection with
        ``TCP_NODELAY``, a head sent alone costs a segment of its own, and on loopback
        the receiver's processing of it too. False when only part of it went (the rest is
        queued on the transport, so everything after it must queue too)."""
        sock = self._sock
        if sock is None:
            assert self._sock_fd is not None
            sock = self._sock = socket.socket(fileno=os.dup(self._sock_fd))
            sock.setblocking(False)
        try:
            sent = sock.send(head, socket.MSG_MORE)
        except OSError:  # full (BlockingIOError), or broken: the transport's write below
            sent = 0     # queues the head, or meets the error and reports it
        if sent == len(head):
            return True
        assert self._transport is not None
        self._transport.write(head[sent:])
        return False

    def abort(self) -> None:
        """Cut the connection now; nothing more is read or written on it."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()

    def close(self) -> None:
        """Close once what is written has gone; nothing more is read or written."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    # -- requests -----------------------------------------------------------

    def _process(self) -> None:
        """Answer the complete requests in the buffer, in order, until one is async."""
        while self._buf and self._transport is not None and not self._writing_paused:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_REQUEST_HEAD_BYTES \
                        or not could_start_plain_read(self._buf) \
                        or self._buf.count(b"\n") != self._buf.count(b"\r\n"):
                    # Oversized, bare LFs, or not a read at all (garbage, a TLS hello):
                    # aiohttp's to judge, now rather than once a head would be complete.
                    self._hand_off()
                else:
                    self._arm_header_timer()
                return
            self._disarm_header_timer()
            head = parse_request_head(self._buf[:end], with_query=self.server.with_query)
            if head is None:
                self._hand_off()
                return
            started = time.perf_counter()
            incoming = _field(head.headers, _REQUEST_ID_FIELD)
            self.request_id = incoming if incoming and logs.is_sane_id(incoming) \
                else logs.new_request_id()
            token = logs.request_id.set(self.request_id)
            try:
                outcome = self.server.handler(head, self)
            finally:
                logs.request_id.reset(token)
            if outcome is None:
                self._hand_off()
                return
            if isinstance(outcome, Reply):
                del self._buf[: end + 4]
                self._done(head, outcome, started)
                continue
            request = bytes(self._buf[: end + 4])  # in case it declines after all
            del self._buf[: end + 4]
            context = contextvars.copy_context()
            context.run(logs.request_id.set, self.request_id)
            self.task = asyncio.get_running_loop().create_task(
                self._answer(head, request, outcome, started), context=context
            )
            return
        if self._transport is not None and not self._buf:
            self.idle_since = time.monotonic()
            if self._reading_paused:
                self._reading_paused = False
                self._transport.resume_reading()

    async def _answer(
        self, head: RequestHead, request: bytes, outcome: Awaitable[Reply | None],
        started: float,
    ) -> None:
        try:
            reply = await outcome
        except ConnectionError:
            self.server.front.hung_up(self.client)
            self.abort()
            return
        except asyncio.CancelledError:
            if self._lost:
                self.server.front.hung_up(self.client)
            self.abort()
            raise
        except Exception:
            logger.exception("unhandled error answering %s %s", head.method, head.target)
            self.abort()  # whatever was sent is not a complete answer
            return
        finally:
            self.task = None
        if reply is None:  # declined after all: aiohttp reads the request from the start
            if self._transport is not None:
                self._buf[:0] = request
                self._hand_off()
            return
        self._done(head, reply, started)
        if self._transport is not None:
            self._process()

    def _done(self, head: RequestHead, reply: Reply, started: float) -> None:
        self._answered += 1
        logs.log_access(
            self.request_id, head.method, head.target, reply.status,
            self.client, started, reply.body_bytes, reply.x_cache,
        )
        if not head.keep_alive:
            self.close()

    def _hand_off(self) -> None:
        """Give the connection, and every byte not yet answered, to aiohttp."""
        transport = self._transport
        assert transport is not None
        self._transport = None
        self._disarm_header_timer()
        self._stop_polling()
        self.server.connections.discard(self)
        protocol = self.server.slow()
        transport.set_protocol(protocol)  # type: ignore[arg-type]
        self._counted = False  # the connection's count moves with it
        self.server.limits.moved(self.client, self, protocol)
        protocol.adopt(transport, self.client)
        if self._writing_paused:
            protocol.pause_writing()
        if self._reading_paused:
            transport.resume_reading()
        data, self._buf = bytes(self._buf), bytearray()
        if data:
            protocol.data_received(data)

    # -- timers and waiting --------------------------------------------------

    def _arm_header_timer(self) -> None:
        timeout = self.server.limits.header_timeout_s
        if self._header_timer is None and timeout > 0 and self._transport is not None:
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self._transport is None:
            return
        if not self._buf and self._answered:
            return  # idle between requests: the idle timeout's business
        self.server.limits.header_timeouts += 1
        logger.debug("closing a connection from %s: no complete request headers", self.client)
        self._transport.abort()

    async def _until_drained(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        drained = self._drained
        try:
            await asyncio.shield(drained)
        except asyncio.CancelledError:
            if not drained.done() or drained.cancelled() or drained.exception() is not None:
                raise
            # Everything written had gone to the kernel when the client hung up: an
            # answer that ended with this write is whole, and its caller counts it.
            finish_after_hang_up()

    def _wake_writer(self, exc: BaseException | None) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
                waiter.exception()  # retrieved: nobody may be waiting any more

    async def _socket_writable(self) -> None:
        loop = asyncio.get_running_loop()
        if self._poll_fd is None:
            assert self._sock_fd is not None
            self._poll_fd = os.dup(self._sock_fd)
        waiter = loop.create_future()
        loop.add_writer(self._poll_fd, _set_once, waiter)
        try:
            await waiter
        finally:
            if self._poll_fd is not None:
                loop.remove_writer(self._poll_fd)
        if self._transport is None:
            raise ConnectionResetError("connection lost")

    def _stop_polling(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        fd, self._poll_fd = self._poll_fd, None
        if fd is not None:
            asyncio.get_running_loop().remove_writer(fd)
            os.close(fd)


class _AliasedIdProtocol(FastProtocol):
    """A :class:`FastProtocol` whose heads name the request id twice: as ours and as its
    server's ``request_id_alias``."""

    def head_end(self, keep_alive: bool) -> str:
        close = "" if keep_alive else "Connection: close\r\n"
        rid = self.request_id
        return (
            f"Date: {_date_now()}\r\nServer: {SERVER}\r\n{REQUEST_ID_HEADER}: {rid}\r\n"
            f"{self.server.request_id_alias}: {rid}\r\n{close}\r\n"
        )


def finish_after_hang_up() -> None:
    """For a handler that caught the CancelledError of a hang-up (its client closed the
    connection) once its answer's bytes had all gone: it goes on to count its answer and
    return its :class:`Reply`, so the answer is logged; whatever it waits on next is
    cancelled (the connection is gone: nothing more can be sent)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
        task.cancel()  # delivered at the task's next wait, or marks it cancelled at its end


def _set_once(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@functools.cache  # a handful of statuses, looked up on every answer
def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_date_cache: tuple[int, str] = (0, "")


def _date_now() -> str:
    """The Date header, formatted once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, http_date(now))
    return _date_cache[1]
