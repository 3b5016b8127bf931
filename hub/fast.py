"""The hub's fast path: ``GET``/``HEAD /objects/{path}`` of its own files without aiohttp.

A read of a file whose bytes are in the page cache is answered on the
:class:`service.fast.FastProtocol` itself: the file opened as the filesystem backend
opens it (no link followed in any segment below the root), the answer planned by
:func:`protocol.response.plan_response` as the aiohttp handler plans it. Small ranges
go within the callback that read the request (``os.sendfile`` while the socket takes
them, the rest read and queued), large ones by ``os.sendfile`` in the hub's sendfile
threads (:func:`hub.handlers.sendfile_blocking`), where the kernel's copy can run on
another core while the loop answers other requests. Files stay open between requests
(:class:`OpenFiles`). The
commonest request, one ``bytes=a-b`` range and nothing that could change the answer,
is written from a head made once per file version.

Bytes that do not look cached (one byte in every :data:`PROBE_STRIDE` read with
``RWF_NOWAIT``), and all bytes over TLS, are read in a thread and written, still on the
fast path: the event loop never waits on the disk, and a loader's connection stays on
the fast path after a cold read.

Whatever might answer differently is declined, and aiohttp answers it as it always
did: other routes, percent-encoded or queried targets, unknown fields, a token that does
not check out (aiohttp answers the 401/403 and counts it), a client at its in-flight
limit, a missing file, 412/416, and multipart answers (their boundary is checked
against the bytes).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from itertools import takewhile
from typing import TypeVar

from aiohttp import web

from hub.backend import FilesystemBackend, ObjectInfo, OpenObject
from hub.handlers import sendfile_blocking, sendfile_pool
from hub.stats import HubStats
from protocol.auth import authorize
from protocol.errors import ProtocolError
from protocol.headers import REQUEST_ID_HEADER
from protocol.http1 import RequestHead
from protocol.paths import validate_path
from protocol.ranges import ByteRange
from protocol.response import Representation, ResponsePlan, plan_response
from service.auth import GUARD
from service.fast import FastConnection, Reply, finish_after_hang_up
from service.limits import LIMIT

OBJECTS = "/objects/"
# Fields that cannot change the answer once the path and token are checked.
PLAIN_FIELDS = frozenset({
    "host", "range", "user-agent", "accept", "accept-encoding", "connection", "keep-alive",
    REQUEST_ID_HEADER.lower(),
})
# A token, once checked, changes nothing either.
CHECKED_FIELDS = PLAIN_FIELDS | {"authorization"}
# Fields the planner decides on: conditionals (a spoke's fill sends If-Match), If-Range.
PLANNED_FIELDS = CHECKED_FIELDS | {
    "if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range",
}
# Ranges at least this long are sent from a thread; shorter ones within the callback
# that read the request.
SENDFILE_MIN_BYTES = 256 << 10
# Bytes read in a thread at a time (a cold file's, or any over TLS): few thread hops,
# bounded memory per connection.
READ_BLOCK_BYTES = 1 << 20
# A large range counts as cached when one byte in every this many is (probed without
# waiting): the kernel reads files ahead in windows of about this size.
PROBE_STRIDE = 128 << 10
MAX_REMEMBERED = 10_000
# Files kept open between requests (each a descriptor).
MAX_OPEN_FILES = 256
_ONE_RANGE = re.compile(r"bytes=([0-9]{1,15})-([0-9]{1,15})")



T = TypeVar("T")

async def thread_answer(
    job: Future[T], stop: threading.Event, unstarted: Callable[[], None],
    whole: Callable[[T], bool],
) -> T:
    """The result of ``job``, a thread sending an answer on a socket copy of its own.

    A hang-up (this task cancelled) tells the thread to stop. A job still queued is
    dropped, ``unstarted`` closing what it would have closed, and the cancel goes on.
    Otherwise the client may have gone once it had every byte: the thread sent them,
    the client read them and closed before this resumed. Told to stop, the thread ends
    within its poll's wait; a result that ``whole`` says is the whole answer is then
    returned, to be counted and logged like any other, and the cancel goes on at the
    task's next wait (:func:`service.fast.finish_after_hang_up`)."""
    sending = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(sending)
    except asyncio.CancelledError:
        stop.set()
        if job.cancel():  # still queued: nothing sent, and the thread never will
            unstarted()
            raise
        await asyncio.wait([sending])
        if sending.cancelled() or sending.exception() is not None \
                or not whole(sending.result()):
            raise
        finish_after_hang_up()
        return sending.result()

class FastFront:
    """What a fast answer of ``/objects/`` checks first, as aiohttp's middlewares do: a
    plain target, the token, the client's in-flight limit."""

    def __init__(self, app: web.Application, stats: HubStats) -> None:
        self.app = app
        self.stats = stats
        self._paths: dict[str, str] = {}

    def _admit(self, head: RequestHead, conn: FastConnection) -> str | None:
        """The object ``head`` names, the client's in-flight slot taken for it (given
        back by :meth:`_release`); None: aiohttp answers it (and counts it)."""
        try:
            path = self._path(head.target)
            self._authorize(head, path)
        except ProtocolError:
            return None  # aiohttp answers the 400/401/403, and counts it
        limit = self.app.get(LIMIT)
        if limit is not None and not limit.acquire(conn.client):
            limit.rejected -= 1  # aiohttp answers the 429, and counts it
            return None
        return path

    def _release(self, conn: FastConnection) -> None:
        limit = self.app.get(LIMIT)
        if limit is not None:
            limit.release(conn.client)

    async def _finish(self, answer: Awaitable[Reply | None], conn: FastConnection) -> Reply | None:
        try:
            return await answer
        finally:
            self._release(conn)

    def _path(self, target: str) -> str:
        path = self._paths.get(target)
        if path is None:
            raw = target[len(OBJECTS):]
            if "%" in raw or "?" in raw or "#" in raw:
                # aiohttp decodes and splits these; its reading is the one that counts.
                raise ProtocolError("not a plain object target")
            path = validate_path(raw)
            if len(self._paths) >= MAX_REMEMBERED:
                self._paths.clear()
            self._paths[target] = path
        return path

    def _authorize(self, head: RequestHead, path: str) -> None:
        guard = self.app.get(GUARD)
        if guard is not None:
            authorize(guard.authenticate(head.headers.get("Authorization")), path)


class FastObjects(FastFront):
    """The hub app's :data:`service.fast.FastHandler`, over a filesystem backend."""

    def __init__(self, app: web.Application, backend: FilesystemBackend, stats: HubStats) -> None:
        super().__init__(app, stats)
        self.backend = backend
        self._files = OpenFiles(backend)
        app.on_cleanup.append(self._close_files)
        self._prefixes: dict[str, tuple[str, bytes]] = {}
        # False once the filesystem turned out unable to read without waiting: what it
        # holds is then read in a thread, cached or not.
        self._nowait = True

    def __call__(
        self, head: RequestHead, conn: FastConnection
    ) -> Reply | Awaitable[Reply | None] | None:
        if head.method not in ("GET", "HEAD") or not head.target.startswith(OBJECTS) \
                or not PLANNED_FIELDS.issuperset(head.headers):
            return None
        path = self._admit(head, conn)
        if path is None:
            return None
        try:
            fd, info = self._files.open(path)
        except (ProtocolError, OSError):
            self._release(conn)
            return None  # aiohttp answers the 404 (or the error)
        try:
            answer = self._answer(head, conn, info, fd)
        except OSError:
            answer = None  # nothing sent: aiohttp's path meets the error, and answers it
        if answer is None or isinstance(answer, Reply):
            self._release(conn)
            return answer
        return self._finish(answer, conn)

    async def _close_files(self, _app: web.Application) -> None:
        self._files.close()

    def _answer(
        self, head: RequestHead, conn: FastConnection, info: ObjectInfo, fd: int
    ) -> Reply | Awaitable[Reply | None] | None:
        r = self._plain_range(head, info)
        if r is not None:
            start = self._head_prefix(info) + _head_rest(conn, head, r, info.size)
            return self._send(conn, fd, start, r, 206)
        try:
            plan = plan_response(head.method, head.headers, representation_of(info), "",
                                 int(time.time()))
        except ProtocolError:
            return None  # 412, 416: aiohttp's answer
        if plan.boundary is not None:
            return None  # multipart: aiohttp checks the boundary against the bytes
        start = conn.head(plan.status, head_fields(plan), head.keep_alive)
        ranges = plan.ranges
        if head.method == "HEAD" or not ranges:
            conn.writelines([start])
            self.stats.requests += 1
            return Reply(plan.status, 0)
        return self._send(conn, fd, start, ranges[0], plan.status)

    def _plain_range(self, head: RequestHead, info: ObjectInfo) -> ByteRange | None:
        """The range of a plain read (one ``bytes=a-b`` within the file, no field that
        could change the answer), else None: the planner decides."""
        if head.method != "GET" or "range" not in head.headers:
            return None
        if not CHECKED_FIELDS.issuperset(head.headers):
            return None
        match = _ONE_RANGE.fullmatch(head.headers["range"])
        if match is None:
            return None
        start, stop = int(match[1]), min(int(match[2]) + 1, info.size)
        return ByteRange(start, stop) if start < stop else None

    def _send(
        self, conn: FastConnection, fd: int, start: bytes, r: ByteRange, status: int
    ) -> Reply | Awaitable[Reply | None]:
        self.stats.requests += 1
        if not conn.can_sendfile or not self._cached(fd, r):
            # Over TLS the bytes go through Python anyway; bytes not cached would make
            # sendfile wait on the disk: either way they are read in a thread.
            return self._read_and_send(conn, os.dup(fd), start, r, status)
        if r.length >= SENDFILE_MIN_BYTES:
            return self._sendfile(conn, os.dup(fd), start, r, status)
        # Within this callback: by sendfile while the socket takes it, the rest read.
        if not conn.send_now(start, [(fd, r.start, r.length)]):
            return Reply(status, 0)  # the file shrank under us: the answer is cut
        self.stats.bytes_sent += r.length
        return Reply(status, r.length)

    async def _sendfile(
        self, conn: FastConnection, fd: int, start: bytes, r: ByteRange, status: int
    ) -> Reply:
        """Send ``r`` of ``fd`` (a descriptor of its own, closed here) after ``start``:
        from a thread that waits for the socket, where the kernel's copy can use another
        core (on the loop when the connection has no socket for a thread to send on)."""
        owned = True
        try:
            conn.write(start)
            await conn.drain()
            sock = conn.socket_copy()
            if sock is None:
                return await self._sendfile_here(conn, fd, r, status)
            owned = False  # the thread closes the file once it is done with it
            stop = threading.Event()
            job = sendfile_pool().submit(_send_and_close, sock, fd, r, stop)

            def unstarted() -> None:
                os.close(sock)
                os.close(fd)

            try:
                sent = await thread_answer(job, stop, unstarted, lambda n: n == r.length)
            finally:
                stop.set()  # cancelled (the client went away): the thread stops too
            self.stats.bytes_sent += sent
            if sent != r.length:
                conn.abort()  # the file shrank under an open answer: cut it, never pad
            return Reply(status, sent)
        finally:
            if owned:
                os.close(fd)

    async def _sendfile_here(
        self, conn: FastConnection, fd: int, r: ByteRange, status: int
    ) -> Reply:
        try:
            if not await conn.sendfile(fd, r.start, r.length):
                for offset in range(r.start, r.stop, SENDFILE_MIN_BYTES):
                    want = min(SENDFILE_MIN_BYTES, r.stop - offset)
                    data = os.pread(fd, want, offset)
                    if len(data) != want:
                        raise EOFError("the file shrank while it was being sent")
                    conn.write(data)
                    await conn.drain()
        except EOFError:
            # The file shrank under an open answer: cut it rather than pad.
            conn.abort()
            return Reply(status, 0)
        self.stats.bytes_sent += r.length
        return Reply(status, r.length)

    async def _read_and_send(
        self, conn: FastConnection, fd: int, start: bytes, r: ByteRange, status: int
    ) -> Reply | None:
        """Read ``r`` of ``fd`` (a descriptor of its own, closed here) in a thread, a block
        at a time, and send it after ``start``."""
        try:
            return await self._read_and_send_owned(conn, fd, start, r, status)
        finally:
            os.close(fd)

    async def _read_and_send_owned(
        self, conn: FastConnection, fd: int, start: bytes, r: ByteRange, status: int
    ) -> Reply | None:
        loop = asyncio.get_running_loop()
        sent = 0
        while sent < r.length:
            want = min(READ_BLOCK_BYTES, r.length - sent)
            data = await loop.run_in_executor(None, os.pread, fd, want, r.start + sent)
            if len(data) != want:  # the file shrank under us
                if not sent:
                    self.stats.requests -= 1
                    return None  # nothing sent: aiohttp answers as it does for a torn file
                conn.abort()  # the head is gone: cut the answer rather than pad it
                return Reply(status, sent)
            if not sent:
                conn.write(start)
            conn.write(data)
            sent += want
            self.stats.bytes_sent += want
            await conn.drain()
        return Reply(status, sent)

    def _cached(self, fd: int, r: ByteRange) -> bool:
        """Whether ``r`` looks cached: a byte of every :data:`PROBE_STRIDE`, and its last."""
        if not self._nowait:
            return False
        probe = bytearray(1)
        offsets = [*range(r.start, r.stop, PROBE_STRIDE), r.stop - 1]
        try:
            for offset in offsets:
                if os.preadv(fd, [probe], offset, os.RWF_NOWAIT) != 1:
                    return False
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait = False
            return False
        return True

    def _head_prefix(self, info: ObjectInfo) -> bytes:
        """The head of a plain 206 of ``info``, up to the Content-Range's numbers."""
        known = self._prefixes.get(info.path)
        if known is not None and known[0] == info.etag:
            return known[1]
        now = int(time.time())
        planned = plan_response("GET", {"Range": "bytes=0-0"}, representation_of(info), "", now)
        fields = "".join(
            f"{name}: {value}\r\n"
            for name, value in takewhile(lambda h: h[0] != "Content-Range", planned.headers)
        )
        head = f"HTTP/1.1 206 Partial Content\r\n{fields}Content-Range: bytes ".encode("latin-1")
        if info.mtime_ns // 1_000_000_000 >= now - 1:
            return head  # Last-Modified capped by this second's Date: not for later answers
        if len(self._prefixes) >= MAX_REMEMBERED:
            self._prefixes.clear()
        self._prefixes[info.path] = (info.etag, head)
        return head


class OpenFiles:
    """Files the fast path opened, kept open while their names still lead to them.

    Opening a file as the backend does (a descriptor per directory of its path, each
    opened without following links) is most of a small read's cost. An open file is
    used again while one ``lstat`` of its name finds the very inode and version it
    opened: the bytes are then those of a file that was reached without links and is
    still at that name, unchanged. Anything else (gone, replaced, rewritten, a link
    now) opens it again the backend's way, which refuses links.
    """

    def __init__(self, backend: FilesystemBackend, max_open: int = MAX_OPEN_FILES) -> None:
        self.backend = backend
        self.max_open = max_open
        self._open: OrderedDict[str, tuple[OpenObject, int, tuple[int, ...]]] = OrderedDict()

    def open(self, path: str) -> tuple[int, ObjectInfo]:
        """A descriptor of valid ``path`` (valid within this callback: duplicate it to
        keep it longer) and its version; raises what the backend's open raises."""
        kept = self._open.get(path)
        if kept is not None:
            obj, fd, identity = kept
            try:
                st = os.stat(f"{self.backend.root}/{path}", follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and _identity(st) == identity:
                self._open.move_to_end(path)
                return fd, obj.info
            del self._open[path]
            obj.close()
        new = self.backend.open_valid(path)
        fd = new.fileno()
        try:
            identity = _identity(os.fstat(fd))
        except BaseException:
            new.close()
            raise
        self._open[path] = (new, fd, identity)
        if len(self._open) > self.max_open:
            _, (old, _, _) = self._open.popitem(last=False)
            old.close()
        return fd, new.info

    def close(self) -> None:
        while self._open:
            _, (obj, _, _) = self._open.popitem()
            obj.close()


def _send_and_close(sock: int, fd: int, r: ByteRange, stop: threading.Event) -> int:
    """:func:`hub.handlers.sendfile_blocking` of ``r``, then the file closed (blocking):
    closed here, not by the loop, so its number is never reused while this still sends."""
    try:
        return sendfile_blocking(sock, fd, r.start, r.length, stop)
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What :func:`hub.backend.etag_for` hashes: the same inode, the same version."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def representation_of(info: ObjectInfo) -> Representation:
    return Representation(info.size, info.etag, info.mtime_ns, info.content_type)


def head_fields(plan: ResponsePlan) -> list[tuple[str, str]]:
    """``plan``'s fields as :func:`service.body.send_plan` sends them."""
    if plan.status == 304:
        return [h for h in plan.headers if h[0] != "Content-Length"]
    return list(plan.headers)


def _head_rest(conn: FastConnection, head: RequestHead, r: ByteRange, size: int) -> bytes:
    """A plain 206's head after its prefix: the range's numbers, then the end."""
    return (
        f"{r.start}-{r.stop - 1}/{size}\r\nContent-Length: {r.length}\r\n"
        f"{conn.head_end(head.keep_alive)}"
    ).encode("latin-1")
