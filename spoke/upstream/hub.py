"""HubClient: the spoke's only way to the hub; owns its connections.

Metadata and listings go through one aiohttp session. Chunk bodies, which are
nearly all the bytes, go through connections of its own (:class:`_ChunkConnection`):
a minimal HTTP/1.1 client whose response bodies are received straight into the
chunk's buffer (no per-read ``bytes``, no parser copy, no copy into the chunk).
Both keep their connections alive and pooled: at 60 ms RTT a new connection costs
a round trip.

Foreign failures are translated here, once: aiohttp errors, socket errors and
timeouts become :mod:`spoke.upstream.errors` types that carry the status a loader should see.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote, urlsplit

import aiohttp

from protocol.errors import BadPath, MalformedResponse, no_object
from protocol.headers import REQUEST_ID_HEADER
from protocol.http1 import MAX_RESPONSE_HEAD_BYTES, parse_response_head
from protocol.manifest import Manifest, decode_manifest
from protocol.ranges import ByteRange, parse_content_range, range_header
from service.logs import request_id
from spoke.upstream.base import BodyTarget, HeadCheck
from spoke.upstream.errors import (
    BadGateway,
    GoneAtHub,
    HubRefused,
    HubTimeout,
    HubUnavailable,
    ObjectChanging,
    StaleVersion,
    UnavailableAnswer,
)

logger = logging.getLogger(__name__)

# Bytes a hub response may buffer before aiohttp stops reading the socket. Fills
# copy what arrives straight into the chunk, so this only has to stay clear of the
# pause/resume churn that aiohttp's 64 KiB default causes at hundreds of MB/s.
READ_BUFFER_BYTES = 4 << 20

Sink = Callable[[bytes], None]

# Error bodies are read up to this much, for the message; beyond, the connection goes.
MAX_ERROR_BODY_BYTES = 64 << 10
# Idle chunk connections are closed after this long (servers drop them after ~75 s).
KEEPALIVE_S = 60.0


class _NotForUs(Exception):
    """The hub answered in a way the chunk connection does not read (e.g. chunked)."""


class HubTlsError(HubRefused):
    """The TLS handshake with the hub failed (e.g. its certificate is not trusted).

    Not retryable: the same certificate fails the same way. Nothing reaches the cache.
    """

    title = "TLS to the hub failed"


class HubClient:
    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``token`` goes to the hub as ``Authorization: Bearer``; ``ssl_context`` verifies an
        https hub (default: the system CAs, host name checked)."""
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.connections_opened = 0
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        parts = urlsplit(self.base_url)
        self._scheme = parts.scheme
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base_path = parts.path.rstrip("/")
        self._host_header = parts.netloc.rpartition("@")[2]
        self._chunk_ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._chunk_ssl = ssl_context or ssl.create_default_context()
        self._idle: deque[_ChunkConnection] = deque()
        self._busy: set[_ChunkConnection] = set()

    async def start(self) -> None:
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(self._count_connection)
        # Keep-alive matters at 60 ms RTT: a new TCP connection costs a round trip.
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, keepalive_timeout=60, enable_cleanup_closed=False,
            ssl=self._ssl,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, trace_configs=[trace],
            auto_decompress=False, headers=self._headers, read_bufsize=READ_BUFFER_BYTES,
        )

    async def close(self) -> None:
        for conn in [*self._idle, *self._busy]:
            conn.abort()
        self._idle.clear()
        if self._session is not None:
            await self._session.close()

    async def _count_connection(self, *_: object) -> None:
        self.connections_opened += 1

    def _url(self, endpoint: str, path: str) -> str:
        return f"{self.base_url}/{endpoint}/{quote(path, safe='/')}"

    @asynccontextmanager
    async def _get(
        self, url: str, headers: dict[str, str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        assert self._session is not None, "HubClient.start() was not awaited"
        rid = request_id.get()
        if rid != "-":  # forward the loader's request id so both logs tie up
            headers = {**headers, REQUEST_ID_HEADER: rid}
        try:
            async with self._session.get(url, headers=headers) as response:
                yield response
        except TimeoutError as exc:
            raise HubTimeout(f"hub did not answer in time ({url})") from exc
        except aiohttp.ClientPayloadError as exc:
            raise HubUnavailable(f"hub connection broke mid-body: {exc}") from exc
        except aiohttp.ClientSSLError as exc:
            raise _tls_error(self.base_url, exc) from exc
        except aiohttp.ClientError as exc:
            raise HubUnavailable(f"cannot reach the hub: {exc}") from exc
        except OSError as exc:
            raise HubUnavailable(f"cannot reach the hub: {exc}") from exc

    async def fetch_manifest(self, path: str) -> tuple[Manifest, bytes]:
        """The hub's current manifest of ``path`` and its raw bytes."""
        async with self._get(self._url("manifest", path), {}) as response:
            await _expect(response, (200,), path)
            body = await response.read()
        manifest = decode_manifest(body)
        if manifest.path != path:
            raise BadGateway(f"hub sent the manifest of {manifest.path!r} for {path!r}")
        return manifest, body

    async def stream_range(self, path: str, etag: str, r: ByteRange, sink: Sink) -> None:
        """Pass bytes ``r`` of version ``etag`` of ``path`` to ``sink`` as they arrive.

        Exactly ``r.length`` bytes in order, or an error (possibly after some bytes
        went to ``sink``: a connection that breaks mid-body raises
        :class:`HubUnavailable`, a stalled one :class:`HubTimeout`).
        """
        headers = {"Range": range_header(r), "If-Match": etag}
        async with self._get(self._url("objects", path), headers) as response:
            await _expect(response, (200, 206), path)
            if response.headers.get("ETag") != etag:
                raise StaleVersion(f"{path} changed at the hub")
            skip = r.start if response.status == 200 else 0
            if response.status == 206:
                _check_content_range(response, r, path)
            wanted = r.length
            content = response.content
            while wanted:
                # One buffered piece at a time: readany() would join them (a copy).
                data, _ = await content.readchunk()
                if not data:
                    break
                if skip:
                    if len(data) <= skip:
                        skip -= len(data)
                        continue
                    data, skip = data[skip:], 0
                if len(data) > wanted:
                    if response.status == 206:
                        raise BadGateway(f"hub sent more than the {r.length} bytes asked of {path}")
                    data = data[:wanted]
                sink(data)
                wanted -= len(data)
        if wanted:
            raise BadGateway(
                f"hub sent {r.length - wanted} bytes of {path} for a {r.length}-byte range"
            )

    async def fetch_into(
        self, path: str, etag: str | None, r: ByteRange, target: BodyTarget,
        on_head: HeadCheck | None = None,
    ) -> None:
        """Receive bytes ``r`` of version ``etag`` of ``path`` straight into ``target``.

        Exactly ``r.length`` bytes in order, or an error, possibly after some of them
        (a connection that breaks mid-body raises :class:`HubUnavailable`, one that
        stalls for the read timeout :class:`HubTimeout`). An answer this path does not
        read (not a plain 206, e.g. a hub that ignores Range) is read through aiohttp.

        ``etag`` None asks for whatever version the hub has (a fetch made before the
        manifest is known): the answer may then end short of ``r`` where the object
        does, and ``on_head(etag, got)`` hears its version and range before any of its
        bytes reach ``target``, and may raise to refuse them.
        """
        if self._scheme not in ("http", "https"):
            raise HubUnavailable(f"cannot reach the hub: unsupported URL {self.base_url!r}")
        url = self._url("objects", path)
        target_path = f"{self._base_path}/objects/{quote(path, safe='/')}"
        headers = {"Range": range_header(r), **self._headers}
        if etag is not None:
            headers["If-Match"] = etag
        rid = request_id.get()
        if rid != "-":  # forward the loader's request id so both logs tie up
            headers[REQUEST_ID_HEADER] = rid
        request = _request_bytes(target_path, self._host_header, headers)
        for fresh in (False, True):
            conn = await self._connection(url, fresh=fresh)
            try:
                await conn.fetch(
                    request, r, path, etag, target, self._read_timeout_s, url, on_head)
            except _StaleConnection:
                if fresh:
                    raise HubUnavailable("the hub closed the connection without answering") \
                        from None
                continue  # the hub had closed this idle connection: once more, on a new one
            except _NotForUs:
                break
            finally:
                self._release(conn)
            return
        if etag is None:  # aiohttp's way needs the version to ask for
            raise BadGateway(f"hub's answer for {path} is not a plain 206")
        await self.stream_range(path, etag, r, _feeder(target))

    async def _connection(self, url: str, *, fresh: bool) -> _ChunkConnection:
        loop = asyncio.get_running_loop()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.usable(loop.time()):
                self._busy.add(conn)
                return conn
            conn.abort()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    _ChunkConnection, self._host, self._port, ssl=self._chunk_ssl,
                    server_hostname=self._host if self._chunk_ssl is not None else None,
                )
        except TimeoutError as exc:
            raise HubTimeout(f"hub did not answer in time ({url})") from exc
        except ssl.SSLError as exc:
            raise _ssl_error(self.base_url, exc) from exc
        except OSError as exc:
            raise HubUnavailable(f"cannot reach the hub: {exc}") from exc
        self.connections_opened += 1
        self._busy.add(conn)
        return conn

    def _release(self, conn: _ChunkConnection) -> None:
        self._busy.discard(conn)
        if conn.reusable and len(self._idle) < self._max_connections:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.abort()

    async def chunk_size(self) -> int | None:
        """The chunk size the hub's ``/healthz`` reports; None from a hub that does not."""
        async with self._get(f"{self.base_url}/healthz", {}) as response:
            await _expect(response, (200,), "/healthz")
            return healthz_chunk_size(await response.read())

    async def list_objects(self, prefix: str) -> list[tuple[str, int]]:
        """(path, size) of every object under ``prefix`` at the hub."""
        body, _ = await self.fetch_list(prefix, "application/json")
        try:
            entries = json.loads(body)["objects"]
            return [(str(e["path"]), int(e["size"])) for e in entries]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadGateway(f"hub sent an unreadable listing: {exc}") from None

    async def fetch_list(self, prefix: str, accept: str) -> tuple[bytes, str]:
        url = f"{self.base_url}/list/{quote(prefix, safe='/')}"
        async with self._get(url, {"Accept": accept}) as response:
            await _expect(response, (200,), prefix)
            return await response.read(), response.content_type


def healthz_chunk_size(body: bytes) -> int | None:
    """The positive integer ``chunk_size`` of a hub's ``/healthz`` answer, if it has one
    (a hub older than the field, or anything else answering there, has not)."""
    try:
        size = json.loads(body).get("chunk_size")
    except (ValueError, AttributeError):  # not JSON (or not UTF-8), not an object
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


async def _expect(response: aiohttp.ClientResponse, ok: tuple[int, ...], path: str) -> None:
    if response.status in ok:
        return
    detail = (await response.text())[:200] if _wants_detail(response.status) else ""
    raise _status_error(response.status, detail, path)


def _wants_detail(status: int) -> bool:
    return 400 <= status < 500 and status not in (404, 412)


def _status_error(status: int, detail: str, path: str) -> Exception:
    """What a hub's error status means for the loader (``detail``: the body's start)."""
    if status == 404:
        return GoneAtHub(no_object(path))
    if status == 412:
        return StaleVersion(f"{path} changed at the hub")
    if status == 409:
        return ObjectChanging(f"{path} changed at the hub while it was hashed: {detail}")
    if status == 400:
        # The hub refused the path (e.g. it escapes the root): the loader's fault.
        return BadPath(f"hub refused {path!r}: {detail}")
    if status in (401, 403):
        # The spoke's own credentials, not the loader's: say which flag to look at.
        return HubRefused(f"hub answered {status} to the spoke's token for {path!r} "
                          f"(check --hub-token-file): {detail}")
    if 400 <= status < 500:
        return HubRefused(f"hub answered {status} for {path!r}: {detail}")
    if status in (502, 503, 504):
        return UnavailableAnswer(f"hub answered {status} for {path!r}")
    return BadGateway(f"hub answered {status} for {path!r}")


def _check_content_range(response: aiohttp.ClientResponse, r: ByteRange, path: str) -> None:
    """A 206 must carry the range asked for, not another one."""
    _check_range_value(response.headers.get("Content-Range", ""), r, path)


def _check_range_value(value: str, r: ByteRange, path: str) -> None:
    answered = parse_content_range(value)
    if answered is None or answered.range != r:
        raise BadGateway(f"hub answered {value!r} for bytes {r.start}-{r.stop - 1} of {path}")


def _answered_range(value: str, r: ByteRange, path: str) -> ByteRange:
    """The range a 206 carries for ``r`` asked of an object of unknown size: ``r``, or
    its start up to where the object ends."""
    answered = parse_content_range(value)
    if answered is not None and answered.range is not None and answered.size is not None:
        got = answered.range
        if got.start == r.start < got.stop == min(r.stop, answered.size):
            return got
    raise BadGateway(f"hub answered {value!r} for bytes {r.start}-{r.stop - 1} of {path}")


def _request_bytes(target: str, host: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _feeder(target: BodyTarget) -> Sink:
    def feed(data: bytes) -> None:
        target.space()[: len(data)] = data
        target.advance(len(data))

    return feed


class _StaleConnection(Exception):
    """A reused connection closed before any answer: the hub had dropped it."""


class _ChunkConnection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection to the hub, reading one answer at a time.

    The head is received into a small buffer of its own; the body, once its length
    is known, straight into the caller's :class:`BodyTarget`.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self.idle_since = self._loop.time()
        self._head = bytearray(MAX_RESPONSE_HEAD_BYTES)
        self._head_len = 0
        self._phase = "idle"  # idle, head, body, error-body, done
        self._target: BodyTarget | None = None
        self._remaining = 0
        self._error_body = bytearray()
        self._status = 0
        self._keep_alive = False
        self._got_bytes = False
        self._done: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._progress_at = 0.0
        self._lost = False
        self._range = ByteRange(0, 0)
        self._path = ""
        self._etag: str | None = ""
        self._on_head: HeadCheck | None = None

    # -- asyncio.BufferedProtocol ------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._phase == "body" and self._target is not None:
            space = self._target.space()
            return space[: self._remaining] if len(space) > self._remaining else space
        if self._head_len == len(self._head):
            # An oversized head, or bytes nobody asked for: read them into the void
            # (buffer_updated gives up on the connection; never abort in here, the
            # loop is in the middle of reading).
            self._head_len = 0
            self._phase = "junk" if self._phase != "head" else "head-overflow"
        return memoryview(self._head)[self._head_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self._progress_at = self._loop.time()
        self._got_bytes = True
        if self._phase == "body":
            assert self._target is not None
            self._target.advance(nbytes)
            self._remaining -= nbytes
            if self._remaining == 0:
                self._finish()
            return
        self._head_len += nbytes
        if self._phase == "head":
            self._parse_head()
        elif self._phase == "error-body":
            self._collect_error_body()
        elif self._phase == "head-overflow":
            self._fail(BadGateway("hub sent an oversized response head"))
        else:  # bytes nobody asked for: the connection is not in a state to reuse
            self._head_len = 0
            self._fail(BadGateway("hub sent bytes that answer no request"))
            self._loop.call_soon(self.abort)

    def eof_received(self) -> bool:
        self._fail_lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.reusable = False
        self._fail_lost(exc)

    # -- the caller's side ---------------------------------------------------

    def usable(self, now: float) -> bool:
        return self.reusable and not self._lost and self.transport is not None and \
            not self.transport.is_closing() and now - self.idle_since < KEEPALIVE_S

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    async def fetch(
        self, request: bytes, r: ByteRange, path: str, etag: str | None, target: BodyTarget,
        read_timeout_s: float, url: str, on_head: HeadCheck | None = None,
    ) -> None:
        assert self.transport is not None
        self.reusable = False
        self._phase, self._head_len, self._got_bytes = "head", 0, False
        self._target, self._range, self._path, self._etag = target, r, path, etag
        self._on_head = on_head
        self._done = self._loop.create_future()
        self._progress_at = self._loop.time()
        self._timer = self._loop.call_later(read_timeout_s, self._check_stall, read_timeout_s)
        try:
            self.transport.write(request)
            await self._done
        except (_StaleConnection, _NotForUs):
            raise
        except TimeoutError as exc:
            raise HubTimeout(f"hub did not answer in time ({url})") from exc
        except ConnectionError as exc:
            if self._phase == "body":
                raise HubUnavailable(f"hub connection broke mid-body: {exc}") from exc
            raise HubUnavailable(f"cannot reach the hub: {exc}") from exc
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            # A pooled connection must not keep its last fetch's chunk alive (an
            # early fetch's head check holds its fill) until it is used again.
            self._target = self._on_head = None
            if self._phase != "done":
                self.abort()

    # -- parsing -------------------------------------------------------------

    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n", 0, self._head_len)
        if end < 0:
            return  # get_buffer notices a head that fills the buffer
        try:
            head = parse_response_head(memoryview(self._head)[:end])
        except MalformedResponse as exc:
            self._fail(BadGateway(f"hub sent {exc}"))
            return
        self._status, self._keep_alive = head.status, head.keep_alive
        if head.content_length is None or self._status == 200:
            # Chunked or framed some other way, or a hub that ignored Range: aiohttp's.
            self._fail(_NotForUs())
            return
        body = memoryview(self._head)[end + 4 : self._head_len]
        self._head_len = 0  # the head buffer is free again once ``body`` is taken
        self._remaining = head.content_length
        if self._status != 206:
            self._start_error_body(body)
            return
        try:
            self._check_chunk_head(head.headers)
        except Exception as exc:
            self._fail(exc)
            return
        self._start_body(body)

    def _check_chunk_head(self, headers: dict[str, str]) -> None:
        """A 206 is for the version and the bytes asked for, or the fetch fails."""
        got = self._range
        if self._etag is None:  # any version: the answer says which, and where it ends
            etag = headers.get("etag")
            if not etag:
                raise BadGateway(f"hub sent no ETag for {self._path}")
            got = _answered_range(headers.get("content-range", ""), got, self._path)
            if self._on_head is not None:
                self._on_head(etag, got)
        else:
            if headers.get("etag") != self._etag:
                raise StaleVersion(f"{self._path} changed at the hub")
            _check_range_value(headers.get("content-range", ""), got, self._path)
        if self._remaining != got.length:
            raise BadGateway(f"hub sent {self._remaining} bytes of {self._path} for a "
                             f"{got.length}-byte range")

    def _start_error_body(self, body: memoryview) -> None:
        self._phase = "error-body"
        self._error_body = bytearray()
        if self._remaining > MAX_ERROR_BODY_BYTES:
            self._fail(self._error())
            return
        self._take_error_body(body)

    def _start_body(self, body: memoryview) -> None:
        self._phase = "body"
        if len(body) > self._remaining:
            self._fail(BadGateway("hub sent more than its Content-Length"))
            return
        if body:
            assert self._target is not None
            self._target.space()[: len(body)] = body
            self._target.advance(len(body))
            self._remaining -= len(body)
        if self._remaining == 0:
            self._finish()

    def _collect_error_body(self) -> None:
        body = memoryview(self._head)[: self._head_len]
        self._head_len = 0
        self._take_error_body(body)

    def _take_error_body(self, body: memoryview) -> None:
        self._error_body += body[: self._remaining]
        self._remaining -= min(len(body), self._remaining)
        if self._remaining == 0:
            keep = self._keep_alive
            self._fail(self._error())
            self.reusable = keep  # a complete error answer leaves the connection usable
            self._phase = "done" if keep else self._phase

    def _error(self) -> Exception:
        detail = bytes(self._error_body[:200]).decode("utf-8", "replace")
        return _status_error(self._status, detail if _wants_detail(self._status) else "",
                             self._path)

    def _finish(self) -> None:
        self._phase = "done"
        self.reusable = self._keep_alive
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)

    def _fail_lost(self, exc: Exception | None = None) -> None:
        if self._phase in ("idle", "done"):
            return
        if self._phase == "head" and not self._got_bytes:
            self._fail(_StaleConnection())
            return
        reason = str(exc) if exc is not None else "the hub closed the connection"
        self._fail(ConnectionResetError(reason))

    def _check_stall(self, read_timeout_s: float) -> None:
        self._timer = None
        if self._done is None or self._done.done():
            return
        idle = self._loop.time() - self._progress_at
        if idle >= read_timeout_s:
            self._fail(TimeoutError())
            return
        self._timer = self._loop.call_later(read_timeout_s - idle, self._check_stall,
                                            read_timeout_s)


def _ssl_error(base_url: str, exc: ssl.SSLError) -> HubTlsError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = str(exc.verify_message or exc).rstrip(".")
        hint = ("the certificate must name the host in --hub"
                if exc.verify_code in _NAME_MISMATCH else "trust its CA with --hub-ca")
        return HubTlsError(
            f"certificate verification failed for the hub at {base_url}: {reason} ({hint})"
        )
    return HubTlsError(f"TLS handshake with the hub at {base_url} failed: {exc}")


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH = (62, 64)


def _tls_error(base_url: str, exc: aiohttp.ClientSSLError) -> HubTlsError:
    """A message that names the cause and the fix, never just "cannot connect"."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cause = exc.certificate_error
        reason = str(getattr(cause, "verify_message", None) or cause).rstrip(".")
        hint = ("the certificate must name the host in --hub"
                if getattr(cause, "verify_code", None) in _NAME_MISMATCH
                else "trust its CA with --hub-ca")
        return HubTlsError(
            f"certificate verification failed for the hub at {base_url}: {reason} ({hint})"
        )
    return HubTlsError(f"TLS handshake with the hub at {base_url} failed: {exc}")
