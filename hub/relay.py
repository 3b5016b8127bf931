"""Send a range of an object store's answer to a client: from the event loop
(:func:`relay_in_loop`, a spoke's fill from a plain-HTTP store) or from one thread
(:func:`relay_blocking`, every other read of a store).

The hub's reads of a store are GETs it must pass on whole: the bytes go from the
store's socket to the client's with ``splice`` (through a pipe, inside the kernel: no
copy through Python, no buffer), or, where the GET's socket cannot be spliced (TLS),
through one reused buffer (``readinto``). From a thread it is one hop per range, not
two per block; from the loop, none: the loop waits on both sockets as on any other.

Every byte sent is one the store gave for the version the GET was pinned to (its ETag
and Content-Range were checked when it was answered). A body the store cuts short cuts
the answer (:class:`StoreCut`): fewer bytes, never other ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

# The relay's buffer, when it cannot splice: a few socket buffers' worth, so each read
# from the store and send to the client moves much at once.
RELAY_BLOCK_BYTES = 1 << 20
# The pipe between the two sockets holds this much (Linux's default is 64 KiB; larger
# is fewer system calls per range, and an unprivileged process may ask for 1 MiB).
PIPE_BYTES = 1 << 20
# A client that makes no progress for this long is abandoned (it stalled).
STALL_S = 60.0
_F_SETPIPE_SZ = 1031
_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class StoreCut(Exception):
    """The store's body ended or failed before the range did: the answer is cut."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.sent = 0  # bytes of the body that went before the cut (set by the relay)


class NotSent(Exception):
    """The store's body failed before any byte of the answer went to the client: the
    request can still be answered another way."""


@runtime_checkable
class StoreBody(Protocol):
    def readinto(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` from ``offset``, all of it or an error."""
        ...

    def socket_body(self, offset: int, count: int) -> tuple[bytes, int, float | None] | None:
        """For a splice: the ``count`` bytes from ``offset`` are the rest of the GET on
        the returned socket, after the bytes already read off it (returned first); with
        the store's read timeout. The descriptor is a duplicate the caller closes: the
        GET may be closed meanwhile (a client gone) without its number being reused
        under the splice."""
        ...

    def moved(self) -> None:
        """The body :meth:`socket_body` gave was moved off its socket, all of it."""
        ...


def relay_blocking(
    sock_fd: int, body: StoreBody, offset: int, count: int, stop: threading.Event,
    head: bytes = b"",
) -> int:
    """Send ``head``, then ``count`` bytes of ``body`` from ``offset``, to ``sock_fd``;
    returns how many of the body's went.

    ``head`` leaves with the body's first bytes, once the store gave them: a store
    failing before then raises :class:`NotSent`, nothing sent. Owns (and closes)
    ``sock_fd``, a duplicate of the client's non-blocking socket: waits for room in it
    with poll, so a slow client holds this thread, not the event loop.
    """
    sender = _Sender(sock_fd, stop, head)
    try:
        _relay(sender, body, offset, count)
        return sender.body_sent
    except ConnectionError:
        raise  # the client's side
    except Exception as exc:
        if not sender.sent:
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(exc, StoreCut):
            exc.sent = sender.body_sent
        raise
    finally:
        with contextlib.suppress(OSError):
            os.close(sock_fd)


def _relay(sender: _Sender, body: StoreBody, offset: int, count: int) -> None:
    taken = body.socket_body(offset, count)
    if taken is not None:
        buffered, store_fd, timeout = taken
        try:
            if buffered:
                sender.write(memoryview(buffered))
            _splice(sender, store_fd, timeout, count - len(buffered))
        finally:
            os.close(store_fd)
        body.moved()
        return
    buffer = memoryview(bytearray(min(RELAY_BLOCK_BYTES, count)))
    done = 0
    while done < count:
        block = buffer[:min(len(buffer), count - done)]
        body.readinto(offset + done, block)
        sender.write(block)  # all of it: the buffer is then free for the next block
        done += len(block)


def _splice(sender: _Sender, store_fd: int, timeout: float | None, count: int) -> None:
    store_poll = select.poll()
    store_poll.register(store_fd, select.POLLIN)
    read_end, write_end = _pipe()
    try:
        left = count
        while left:
            n = _from_store(store_fd, write_end, left)
            if not n:
                if not store_poll.poll(None if timeout is None else timeout * 1000):
                    raise StoreCut("the store stopped sending the body")
                continue
            left -= n
            sender.splice_from(read_end, n)
    finally:
        os.close(read_end)
        os.close(write_end)


def _from_store(store_fd: int, write_end: int, left: int) -> int:
    """Bytes of the store's body one splice moved into the pipe; 0 when none had come."""
    try:
        n = os.splice(store_fd, write_end, left, flags=_SPLICE)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise StoreCut(f"the store cut the body: {exc}") from None
    if n == 0:
        raise StoreCut(f"the store's body ended {left} bytes short")
    return n


def _pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_BYTES)
    return read_end, write_end


async def relay_in_loop(
    sock_fd: int, store_fd: int, ahead: bytes, count: int, head: bytes,
    store_timeout_s: float | None,
) -> int:
    """Send ``head``, then the ``count`` bytes of a store's body: ``ahead`` (read off
    ``store_fd`` with the store's head), then the rest spliced off ``store_fd``;
    returns how many of the body's went. The loop waits on both (non-blocking) sockets.

    As :func:`relay_blocking`: ``head`` leaves with the body's first bytes, so a store
    failing before them raises :class:`NotSent` with nothing sent, after them
    :class:`StoreCut`; the client's side fails with ``ConnectionResetError``, as does a
    client making no progress for :data:`STALL_S`. Neither descriptor is closed here.
    """
    loop = asyncio.get_running_loop()
    sender = _LoopSender(loop, sock_fd, head)
    read_end, write_end = _pipe()
    try:
        if ahead:
            await sender.write(ahead)
        left = count - len(ahead)
        while left:
            n = _from_store(store_fd, write_end, left)
            if not n:
                try:
                    await readiness(loop, store_fd, timeout_s=store_timeout_s)
                except TimeoutError:
                    raise StoreCut("the store stopped sending the body") from None
                continue
            left -= n
            await sender.splice_from(read_end, n)
        return sender.body_sent
    except StoreCut as exc:
        if not sender.sent:
            raise NotSent(str(exc)) from exc
        exc.sent = sender.body_sent
        raise
    finally:
        os.close(read_end)
        os.close(write_end)


async def readiness(
    loop: asyncio.AbstractEventLoop, fd: int, write: bool = False,
    timeout_s: float | None = None,
) -> None:
    """Once ``fd`` is readable (or writable); TimeoutError after ``timeout_s``. The loop
    stops watching ``fd`` before this returns or raises, so the caller may close it."""
    ready: asyncio.Future[None] = loop.create_future()
    if write:
        loop.add_writer(fd, _set_ready, ready)
    else:
        loop.add_reader(fd, _set_ready, ready)
    try:
        if timeout_s is None:
            await ready
        else:
            async with asyncio.timeout(timeout_s):
                await ready
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


def _set_ready(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class _Sending:
    """What a sender to the client's non-blocking socket counts: ``head`` first, then
    the body's bytes."""

    def __init__(self, sock_fd: int, head: bytes) -> None:
        self.sock_fd = sock_fd
        self.sent = 0
        self.head = head
        self.head_bytes = len(head)

    @property
    def body_sent(self) -> int:
        return max(0, self.sent - self.head_bytes)

    def _attempt(self, attempt: Callable[[], int]) -> int:
        """Bytes one ``attempt`` moved; 0 when the socket had no room."""
        try:
            n = attempt()  # os.write on a socket is send
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise ConnectionResetError(f"client went away: {exc}") from None
        self.sent += n
        return n

    def _splice_step(self, pipe_fd: int, count: int) -> Callable[[], int]:
        return functools.partial(os.splice, pipe_fd, self.sock_fd, count, flags=_SPLICE)


class _LoopSender(_Sending):
    """:class:`_Sender`'s counterpart in the loop: awaits room in the socket; the head
    leaves with the body's first bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock_fd: int, head: bytes) -> None:
        super().__init__(sock_fd, head)
        self.loop = loop

    async def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        block = memoryview(head + data if head else data)  # one segment, head and bytes
        done = 0
        while done < len(block):
            done += await self._move(functools.partial(os.write, self.sock_fd, block[done:]))

    async def splice_from(self, pipe_fd: int, count: int) -> None:
        """Move ``count`` bytes waiting in ``pipe_fd`` to the client."""
        if self.head:
            await self.write(b"")
        done = 0
        while done < count:
            done += await self._move(self._splice_step(pipe_fd, count - done))

    async def _move(self, attempt: Callable[[], int]) -> int:
        while not (n := self._attempt(attempt)):
            try:
                await readiness(self.loop, self.sock_fd, write=True, timeout_s=STALL_S)
            except TimeoutError:
                raise ConnectionResetError("client stopped reading") from None
        return n


class _Sender(_Sending):
    """Writes to the client's non-blocking socket, waiting (bounded) for room in it;
    ``head`` first, just before the first bytes of the body."""

    def __init__(self, sock_fd: int, stop: threading.Event, head: bytes = b"") -> None:
        super().__init__(sock_fd, head)
        self.stop = stop
        self.poller = select.poll()
        self.poller.register(sock_fd, select.POLLOUT)

    def _head_first(self) -> None:
        head, self.head = self.head, b""
        if head:
            self._write(memoryview(head))

    def write(self, block: memoryview) -> None:
        self._head_first()
        self._write(block)

    def _write(self, block: memoryview) -> None:
        done = 0
        while done < len(block):
            done += self._move(functools.partial(os.write, self.sock_fd, block[done:]))

    def splice_from(self, pipe_fd: int, count: int) -> None:
        """Move ``count`` bytes waiting in ``pipe_fd`` to the client."""
        self._head_first()
        done = 0
        while done < count:
            done += self._move(self._splice_step(pipe_fd, count - done))

    def _move(self, attempt: Callable[[], int]) -> int:
        """Bytes one ``attempt`` moved, once the socket has room for any."""
        progress_at = time.monotonic()
        while True:
            if self.stop.is_set():
                raise ConnectionResetError("response abandoned")
            n = self._attempt(attempt)
            if n:
                return n
            if time.monotonic() - progress_at > STALL_S:
                raise ConnectionResetError("client stopped reading")
            self.poller.poll(250)
