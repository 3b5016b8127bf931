"""A loader-side client for hubspoke's HTTP API (hub or spoke, they answer alike).

:class:`AsyncClient` is the asyncio client: one aiohttp session (so connections are
reused), bounded retries that honour ``Retry-After`` on 503/504, and exceptions that
carry the server's problem+json detail. :class:`Client` is the same API for plain
synchronous code: it runs an :class:`AsyncClient` on an event loop in a background
thread, created lazily in each process, so it keeps working in DataLoader workers
after ``fork`` and can be pickled into ``spawn`` workers.

``Client.open(path)`` returns a read-only binary file. The file pins the object's
version: it learns the ETag when opened and sends ``If-Match`` with every range
request, so it either returns bytes of that one version or raises
:class:`VersionChanged` — never a mix of two versions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import aiohttp
import msgpack
from yarl import URL

from protocol.conditional import parse_http_date
from protocol.errors import BadPath
from protocol.headers import PLAN_HEADER
from protocol.multipart import BadMultipart, parse_byteranges
from protocol.paths import validate_path, validate_prefix
from protocol.ranges import MAX_RANGES, ByteRange, parse_content_range

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

T = TypeVar("T")

# Statuses that say "try again later" rather than "this request is wrong".
_RETRY_STATUSES = frozenset({503, 504})
# Backoff when a server gives no Retry-After, or the connection itself failed.
_BACKOFF_BASE_S = 0.1
_BACKOFF_MAX_S = 2.0
DEFAULT_BUFFER_SIZE = 256 * 1024
_PROBLEM_JSON = "application/problem+json"


# --- results and errors ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectStat:
    """What a server says about one object version.

    ``mtime`` (seconds since the epoch, from ``Last-Modified``) is known from
    :meth:`AsyncClient.stat`; listings do not carry it and leave it ``None``.
    """

    path: str
    size: int
    etag: str
    mtime: float | None = None


class HubspokeError(OSError):
    """Base of every error this client raises.

    ``status`` is the HTTP status (``None`` when no answer arrived); ``title`` and
    ``detail`` come from the server's problem+json body when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        status: int | None = None,
        title: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.status = status
        self.title = title
        self.detail = detail


class ObjectNotFound(HubspokeError, FileNotFoundError):
    """The server has no such object (404)."""


class VersionChanged(HubspokeError):
    """The object changed after it was opened (412 on ``If-Match``); reopen to read it."""


class Unavailable(HubspokeError):
    """The server stayed unavailable (503/504 or no connection) through every retry."""


class InvalidPath(HubspokeError, ValueError):
    """An object path the API refuses (absolute, ``..``, empty segments, NUL, ...)."""


# --- the asyncio client ----------------------------------------------------------------


class AsyncClient:
    """Reads objects from a hub or spoke at ``endpoint`` (e.g. ``http://spoke:8701``).

    Without ``session`` the client creates its own aiohttp session on first use (in
    the running loop, and again in a forked child) and closes it in :meth:`aclose`; a
    session passed in is used as is and left open. An instance belongs to one event
    loop. Retries: at most ``max_retries`` more attempts per request, waiting what
    ``Retry-After`` asks, and never more than ``max_retry_wait_s`` in total.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        session: aiohttp.ClientSession | None = None,
        max_retries: int = 5,
        max_retry_wait_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        max_connections: int = 64,
        token: str | None = None,
    ) -> None:
        if max_retries < 0 or max_retry_wait_s < 0:
            raise ValueError("max_retries and max_retry_wait_s must not be negative")
        self.endpoint = endpoint.rstrip("/")
        # Sent on every request: the bearer token (``python -m hub token``) and, once
        # :meth:`use_plan` is called, the read plan these reads follow.
        self._extra_headers: dict[str, str] = {}
        if token is not None:
            self._extra_headers["Authorization"] = f"Bearer {token}"
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self._session = session
        self._owns_session = session is None
        self._session_pid = os.getpid()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session this client created (a session passed in stays open).

        A client closed this way opens a new session if it is used again.
        """
        if not self._owns_session:
            return
        session, self._session = self._session, None
        if session is not None and self._session_pid == os.getpid():
            await session.close()

    async def read(
        self, path: str, offset: int = 0, length: int = -1, *, etag: str | None = None,
        plan: str | None = None,
    ) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``path``, like ``pread``.

        ``length=-1`` reads to the end. Past the end of the object the answer is short
        or empty, never an error. With ``etag`` the read is of that version only:
        :class:`VersionChanged` if the object is now another one. ``plan`` names the
        read plan this read follows, in place of :meth:`use_plan`'s.
        """
        path = _checked_path(path)
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        if length == 0:
            return b""
        headers = dict(_BASE_HEADERS)
        if offset > 0 or length > 0:
            last = "" if length < 0 else str(offset + length - 1)
            headers["Range"] = f"bytes={offset}-{last}"
        if etag is not None:
            headers["If-Match"] = etag
        if plan is not None:
            headers[PLAN_HEADER] = plan

        async def body(response: aiohttp.ClientResponse) -> bytes:
            return await _range_body(response, path, offset, length, etag)

        return await self._send("GET", self._object_url(path), path, headers, body)

    async def read_many(
        self, path: str, ranges: Sequence[tuple[int, int]], *, etag: str | None = None,
        plan: str | None = None,
    ) -> list[bytes]:
        """:meth:`read` for each ``(offset, length)`` in ``ranges``, in few round trips.

        The ranges go out as multi-range requests (``multipart/byteranges``, up to
        256 ranges each), so a batch of samples costs one round trip, not one per
        sample. Results are in the order of ``ranges``; past the end of the object
        they are short or empty. Pass ``etag`` (e.g. from :meth:`stat`) to be sure
        all of them come from one version.
        """
        path = _checked_path(path)
        if any(offset < 0 or length < 0 for offset, length in ranges):
            raise ValueError("offsets and lengths must not be negative")
        batches = [ranges[i:i + MAX_RANGES] for i in range(0, len(ranges), MAX_RANGES)]
        # return_exceptions: let every batch finish before raising, so none is left
        # running against a session the caller may be about to close.
        results = await asyncio.gather(
            *(self._read_batch(path, b, etag, plan) for b in batches), return_exceptions=True
        )
        out: list[bytes] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            out.extend(result)
        return out

    async def read_objects(
        self, wanted: Sequence[tuple[str, Sequence[tuple[int, int]], str | None, str | None]],
    ) -> list[list[bytes]]:
        """:meth:`read_many` of each ``(path, ranges, etag, plan)``, all at once: a batch
        of samples from many shards costs one round trip, not one per shard."""
        results = await asyncio.gather(
            *(self.read_many(path, ranges, etag=etag, plan=plan)
              for path, ranges, etag, plan in wanted),
            return_exceptions=True,  # as read_many: every read ends before one raises
        )
        out: list[list[bytes]] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            out.append(result)
        return out

    async def _read_batch(
        self, path: str, ranges: Sequence[tuple[int, int]], etag: str | None, plan: str | None
    ) -> list[bytes]:
        wanted = [(offset, length) for offset, length in ranges if length > 0]
        if len(wanted) <= 1:
            return [await self.read(path, offset, length, etag=etag, plan=plan)
                    for offset, length in ranges]
        headers = dict(_BASE_HEADERS)
        headers["Range"] = "bytes=" + ",".join(f"{o}-{o + n - 1}" for o, n in wanted)
        if etag is not None:
            headers["If-Match"] = etag
        if plan is not None:
            headers[PLAN_HEADER] = plan

        async def parts(response: aiohttp.ClientResponse) -> list[tuple[ByteRange, bytes]]:
            return await _multi_range_parts(response, path, etag)

        got = await self._send("GET", self._object_url(path), path, headers, parts)
        return [_cut(got, offset, length) for offset, length in ranges]

    async def stat(self, path: str) -> ObjectStat:
        """Size, ETag and modification time of ``path`` (a ``HEAD`` request)."""
        path = _checked_path(path)

        async def parse(response: aiohttp.ClientResponse) -> ObjectStat:
            await _raise_unless(response, (200,), path)
            return _stat_from_headers(path, response)

        return await self._send(
            "HEAD", self._object_url(path), path, dict(_BASE_HEADERS), parse
        )

    async def list(self, prefix: str = "") -> list[ObjectStat]:
        """Every object whose path starts with ``prefix`` (a string prefix: pass
        ``"dir/"`` for the objects under a directory), sorted by path."""
        try:
            validate_prefix(prefix)
        except BadPath as exc:
            raise InvalidPath(f"bad listing prefix {prefix!r}: {exc}", path=prefix) from None
        url = URL(f"{self.endpoint}/list/{quote(prefix, safe='/')}", encoded=True)
        headers = {**_BASE_HEADERS, "Accept": "application/json"}

        async def parse(response: aiohttp.ClientResponse) -> list[ObjectStat]:
            await _raise_unless(response, (200,), prefix)
            return _listing(await response.read(), prefix)

        return await self._send("GET", url, prefix, headers, parse)

    def _object_url(self, path: str) -> URL:
        # encoded=True: we quoted the path ourselves; yarl must not re-quote '%'.
        return URL(f"{self.endpoint}/objects/{quote(path, safe='/')}", encoded=True)

    def _session_now(self) -> aiohttp.ClientSession:
        """This process's session, created on first use inside the running loop."""
        if self._session is not None and self._session_pid != os.getpid():
            if not self._owns_session:
                raise RuntimeError(
                    "this AsyncClient was given the parent process's aiohttp session; "
                    "create the client (or its session) in the child"
                )
            # Inherited through fork: its sockets are the parent's. Keep the object
            # alive (collecting it would warn) and never touch it again.
            _INHERITED.append(self._session)
            self._session = None
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                auto_decompress=False,  # byte-exact: never let a transfer coding alter bytes
            )
            self._session_pid = os.getpid()
        return self._session

    async def create_plan(
        self, reads: Sequence[tuple[str, int, int]], *, job: str | None = None
    ) -> str:
        """Tell the spoke the ``(path, offset, length)`` reads to come, in order.

        Returns the plan id; :meth:`use_plan` then marks this client's reads as
        following it, so the spoke fetches ahead of them and evicts by the plan.
        With ``job``, every caller naming the same job gets the same plan (the ranks
        of one training job): the first one makes it.
        """
        request: dict[str, object] = {"reads": [list(r) for r in reads]}
        if job is not None:
            request["job"] = job
        body = msgpack.packb(request, use_bin_type=True)
        headers = {**_BASE_HEADERS, "Content-Type": "application/msgpack"}

        async def created(response: aiohttp.ClientResponse) -> str:
            await _raise_unless(response, (200, 201), "plans")
            return str((await response.json())["id"])

        return await self._send("POST", URL(f"{self.endpoint}/plans"), "plans", headers,
                                created, data=body)

    async def delete_plan(self, plan_id: str) -> bool:
        """Drop plan ``plan_id`` from the spoke; False if it was not there (any more)."""
        async def deleted(response: aiohttp.ClientResponse) -> bool:
            if response.status == 404:
                return False
            await _raise_unless(response, (200,), "plans")
            return True

        url = URL(f"{self.endpoint}/plans/{quote(plan_id, safe='')}", encoded=True)
        return await self._send("DELETE", url, "plans", dict(_BASE_HEADERS), deleted)

    def use_plan(self, plan_id: str | None) -> None:
        """Send ``X-Hubspoke-Plan: plan_id`` with every read from now on (None: stop)."""
        if plan_id is None:
            self._extra_headers.pop(PLAN_HEADER, None)
        else:
            self._extra_headers[PLAN_HEADER] = plan_id

    async def _send(
        self,
        method: str,
        url: URL,
        path: str,
        headers: Mapping[str, str],
        handle: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        data: bytes | None = None,
    ) -> T:
        """Send a request and return ``handle(response)``; retry 503/504 and lost
        connections within the retry budget, then raise :class:`Unavailable`."""
        headers = {**self._extra_headers, **headers}  # a read's own plan wins over use_plan's
        waited = 0.0
        attempt = 0
        while True:
            failure: Unavailable
            try:
                async with self._session_now().request(
                    method, url, headers=headers, allow_redirects=False, data=data
                ) as response:
                    if response.status not in _RETRY_STATUSES:
                        return await handle(response)
                    delay = _retry_delay(response.headers.get("Retry-After"), attempt)
                    failure = await _unavailable(response, path)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                delay = _retry_delay(None, attempt)
                failure = Unavailable(f"{method} {path!r}: {exc!r}", path=path)
            if attempt >= self.max_retries:
                raise _exhausted(failure, f"after {attempt + 1} attempts")
            if waited + delay > self.max_retry_wait_s:
                raise _exhausted(failure, f"retry in {delay:g}s would exceed the wait budget")
            await asyncio.sleep(delay)
            waited += delay
            attempt += 1


# Inherited sessions and runtimes of a parent process, kept so they are never collected.
_INHERITED: list[object] = []
# identity: transfer codings are for the whole representation, and we want raw bytes.
_BASE_HEADERS: Mapping[str, str] = {"Accept-Encoding": "identity"}


def _checked_path(path: str) -> str:
    """``path`` if the API accepts it, else :class:`InvalidPath` (before any request)."""
    try:
        return validate_path(path)
    except BadPath as exc:
        raise InvalidPath(f"bad object path {path!r}: {exc}", path=path) from None


def _retry_delay(header: str | None, attempt: int) -> float:
    """Seconds to wait before retrying: ``Retry-After`` (delta-seconds or HTTP-date)
    when the server sent one, else exponential backoff for ``attempt``."""
    if header:
        value = header.strip()
        if value.isascii() and value.isdigit():
            return float(value)
        when = parse_http_date(value)
        if when is not None:
            return max(0.0, when - time.time())
    return float(min(_BACKOFF_BASE_S * 2**attempt, _BACKOFF_MAX_S))


def _exhausted(failure: Unavailable, why: str) -> Unavailable:
    return Unavailable(
        f"{failure} ({why})",
        path=failure.path, status=failure.status, title=failure.title, detail=failure.detail,
    )


async def _unavailable(response: aiohttp.ClientResponse, path: str) -> Unavailable:
    title, detail = await _problem(response)
    message = f"{response.method} {path!r}: {response.status} {title or response.reason or ''}"
    return Unavailable(
        message.rstrip(), path=path, status=response.status, title=title, detail=detail
    )


async def _problem(response: aiohttp.ClientResponse) -> tuple[str | None, str | None]:
    """``title`` and ``detail`` of a problem+json body; ``(None, None)`` without one."""
    if response.content_type != _PROBLEM_JSON or response.method == "HEAD":
        return None, None
    try:
        body = json.loads(await response.read())
    except (ValueError, aiohttp.ClientError):
        return None, None
    if not isinstance(body, dict):
        return None, None
    title, detail = body.get("title"), body.get("detail")
    return (title if isinstance(title, str) else None, detail if isinstance(detail, str) else None)


async def _raise_unless(response: aiohttp.ClientResponse, ok: tuple[int, ...], path: str) -> None:
    """Return if the status is one of ``ok``; else raise the matching error."""
    if response.status in ok:
        return
    title, detail = await _problem(response)
    status = response.status
    summary = f"{response.method} {path!r}: {status} {title or response.reason or ''}".rstrip()
    if detail:
        summary = f"{summary}: {detail}"
    kind: type[HubspokeError] = HubspokeError
    if status == 404:
        kind = ObjectNotFound
    elif status == 412:
        kind = VersionChanged
        summary = f"{path!r} changed since this version was opened; reopen it ({summary})"
    raise kind(summary, path=path, status=status, title=title, detail=detail)


async def _range_body(
    response: aiohttp.ClientResponse, path: str, offset: int, length: int, etag: str | None
) -> bytes:
    """The bytes a read asked for, checked against ``Content-Range`` and the pinned ETag."""
    if response.status == 416:
        return b""  # the range starts at or past the end: a file read returns nothing
    await _raise_unless(response, (200, 206), path)
    got = response.headers.get("ETag")
    if etag is not None and got is not None and got != etag:
        raise VersionChanged(
            f"{path!r} changed since this version was opened (ETag {etag}, server sent {got})",
            path=path, status=response.status,
        )
    body = await response.read()
    if response.status == 200:
        # No Range sent, or a server that ignored it: the whole object, so slice.
        return body[offset:] if length < 0 else body[offset : offset + length]
    answered = parse_content_range(response.headers.get("Content-Range", ""))
    if answered is None or answered.range is None or answered.range.start != offset:
        raise HubspokeError(
            f"{path!r}: asked for bytes from {offset}, got Content-Range "
            f"{response.headers.get('Content-Range')!r}",
            path=path, status=response.status,
        )
    return body


async def _multi_range_parts(
    response: aiohttp.ClientResponse, path: str, etag: str | None
) -> list[tuple[ByteRange, bytes]]:
    """The byte ranges a multi-range answer carries, whatever shape it came in."""
    if response.status == 416:
        return []  # every range starts past the end
    await _raise_unless(response, (200, 206), path)
    got = response.headers.get("ETag")
    if etag is not None and got is not None and got != etag:
        raise VersionChanged(f"{path!r} changed since this version was opened", path=path,
                             status=response.status)
    body = await response.read()
    if response.status == 200:  # a server that ignored Range: the whole object
        return [(ByteRange(0, len(body)), body)]
    if response.content_type == "multipart/byteranges":
        try:
            return parse_byteranges(response.headers["Content-Type"], body)
        except BadMultipart as exc:
            raise HubspokeError(f"{path!r}: {exc}", path=path, status=response.status) from None
    answered = parse_content_range(response.headers.get("Content-Range", ""))
    if answered is None or answered.range is None:
        raise HubspokeError(f"{path!r}: 206 without a valid Content-Range", path=path, status=206)
    start = answered.range.start
    return [(ByteRange(start, start + len(body)), body)]  # one range was satisfiable


def _cut(parts: list[tuple[ByteRange, bytes]], offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset + length)`` from the parts; short or empty past the end."""
    if length == 0:
        return b""
    for r, data in parts:
        if r.start <= offset < r.stop:
            return data[offset - r.start:min(offset + length, r.stop) - r.start]
    return b""  # the server dropped it as unsatisfiable: it starts past the end


def _stat_from_headers(path: str, response: aiohttp.ClientResponse) -> ObjectStat:
    length = response.headers.get("Content-Length")
    etag = response.headers.get("ETag")
    if length is None or not length.isdigit() or etag is None:
        raise HubspokeError(
            f"HEAD {path!r}: answer lacks Content-Length or ETag", path=path,
            status=response.status,
        )
    return ObjectStat(path, int(length), etag, _last_modified(response))


def _last_modified(response: aiohttp.ClientResponse) -> float | None:
    value = response.headers.get("Last-Modified")
    when = None if value is None else parse_http_date(value)
    return None if when is None else float(when)


def _listing(body: bytes, prefix: str) -> list[ObjectStat]:
    """The entries of a JSON ``/list`` answer."""
    try:
        data = json.loads(body)
        entries = [
            ObjectStat(str(e["path"]), int(e["size"]), str(e["etag"])) for e in data["objects"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        message = f"listing {prefix!r}: malformed answer ({exc!r})"
        raise HubspokeError(message, path=prefix) from None
    return sorted(entries, key=lambda e: e.path)


# --- the synchronous client ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Settings:
    endpoint: str
    max_retries: int
    max_retry_wait_s: float
    connect_timeout_s: float
    read_timeout_s: float
    max_connections: int
    token: str | None = None
    plan: str | None = None

    def make(self) -> AsyncClient:
        client = AsyncClient(
            self.endpoint,
            max_retries=self.max_retries,
            max_retry_wait_s=self.max_retry_wait_s,
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_connections=self.max_connections,
            token=self.token,
        )
        client.use_plan(self.plan)
        return client


class _Runtime:
    """One process's event loop, running in a daemon thread, and the AsyncClient on it."""

    def __init__(self, settings: _Settings) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.client = settings.make()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hubspoke-client", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result in the calling thread."""
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise RuntimeError("the sync Client cannot be called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: do not leave the request running
            raise

    def close(self) -> None:
        """Close the session and stop the loop thread; a no-op in a forked child."""
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        if threading.get_ident() == self._thread.ident:
            # A finaliser running on our own loop cannot wait for it; finish from inside.
            task = self.loop.create_task(self.client.aclose())
            task.add_done_callback(lambda _: self.loop.stop())
            return
        try:
            asyncio.run_coroutine_threadsafe(self.client.aclose(), self.loop).result()
        finally:
            # Stopped only after the result is delivered: a loop stopped from inside the
            # coroutine would never run the callback that completes our future.
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()


_LOCK = threading.Lock()


def _reset_lock() -> None:
    # A fork while another thread held the lock would leave it held forever in the child.
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock)


class Client:
    """The :class:`AsyncClient` API for synchronous code, plus :meth:`open`.

    Each process gets its own event loop thread and session, created on first use,
    so an instance made before ``fork`` (DataLoader workers) works in the children,
    and a pickled instance (``spawn`` workers) reconnects on arrival. Safe to share
    between threads. Do not call it from a coroutine running on the loop that serves
    the endpoint: it blocks its caller until the answer arrives.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        max_retries: int = 5,
        max_retry_wait_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        max_connections: int = 64,
        token: str | None = None,
    ) -> None:
        if max_retries < 0 or max_retry_wait_s < 0:
            raise ValueError("max_retries and max_retry_wait_s must not be negative")
        self._settings = _Settings(
            endpoint.rstrip("/"), max_retries, max_retry_wait_s, connect_timeout_s,
            read_timeout_s, max_connections, token,
        )
        self._runtime: _Runtime | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def endpoint(self) -> str:
        return self._settings.endpoint

    def __getstate__(self) -> dict[str, object]:
        return {"settings": self._settings}

    def __setstate__(self, state: dict[str, object]) -> None:
        settings = state["settings"]
        assert isinstance(settings, _Settings)
        self._settings = settings
        self._runtime = None
        self._finalizer = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this process's session and loop thread; the client reopens on next use."""
        with _LOCK:
            finalizer, self._finalizer, self._runtime = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    def read(
        self, path: str, offset: int = 0, length: int = -1, *, etag: str | None = None,
        plan: str | None = None,
    ) -> bytes:
        """See :meth:`AsyncClient.read`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.read(path, offset, length, etag=etag, plan=plan))

    def read_many(
        self, path: str, ranges: Sequence[tuple[int, int]], *, etag: str | None = None,
        plan: str | None = None,
    ) -> list[bytes]:
        """See :meth:`AsyncClient.read_many`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.read_many(path, ranges, etag=etag, plan=plan))

    def read_objects(
        self, wanted: Sequence[tuple[str, Sequence[tuple[int, int]], str | None, str | None]],
    ) -> list[list[bytes]]:
        """See :meth:`AsyncClient.read_objects`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.read_objects(wanted))

    def create_plan(
        self, reads: Sequence[tuple[str, int, int]], *, job: str | None = None
    ) -> str:
        """See :meth:`AsyncClient.create_plan`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.create_plan(reads, job=job))

    def delete_plan(self, plan_id: str) -> bool:
        """See :meth:`AsyncClient.delete_plan`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.delete_plan(plan_id))

    def use_plan(self, plan_id: str | None) -> None:
        """See :meth:`AsyncClient.use_plan`; applies in every process using this client."""
        with _LOCK:
            self._settings = dataclasses.replace(self._settings, plan=plan_id)
            if self._runtime is not None:
                self._runtime.client.use_plan(plan_id)

    def stat(self, path: str) -> ObjectStat:
        """See :meth:`AsyncClient.stat`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.stat(path))

    def list(self, prefix: str = "") -> list[ObjectStat]:
        """See :meth:`AsyncClient.list`."""
        runtime = self._runtime_now()
        return runtime.run(runtime.client.list(prefix))

    def open(self, path: str, buffer_size: int = DEFAULT_BUFFER_SIZE) -> io.BufferedReader:
        """A buffered binary file over ``path``, pinned to the version current now.

        Raises :class:`ObjectNotFound` at once for a missing object; later reads
        raise :class:`VersionChanged` if the object is replaced.
        """
        return io.BufferedReader(self.open_raw(path), buffer_size=buffer_size)

    def open_raw(self, path: str) -> ObjectFile:
        """The unbuffered file under :meth:`open`: every read is one range request."""
        return ObjectFile(self, self.stat(path))

    def _runtime_now(self) -> _Runtime:
        """This process's runtime, started on first use (and again after a fork)."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid():
            return runtime
        with _LOCK:
            runtime = self._runtime
            if runtime is not None and runtime.pid == os.getpid():
                return runtime
            if runtime is not None:
                # The parent's loop thread does not exist here; keep its objects alive
                # rather than let them be collected with warnings, and start afresh.
                _INHERITED.append(runtime)
            runtime = _Runtime(self._settings)
            self._runtime = runtime
            # Close on garbage collection or interpreter exit, whichever comes first.
            self._finalizer = weakref.finalize(self, runtime.close)
            return runtime


class ObjectFile(io.RawIOBase):
    """A read-only, seekable raw file over one version of an object.

    Every read is a range request carrying ``If-Match`` with the version's ETag; if
    the object has changed since, the read raises :class:`VersionChanged`. Reads
    past the end return short or empty results, as with a local file.
    """

    def __init__(self, client: Client, stat: ObjectStat) -> None:
        super().__init__()
        self._client = client
        self.stat = stat
        self._pos = 0

    @property
    def name(self) -> str:
        return self.stat.path

    @property
    def mode(self) -> str:
        return "rb"

    @property
    def size(self) -> int:
        return self.stat.size

    @property
    def etag(self) -> str:
        return self.stat.etag

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        """Move to ``offset`` from the start, current position or end; past the end is
        allowed (reads there return ``b""``), before the start is ``ValueError``."""
        self._check_open()
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._pos + offset
        elif whence == io.SEEK_END:
            target = self.stat.size + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if target < 0:
            raise ValueError(f"negative seek position {target}")
        self._pos = target
        return target

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """Fill ``buffer`` from the current position; returns the bytes read (0 at EOF)."""
        self._check_open()
        with memoryview(buffer) as view, view.cast("B") as target:
            data = self._fetch(len(target))
            target[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        """The rest of the object in one request."""
        self._check_open()
        return self._fetch(max(0, self.stat.size - self._pos))

    def _fetch(self, wanted: int) -> bytes:
        """Up to ``wanted`` bytes from the current position, which it advances."""
        n = min(wanted, self.stat.size - self._pos)
        if n <= 0:
            return b""
        data = self._client.read(self.stat.path, self._pos, n, etag=self.stat.etag)
        if len(data) != n:
            # The pinned version has a known size, so a short answer is a fault.
            raise HubspokeError(
                f"{self.stat.path!r}: asked for {n} bytes at {self._pos}, got {len(data)}",
                path=self.stat.path,
            )
        self._pos += n
        return data

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


__all__ = [
    "AsyncClient",
    "Client",
    "HubspokeError",
    "InvalidPath",
    "ObjectFile",
    "ObjectNotFound",
    "ObjectStat",
    "Unavailable",
    "VersionChanged",
]
