"""A chunk fill's presigned GET to a plain-HTTP store, on kept-alive connections of the
hub's own: from the event loop (:class:`LoopGets`, a spoke's fills on the fast path) or
from a thread on ``http.client``'s (:class:`PlainGets`, the aiohttp handler's reads).

For a store reached over plain HTTP with no proxy (a store next to the hub), botocore's
send and urllib3's pool cost a fill several times what the request itself does (URL
parsing and encoding, header merging, pool keys): a fill's CPU on the hub is mostly
theirs. :mod:`http.client` parses the answer's head as urllib3 does (urllib3 is built
on it) and the body is read, or spliced, from the same objects. Anything over TLS or
through a proxy stays botocore's (its verification, its proxies).

A connection is used again only once its answer was read to its end (the body's
length told by Content-Length); a GET that fails on a kept connection (the store
closed it meanwhile) is sent once more on a new one, as urllib3 does.

The answer's head is read by :func:`protocol.http1.parse_response_head`, not by
http.client's, which goes through the email package's parser at several times the cost
for the five fields the hub reads (figures: docs/performance.md). The body is
http.client's as ever.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPException, HTTPResponse, RemoteDisconnected
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies

from hub.relay import readiness
from protocol.errors import MalformedResponse
from protocol.http1 import MAX_RESPONSE_HEAD_BYTES, parse_response_head

# Kept-alive connections at most (as many as the store's threads: STORE_CONNECTIONS).
MAX_IDLE = 64
# What one read of an answer's head takes off the socket: the head and, behind it, the
# body's first bytes, which then leave with the hub's own head.
HEAD_READ_BYTES = 64 << 10


class FieldsByName(Mapping[str, str]):
    """An answer's fields by name in any case, as http.client's message gives them."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields  # by lower-case name (parse_response_head's)

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


class QuickResponse(HTTPResponse):
    """http.client's response with its head read in one pass: a head that is not a
    plain HTTP/1.x one (a 1xx, a bare LF, a malformed field) is an HTTPException, and
    the GET goes botocore's way."""

    def begin(self) -> None:
        if self.headers is not None:
            return  # begun already
        lines: list[bytes] = []
        size = 0
        while True:
            line = self.fp.readline(MAX_RESPONSE_HEAD_BYTES + 1)
            if not line:
                raise RemoteDisconnected("the store closed the connection without an answer")
            size += len(line)
            if size > MAX_RESPONSE_HEAD_BYTES:
                raise HTTPException(f"an answer head over {MAX_RESPONSE_HEAD_BYTES} bytes")
            if line == b"\r\n" and lines:
                break
            if not line.endswith(b"\r\n"):
                raise HTTPException("an answer head line not ended by CRLF")
            lines.append(line)
        try:
            head = parse_response_head(b"".join(lines)[:-2])
        except MalformedResponse as exc:
            raise HTTPException(str(exc)) from None
        if head.status < 200:
            raise HTTPException(f"an interim answer {head.status} to a GET")
        self.code = self.status = head.status
        self.reason = ""
        self.version = 10 if lines[0].startswith(b"HTTP/1.0 ") else 11
        # http.client's are its email message; every reader here asks .get().
        self.headers = self.msg = FieldsByName(head.headers)
        coding = head.headers.get("transfer-encoding")
        self.chunked = coding is not None and coding.lower() == "chunked"
        self.chunk_left = None
        self.length = None if self.chunked else head.content_length
        if head.status in (204, 304) or self._method == "HEAD":
            self.length = 0  # no body, whatever Content-Length says
        self.will_close = not head.keep_alive or (not self.chunked and self.length is None)


class _StoreConnection(HTTPConnection):
    response_class = QuickResponse


class PlainAnswer:
    """A GET's answer as :class:`hub.store.s3.S3Object` reads one of urllib3's: the
    http.client response (``_fp``), its connection (``connection.sock``), and
    ``release_conn`` once read to its end."""

    def __init__(self, gets: PlainGets, connection: HTTPConnection, response: HTTPResponse
                 ) -> None:
        self._gets = gets
        self.connection: HTTPConnection | None = connection
        self._fp = response

    def read(self, amt: int | None = None) -> bytes:
        return self._fp.read(amt)

    def release_conn(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            self._gets.give_back(connection, self._fp)

    def close(self) -> None:
        connection, self.connection = self.connection, None
        self._fp.close()
        if connection is not None:
            connection.close()


class PlainGets:
    """GETs of presigned URLs of one plain-HTTP store, on connections kept alive."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: list[HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def for_endpoint(cls, endpoint: str, proxies: object, timeout_s: float) -> PlainGets | None:
        """For a plain-HTTP ``endpoint`` reached without a proxy; None otherwise."""
        at = plain_endpoint(endpoint, proxies)
        return None if at is None else cls(*at, timeout_s)

    def get(self, url: str, headers: dict[str, str]) -> tuple[int, Any, PlainAnswer] | None:
        """The status, fields and body of a GET of ``url`` (presigned: ``Host`` is the
        one it was signed for); None if it could not be sent or answered."""
        parts = urlsplit(url)
        target = f"{parts.path}?{parts.query}" if parts.query else parts.path
        for fresh in (False, True):
            connection = self._take(fresh)
            try:
                connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
                connection.putheader("Host", parts.netloc)
                for name, value in headers.items():
                    connection.putheader(name, value)
                connection.endheaders()
                response = connection.getresponse()
            except (OSError, HTTPException):
                connection.close()
                if fresh:
                    return None
                continue  # the store had closed the kept connection: once more, anew
            return response.status, response.headers, PlainAnswer(self, connection, response)
        return None

    def _take(self, fresh: bool) -> HTTPConnection:
        if not fresh:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
        return _StoreConnection(self.host, self.port, timeout=self.timeout_s)

    def give_back(self, connection: HTTPConnection, response: HTTPResponse) -> None:
        """Keep ``connection`` for another GET if its answer was read to its end."""
        if not response.isclosed() or response.will_close:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def plain_endpoint(endpoint: str, proxies: object) -> tuple[str, int] | None:
    """The host and port of a plain-HTTP ``endpoint`` reached without a proxy; None
    otherwise (TLS, a proxy: botocore's way, with its verification and its proxies)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname or proxies or getproxies().get("http"):
        return None
    return parts.hostname, parts.port or 80


@dataclass(slots=True)
class LoopAnswer:
    """A store's answer head, read in the loop; its body follows on ``sock``."""

    status: int
    fields: FieldsByName
    keep_alive: bool
    content_length: int | None
    ahead: bytes  # the body's first bytes, read along with the head
    sock: socket.socket
    gets: LoopGets

    def finish(self, whole: bool) -> None:
        """Done with the answer: its connection is kept if the body was moved ``whole``
        and the store keeps it alive, closed otherwise."""
        self.gets.done(self, whole)


class LoopGets:
    """GETs of presigned URLs of one plain-HTTP store from the event loop, on
    non-blocking connections kept alive: no thread between a fill's request and its
    store's answer. At most ``most`` are in flight (as many as a thread-sent store's
    threads); more wait their turn. A connection goes back (:meth:`done`) only once its
    body was moved whole; a GET that fails on a kept connection (the store closed it
    meanwhile) is sent once more on a new one."""

    def __init__(self, host: str, port: int, timeout_s: float, most: int) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: list[socket.socket] = []
        self._turns = asyncio.Semaphore(most)

    @classmethod
    def for_endpoint(
        cls, endpoint: str, proxies: object, timeout_s: float, most: int
    ) -> LoopGets | None:
        at = plain_endpoint(endpoint, proxies)
        return None if at is None else cls(*at, timeout_s, most)

    async def get(self, url: str, fields: Mapping[str, str]) -> LoopAnswer | None:
        """The head of a GET of ``url`` (presigned: ``Host`` is the one it was signed
        for), its body not yet read; None if it could not be sent or answered. An
        answer holds its turn until :meth:`done`."""
        await self._turns.acquire()
        try:
            answer = await self._get(url, fields)
        except BaseException:
            self._turns.release()
            raise
        if answer is None:
            self._turns.release()
        return answer

    async def _get(self, url: str, fields: Mapping[str, str]) -> LoopAnswer | None:
        parts = urlsplit(url)
        target = f"{parts.path}?{parts.query}" if parts.query else parts.path
        lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}",
                 *(f"{name}: {value}" for name, value in fields.items()), "", ""]
        request = "\r\n".join(lines).encode("latin-1")
        for fresh in (False, True):
            sock = None if fresh or not self._idle else self._idle.pop()
            try:
                if sock is None:
                    sock = await self._connect()
                return await self._exchange(sock, request)
            except (OSError, TimeoutError, MalformedResponse):
                if sock is not None:
                    sock.close()
                if fresh:
                    return None
            except BaseException:  # cancelled: the client went away
                if sock is not None:
                    sock.close()
                raise
        return None

    def done(self, answer: LoopAnswer, whole: bool) -> None:
        """Keep ``answer``'s connection if its body was moved ``whole`` and the store
        keeps it alive; close it otherwise."""
        self._turns.release()
        if whole and answer.keep_alive and len(self._idle) < MAX_IDLE:
            self._idle.append(answer.sock)
        else:
            answer.sock.close()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    async def _connect(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout_s):
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            failure: OSError = OSError(f"no address for {self.host}")
            for family, kind, proto, _name, address in infos:
                sock = socket.socket(family, kind, proto)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, address)
                except OSError as exc:
                    sock.close()
                    failure = exc
                    continue
                except BaseException:
                    sock.close()
                    raise
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            raise failure

    async def _exchange(self, sock: socket.socket, request: bytes) -> LoopAnswer:
        loop = asyncio.get_running_loop()
        fd = sock.fileno()
        async with asyncio.timeout(self.timeout_s):
            sent = 0
            while sent < len(request):
                try:
                    sent += sock.send(request[sent:])
                except BlockingIOError:
                    await readiness(loop, fd, write=True)
            received = bytearray()
            while (end := received.find(b"\r\n\r\n")) < 0:
                if len(received) > MAX_RESPONSE_HEAD_BYTES:
                    raise MalformedResponse(f"an answer head over {MAX_RESPONSE_HEAD_BYTES} bytes")
                try:
                    data = sock.recv(HEAD_READ_BYTES)
                except BlockingIOError:
                    await readiness(loop, fd)
                    continue
                if not data:
                    raise ConnectionResetError("the store closed the connection without an answer")
                received += data
        head = parse_response_head(received[:end])
        if head.status < 200:
            raise MalformedResponse(f"an interim answer {head.status} to a GET")
        return LoopAnswer(head.status, FieldsByName(head.headers), head.keep_alive,
                          head.content_length, bytes(received[end + 4:]), sock, self)
