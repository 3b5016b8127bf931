"""Channel: msgpack messages between two processes of one spoke, file descriptors attached.

A ``SOCK_SEQPACKET`` Unix socket keeps each message whole and in order, and carries
descriptors with the message they belong to (``SCM_RIGHTS``), which is how a reader
worker hands a client's connection to the owner. Sends never block the event loop:
what the socket cannot take yet waits in order for it to drain.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from spoke.workers.messages import BadMessage, Message, decode, encode

logger = logging.getLogger(__name__)

# Below the default socket buffer (~208 KiB), so any message fits in one packet.
MAX_MESSAGE_BYTES = 64 << 10
MAX_FDS = 4
# Bytes a message may carry inline; more go in a memory file sent beside it (bytes_in_fd).
MAX_INLINE_BYTES = MAX_MESSAGE_BYTES - 1024

Handler = Callable[[list[Any], list[int]], None]
RecordHandler = Callable[[Message, list[int]], None]


def channel_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def bytes_in_fd(data: bytes) -> int:
    """A descriptor of an anonymous memory file holding ``data``: how bytes too many for
    one message (a request body a reader had read before it handed the connection
    over) travel beside it. The receiver reads them with :func:`bytes_from_fd`."""
    fd = os.memfd_create("hubspoke-received", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def bytes_from_fd(fd: int) -> bytes:
    """What :func:`bytes_in_fd` put in ``fd``; the descriptor is closed."""
    try:
        parts = []
        offset = 0
        while block := os.pread(fd, 1 << 20, offset):
            parts.append(block)
            offset += len(block)
        return b"".join(parts)
    finally:
        os.close(fd)


class Channel:
    def __init__(
        self, sock: socket.socket, on_message: Handler, on_close: Callable[[], None]
    ) -> None:
        """``on_message(message, fds)`` owns ``fds`` (closes what it does not keep)."""
        sock.setblocking(False)
        self.sock = sock
        self._on_message, self._on_close = on_message, on_close
        self._out: deque[tuple[bytes, list[int]]] = deque()
        self._closed = self._waiting = False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, message: list[Any], fds: Sequence[int] = ()) -> None:
        """Queue ``message``; ``fds`` are closed here once the peer has its copies."""
        data = msgpack.packb(message, use_bin_type=True)
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError(f"a channel message of {len(data)} bytes is too large")
        if self._closed:
            _close_all(fds)
            return
        self._out.append((data, list(fds)))
        if not self._waiting:
            self._flush()

    def tell(self, message: Message, fds: Sequence[int] = ()) -> None:
        """:meth:`send` one of :mod:`spoke.workers.messages`' records."""
        self.send(encode(message), fds)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self.sock.fileno())
        if self._waiting:
            self._loop.remove_writer(self.sock.fileno())
        while self._out:
            _close_all(self._out.popleft()[1])
        self.sock.close()
        self._on_close()

    def _flush(self) -> None:
        while self._out:
            data, fds = self._out[0]
            try:
                if fds:
                    rights = array.array("i", fds)
                    self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
                else:
                    self.sock.send(data)
            except BlockingIOError:
                if not self._waiting:
                    self._waiting = True
                    self._loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError as exc:
                logger.debug("channel send failed: %s", exc)
                self.close()
                return
            self._out.popleft()
            _close_all(fds)
        if self._waiting:
            self._waiting = False
            self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        while not self._closed:
            try:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    MAX_MESSAGE_BYTES, socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
                )
            except BlockingIOError:
                return
            except OSError:
                data, ancillary, flags = b"", [], 0
            fds = _received_fds(ancillary)
            if not data:  # the other process is gone
                _close_all(fds)
                self.close()
                return
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError("truncated")
                message = msgpack.unpackb(data, raw=False)
                if not isinstance(message, list) or not message:
                    raise ValueError("not a message")
            except Exception as exc:  # a bug on the other side, not a reason to stop
                _drop(exc, fds)
                continue
            self._on_message(message, fds)


def receiving(on_record: RecordHandler) -> Handler:
    """A channel's ``on_message`` handing ``on_record`` each message decoded
    (:mod:`spoke.workers.messages`); one that decodes to no record is dropped, and
    logged, as one that does not unpack is."""

    def on_message(message: list[Any], fds: list[int]) -> None:
        try:
            record = decode(message)
        except BadMessage as exc:
            _drop(exc, fds)
            return
        on_record(record, fds)

    return on_message


def _drop(error: Exception, fds: Sequence[int]) -> None:
    logger.error("dropping a bad channel message: %s", error)
    _close_all(fds)


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            rights = array.array("i")
            rights.frombytes(payload[: len(payload) - len(payload) % rights.itemsize])
            fds += rights
    return fds


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)
