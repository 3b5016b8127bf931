"""The hub's objects from an S3-compatible bucket: a blocking :class:`hub.backend.Backend`.

botocore's own client, called from the hub's executor threads (the seam is blocking).
obstore was measured first and refuses the ranged answers ``rclone serve s3`` gives (200
with a Content-Range, not 206); aiobotocore would need a loop of its own behind this
seam for no gain (``python -m loadtest.bench_s3_clients``).

Versions come from the store. An object's ETag is the hub's ETag; every ranged GET
carries ``If-Match`` with it (and the VersionId when the bucket keeps versions), and the
answer's own ETag and Content-Range are checked too, since some stores (rclone's) ignore
``If-Match``. An object the store gives no strong ETag is not served: without one no read
can be pinned to a version. Bytes of a GET are counted against its Content-Length: a
short or cut body fails the read, it never yields fewer bytes than asked.

A spoke's chunk fill (one range, ``If-Match``) is the hot path: it goes as a presigned
GET through botocore's own connection pool, without botocore's per-request machinery,
and falls back to the client's ``get_object`` (its retries, its errors) on any answer
but the range. Its body is read with ``readinto`` or handed to :mod:`hub.relay` to
splice off the socket.
"""

from __future__ import annotations

import asyncio
import calendar
import io
import logging
import os
import re
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException
from typing import Any

import botocore.session
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from botocore.utils import parse_timestamp
from cachetools import TTLCache
from urllib3.exceptions import HTTPError as Urllib3Error

from hub.backend import NoSuchObject, ObjectInfo
from hub.manifests import ObjectChanged
from hub.store.plain import LoopAnswer, LoopGets, PlainGets
from hub.store.url import StoreRoot
from protocol.conditional import NS, parse_http_date
from protocol.errors import ProtocolError, no_object
from protocol.paths import validate_path, validate_prefix
from protocol.ranges import parse_content_range

logger = logging.getLogger(__name__)

# botocore's "standard" retry mode: exponential backoff with full jitter, and it retries
# throttling (503 SlowDown), 5xx answers and dropped connections alike.
MAX_ATTEMPTS = 3
# Keys per ListObjectsV2 page (the most S3 returns).
LIST_PAGE_KEYS = 1000
# Connections to the store kept open, and threads that wait on its answers: as many
# reads in flight as connections (an executor of the CPU count's size would cap the
# reads in flight far lower, each waiting on the store's first byte). The fills the
# event loop sends itself (hub.store.plain.LoopGets) are held to as many.
STORE_CONNECTIONS = 64
# A presigned GET URL is signed for this long and reused for a fraction of it, so
# it is never sent close to its expiry (or long after the credentials it embeds).
PRESIGNED_EXPIRES_S = 900
PRESIGNED_REUSE_S = 60.0
# Keys whose presigned URL is kept.
PRESIGNED_KEYS = 4096
# How long a client told "store unavailable" should wait before it asks again.
RETRY_AFTER_S = 2.0


Page = list[ObjectInfo]
# The one-range requests a spoke makes for a chunk; anything else is opened with a HEAD.
_ONE_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{1,19})", re.ASCII)


class StoreUnavailable(ProtocolError):
    """The store did not answer, or answered 5xx after retries: try again later."""

    status_hint = 503
    title = "Service Unavailable"
    retry_after_s = RETRY_AFTER_S


class StoreRefused(ProtocolError):
    """The store answered, but not with the object (credentials, a bad answer)."""

    status_hint = 502
    title = "Bad Gateway"


class StoreStartupError(Exception):
    """The root cannot be served; the message is one line naming endpoint and bucket."""


def _config(timeout_s: float, path_style: bool) -> Config:
    return Config(
        connect_timeout=timeout_s, read_timeout=timeout_s,
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        # A ranged GET of an object uploaded with a CRC32 would fail otherwise: some
        # stores (rclone) send the whole object's checksum on a ranged answer.
        response_checksum_validation="when_required",
        request_checksum_calculation="when_required",
        max_pool_connections=STORE_CONNECTIONS,
        # Presigned URLs (open_for_request's GET) are SigV4 like every other request.
        signature_version="s3v4",
        s3={"addressing_style": "path"} if path_style else None,
    )


def endpoint_from(flag: str | None, env: Mapping[str, str]) -> str | None:
    """``--s3-endpoint``, else the standard variables, S3's own first; None: AWS's."""
    return flag or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def make_client(endpoint: str | None, env: Mapping[str, str], timeout_s: float) -> Any:
    """A botocore S3 client configured from the standard AWS environment in ``env``."""
    session = botocore.session.Session()
    if env.get("AWS_PROFILE"):
        session.set_config_variable("profile", env["AWS_PROFILE"])
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    keys: dict[str, str] = {}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        keys = {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"]}
        if env.get("AWS_SESSION_TOKEN"):
            keys["aws_session_token"] = env["AWS_SESSION_TOKEN"]
    return session.create_client(
        "s3", endpoint_url=endpoint, region_name=region or session.get_config_variable("region")
        or "us-east-1", config=_config(timeout_s, endpoint is not None), **keys,
    )


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return -1


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mtime_ns(head: Mapping[str, Any]) -> int:
    modified = head.get("LastModified")
    return calendar.timegm(modified.utctimetuple()) * NS if modified is not None else 0


def _strong_etag(etag: object) -> str | None:
    """The store's ETag if it is a strong one, quoted; None otherwise.

    Some stores (rclone) list ETags without their quotes while HEAD and GET quote them:
    a bare one is quoted here, so a listing names the same version a HEAD does.
    """
    if not isinstance(etag, str) or not etag or etag.startswith("W/") or not etag.isascii():
        return None
    if not (len(etag) >= 2 and etag[0] == etag[-1] == '"'):
        etag = f'"{etag}"'
    inner = etag[1:-1]
    if not inner or any(c in inner for c in '"\r\n\\ ') or not inner.isprintable():
        return None
    return etag


class S3Backend:
    """Objects are the keys under ``root.prefix`` in ``root.bucket``, named without it."""

    def __init__(self, client: Any, root: StoreRoot) -> None:
        self.client = client
        self.root = root
        self.endpoint = str(client.meta.endpoint_url)
        # key -> its presigned GET URL, for PRESIGNED_REUSE_S after it was signed.
        self._presigned: TTLCache[str, str] = TTLCache(PRESIGNED_KEYS, PRESIGNED_REUSE_S)
        self._presigned_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        config = client.meta.config
        # A store over plain HTTP, no proxy: fills' GETs skip botocore's and urllib3's
        # send, from a thread or (a spoke's fill on the fast path) from the loop.
        self._plain = PlainGets.for_endpoint(self.endpoint, config.proxies,
                                             float(config.read_timeout))
        self.loop_gets = LoopGets.for_endpoint(self.endpoint, config.proxies,
                                               float(config.read_timeout), STORE_CONNECTIONS)

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The threads the hub opens this store's objects in (one GET's wait each)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(STORE_CONNECTIONS, thread_name_prefix="hub-store")
        return self._executor

    @property
    def scope(self) -> str:
        """What the digest index files this store's objects under."""
        return f"{self.endpoint}/{self.root.bucket}/{self.root.prefix}"

    def describe(self) -> str:
        return f"bucket {self.root.bucket!r} at {self.endpoint}"

    def check(self) -> None:
        """Fail (:class:`StoreStartupError`) unless the bucket exists and lets us list it."""
        where = self.describe()
        try:
            self.client.list_objects_v2(Bucket=self.root.bucket, Prefix=self.root.prefix,
                                        MaxKeys=1)
        except ClientError as exc:
            status, code = _status(exc), _code(exc)
            if status == 404 or code == "NoSuchBucket":
                raise StoreStartupError(f"no {where}") from None
            if status in (401, 403):
                raise StoreStartupError(
                    f"{self.endpoint} refused the credentials for bucket {self.root.bucket!r}"
                    f" ({code or status})") from None
            raise StoreStartupError(f"{where} answered {status} {code}") from None
        except NoCredentialsError:
            raise StoreStartupError(
                f"no AWS credentials found for {where} (AWS_ACCESS_KEY_ID, AWS_PROFILE...)"
            ) from None
        except (BotoConnectionError, HTTPClientError) as exc:
            raise StoreStartupError(f"cannot reach {where}: {exc}") from None
        except BotoCoreError as exc:
            raise StoreStartupError(f"{where}: {exc}") from None

    def _key(self, path: str) -> str:
        return self.root.prefix + validate_path(path)

    def _head(self, path: str) -> tuple[ObjectInfo, str | None]:
        try:
            head = self.client.head_object(Bucket=self.root.bucket, Key=self._key(path))
        except ClientError as exc:
            if _status(exc) == 404:
                raise NoSuchObject(no_object(path)) from None
            raise _answer_error(exc, path) from None
        except BotoCoreError as exc:
            raise _unavailable(exc, path) from None
        etag = _strong_etag(head.get("ETag"))
        if etag is None:
            raise StoreRefused(f"the store gave no strong ETag for {path!r}: not served, "
                               "no read of it could be pinned to one version")
        version = head.get("VersionId")
        info = ObjectInfo(path, int(head["ContentLength"]), etag, _mtime_ns(head))
        return info, version if isinstance(version, str) and version != "null" else None

    def stat(self, path: str) -> ObjectInfo:
        return self._head(path)[0]

    def open(self, path: str) -> S3Object:
        info, version = self._head(path)
        return S3Object(self, info, version)

    def open_for_request(
        self, path: str, if_match: str | None, range_value: str | None
    ) -> S3Object:
        """:meth:`open`, with one request instead of two for a spoke's chunk fill.

        A request for one range of the version it names (``If-Match``) is sent to the
        store as it is: the answer gives the version, its size, and the bytes, already
        streaming. Anything else, and any answer but that range (412, 416, 404), goes
        the way of :meth:`open`, whose HEAD lets the hub answer it as for a file.
        """
        fill = _fill_request(if_match, range_value)
        if fill is None:
            return self.open(path)
        etag, start = fill
        fast = self._presigned_get(path, range_value or "", etag)
        if fast is not None:
            status, headers, body = fast
        else:
            args: dict[str, Any] = {"Bucket": self.root.bucket, "Key": self._key(path),
                                    "Range": range_value, "IfMatch": etag}
            try:
                answer = self.client.get_object(**args)
            except ClientError:
                return self.open(path)
            except BotoCoreError as exc:
                raise _unavailable(exc, path) from None
            status, body = 206, answer["Body"]
            headers = {"Content-Range": answer.get("ContentRange", ""),
                       "ETag": answer.get("ETag"),
                       "Content-Length": answer.get("ContentLength", -1),
                       "x-amz-version-id": answer.get("VersionId"),
                       "Last-Modified": answer.get("LastModified")}
        obj = self._answered(path, start, status, headers, body)
        return obj if obj is not None else self.open(path)

    def close_connections(self) -> None:
        """Close the store connections kept for fills (the hub is stopping)."""
        if self._plain is not None:
            self._plain.close()
        if self.loop_gets is not None:
            self.loop_gets.close()

    def open_fill(
        self, path: str, if_match: str | None, range_value: str | None
    ) -> S3Object | None:
        """A spoke's chunk fill as one presigned GET, its range already streaming; None
        when the request is not one, or the store's answer is not that range (nothing
        else is asked of the store: :meth:`open_for_request` answers those)."""
        fill = _fill_request(if_match, range_value)
        if fill is None:
            return None
        etag, start = fill
        fast = self._presigned_get(path, range_value or "", etag)
        return None if fast is None else self._answered(path, start, *fast)

    async def loop_get(
        self, path: str, etag: str, range_value: str
    ) -> tuple[LoopAnswer, ObjectInfo, tuple[int, int]] | None:
        """A spoke's chunk fill as one presigned GET sent from the event loop: the
        store's answer (its body still on the socket), the version it is of and the
        span ``[start, stop)`` it carries; None (the answer closed) unless it is the
        range asked for, framed by its Content-Length, of a version with a strong ETag
        (as :meth:`open_fill`). Only a store :attr:`loop_gets` reaches is asked."""
        fill = _fill_request(etag, range_value)
        if self.loop_gets is None or fill is None:
            return None
        etag, start = fill
        url = self._cached_url(path)
        if url is None:
            url = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._signed_now, path)
            if url is None:
                return None
        answer = await self.loop_gets.get(url, {"Range": range_value, "If-Match": etag})
        if answer is None:
            return None
        answered = _answered_range(path, start, answer.status, answer.fields)
        if answered is None or answer.content_length is None \
                or len(answer.ahead) > answer.content_length:
            answer.finish(whole=False)
            return None
        info, stop = answered
        return answer, info, (start, stop)

    def _signed_now(self, path: str) -> str | None:
        try:
            return self._presigned_url(path)
        except (BotoCoreError, ValueError):
            return None

    def _answered(
        self, path: str, start: int, status: int, headers: Mapping[str, Any], body: Any
    ) -> S3Object | None:
        """The object a GET of one range from ``start`` answered, reading its body;
        None (the body closed) unless it is that range, of a version with a strong ETag."""
        answered = _answered_range(path, start, status, headers)
        if answered is None:
            body.close()
            return None
        info, stop = answered
        version = headers.get("x-amz-version-id")
        obj = S3Object(self, info, version if isinstance(version, str) and version != "null"
                       else None)
        obj.adopt(body, start, stop)
        return obj

    def _presigned_get(
        self, path: str, range_value: str, etag: str
    ) -> tuple[int, Mapping[str, Any], Any] | None:
        """A GET of ``path`` by a presigned URL, sent through botocore's own connection
        pool: its status, headers and streaming body; None if it could not be sent.

        botocore's request machinery (events, signing, parsing) costs the hub as much
        CPU as the bytes' copies do; a URL signed once per key and reused for a while
        skips it. Only ``host`` is signed in it, so ``Range`` and ``If-Match`` travel
        as plain headers. Whatever this answer lacks (an error, a throttle, an expired
        credential), the caller goes botocore's way, with its retries.
        """
        session = getattr(getattr(self.client, "_endpoint", None), "http_session", None)
        if session is None:
            return None
        try:
            url = self._presigned_url(path)
            fields = {"Range": range_value, "If-Match": etag}
            if self._plain is not None:
                answer = self._plain.get(url, fields)
                if answer is None:
                    return None
                status, headers, body = answer
            else:
                request = AWSRequest(method="GET", url=url, stream_output=True, headers=fields)
                response = session.send(request.prepare())
                status, headers, body = response.status_code, response.headers, response.raw
        except (BotoCoreError, Urllib3Error, OSError, ValueError):
            return None
        if status not in (200, 206):
            body.close()
            return None
        return status, headers, body

    def _cached_url(self, path: str) -> str | None:
        """The presigned GET URL of ``path`` if one was signed in the last
        :data:`PRESIGNED_REUSE_S`; None otherwise (signing may need the credential
        provider's I/O: the event loop asks this, and signs in a thread)."""
        with self._presigned_lock:
            return self._presigned.get(self._key(path))

    def _presigned_url(self, path: str) -> str:
        """A presigned GET URL of ``path``, signed once per :data:`PRESIGNED_REUSE_S`."""
        url = self._cached_url(path)
        if url is None:
            key = self._key(path)
            url = str(self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.root.bucket, "Key": key},
                ExpiresIn=PRESIGNED_EXPIRES_S))
            with self._presigned_lock:
                self._presigned[key] = url
        return url

    def still_current(self, info: ObjectInfo) -> bool:
        try:
            return self.stat(info.path).etag == info.etag
        except ProtocolError:
            return False

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, page by page (one page in memory at a time).

        The first page is asked for before this returns, so a store that is down fails
        the listing before any of its answer is sent.
        """
        validate_prefix(prefix)
        pages = self._pages(prefix)
        first = next(pages, None)
        return self._objects(first, pages)

    def _objects(
        self, first: Page | None, pages: Iterator[Page]
    ) -> Iterator[ObjectInfo]:
        if first is None:
            return
        yield from first
        for page in pages:
            yield from page

    def _pages(self, prefix: str) -> Iterator[Page]:
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.root.bucket, "MaxKeys": LIST_PAGE_KEYS,
                                    "Prefix": self.root.prefix + prefix}
            if token:
                args["ContinuationToken"] = token
            try:
                page = self.client.list_objects_v2(**args)
            except ClientError as exc:
                raise _answer_error(exc, prefix) from None
            except BotoCoreError as exc:
                raise _unavailable(exc, prefix) from None
            yield [info for item in page.get("Contents", []) if (info := self._listed(item))]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _listed(self, item: Mapping[str, Any]) -> ObjectInfo | None:
        path = str(item["Key"])[len(self.root.prefix):]
        etag = _strong_etag(item.get("ETag"))
        try:
            validate_path(path)
        except ProtocolError:
            return None  # a "folder/" marker or a name no client could ask for
        if etag is None:
            return None  # not served (see _head): not listed either
        return ObjectInfo(path, int(item["Size"]), etag, _mtime_ns(item))


def _answered_range(
    path: str, start: int, status: int, headers: Mapping[str, Any]
) -> tuple[ObjectInfo, int] | None:
    """The version a store's answer to a GET of one range from ``start`` is of, and
    where the range stops; None unless it is that range (its Content-Range, its
    Content-Length) of a version with a strong ETag."""
    got = parse_content_range(str(headers.get("Content-Range", "")))
    answer_etag = _strong_etag(headers.get("ETag"))
    if (status not in (200, 206) or got is None or got.range is None or got.size is None
            or got.range.start != start or answer_etag is None
            or _int(headers.get("Content-Length")) != got.range.length):
        return None
    return ObjectInfo(path, got.size, answer_etag, _answer_mtime_ns(headers)), got.range.stop


def _answer_mtime_ns(headers: Mapping[str, Any]) -> int:
    """An answer's Last-Modified: a datetime (botocore's parse) or the field as sent,
    read as the HTTP-date it is (dateutil's every-format parser costs a chunk fill more
    than the rest of its headers) and any other format by botocore's parse."""
    modified = headers.get("Last-Modified")
    if isinstance(modified, str):
        seconds = parse_http_date(modified)
        if seconds is not None:
            return seconds * NS
        modified = parse_timestamp(modified)
    return _mtime_ns({"LastModified": modified})


def _fill_request(if_match: str | None, range_value: str | None) -> tuple[str, int] | None:
    """The version (a strong ETag) and first byte a spoke's chunk fill names; None if
    the request is not one (no ``If-Match``, not one ``bytes=a-b`` range)."""
    etag = _strong_etag(if_match) if if_match and if_match.startswith('"') else None
    match = _ONE_RANGE.fullmatch(range_value or "")
    if etag is None or match is None or int(match[1]) > int(match[2]):
        return None
    return etag, int(match[1])


def _unavailable(exc: Exception, path: str) -> StoreUnavailable:
    return StoreUnavailable(f"object store unavailable reading {path!r}: {type(exc).__name__}")


def _answer_error(exc: ClientError, path: str) -> ProtocolError:
    status, code = _status(exc), _code(exc)
    if status == 412:
        return ObjectChanged(f"{path} changed while it was read; retry")
    if status == 404:
        return NoSuchObject(no_object(path))
    if status >= 500 or code in ("SlowDown", "Throttling"):
        return StoreUnavailable(f"object store answered {status} {code} for {path!r}")
    return StoreRefused(f"object store answered {status} {code} for {path!r}")


class S3Object:
    """One version of one key. Reads come from ranged GETs pinned to that version.

    :meth:`will_read` announces a span about to be read in order (a range being sent, a
    digest pass): its reads then come from one streamed GET instead of one per block.
    """

    def __init__(self, backend: S3Backend, info: ObjectInfo, version: str | None) -> None:
        self._backend = backend
        self.info = info
        self.version = version
        self._span: tuple[int, int] | None = None
        self._body: Any = None
        self._body_at = 0
        self._lock = threading.Lock()

    @property
    def span(self) -> tuple[int, int] | None:
        """The span announced or adopted: ``[start, stop)`` of the GET it reads from."""
        return self._span

    def will_read(self, start: int, stop: int) -> None:
        """The next reads are of ``[start, stop)``, in order (no I/O until the first)."""
        span = (start, min(stop, self.info.size))
        if span == self._span and self._body is not None and self._body_at == start:
            return  # that GET is open already (:meth:`S3Backend.open_for_request`)
        self._drop_body()
        self._span = span

    def adopt(self, body: Any, start: int, stop: int) -> None:
        """Read ``[start, stop)`` from ``body``, a GET of this version already answered."""
        self._drop_body()
        self._span = (start, stop)
        self._body, self._body_at = body, start

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self.info.size - offset))
        if length == 0:
            return b""
        buffer = bytearray(length)
        self.readinto(offset, memoryview(buffer))
        return bytes(buffer)

    def readinto(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` with the bytes from ``offset``, all of them or an error.

        The copy the hub sends from: the store's socket is read straight into it
        (no bytes object per block), and a block cut short fails, never pads.
        """
        length = len(view)
        if length == 0:
            return
        if offset + length > self.info.size:
            raise ValueError(f"read past the end of {self.info.path!r}")
        with self._lock:
            span = self._span
            if span is not None and span[0] <= offset and offset + length <= span[1]:
                if self._body is None or self._body_at != offset:
                    self._drop_body()
                    self._body = self._get(offset, span[1] - offset)
                    self._body_at = offset
                self._fill(view)
                self._body_at += length
                if self._body_at >= span[1]:
                    self._drop_body(complete=True)
                return
            self._body = self._get(offset, length)
            complete = False
            try:
                self._fill(view)
                complete = True
            finally:
                self._drop_body(complete)

    def socket_body(self, offset: int, count: int) -> tuple[bytes, int, float | None] | None:
        """The socket of the GET of ``[offset, offset + count)`` (the span announced),
        for the caller to move the body off it (a splice): the bytes of it already read
        off the socket, a duplicate of its descriptor (the caller's to close), its read
        timeout; None where it cannot be (TLS, a chunked answer).

        The body is then the caller's. Its connection is closed after, unless the
        caller moved it all (:meth:`moved`): then it goes back to the pool.
        """
        with self._lock:
            if self._span != (offset, offset + count):
                return None
            if self._body is None or self._body_at != offset:
                self._drop_body()
                self._body = self._get(offset, count)
                self._body_at = offset
            raw = getattr(self._body, "_raw_stream", self._body)
            source = getattr(raw, "_fp", None)
            buffered = getattr(source, "fp", None)
            sock = getattr(getattr(raw, "connection", None), "sock", None)
            if (not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket)
                    or getattr(source, "chunked", True) or not isinstance(
                        buffered, io.BufferedReader)):
                return None
            try:
                ahead = buffered.peek(1)[:count]  # what reading the headers took in
                buffered.read(len(ahead))
            except (OSError, ValueError) as exc:
                self._drop_body()
                raise StoreUnavailable(
                    f"object store cut the body of {self.info.path!r}: {type(exc).__name__}"
                ) from None
            self._body_at = offset + count
            return ahead, os.dup(sock.fileno()), sock.gettimeout()

    def moved(self) -> None:
        with self._lock:
            raw = getattr(self._body, "_raw_stream", self._body)
            source = getattr(raw, "_fp", None)
            if source is None:
                return
            # http.client counts the body it reads; it read none of the moved one. Its
            # count is set to what is left (nothing), and the read of that ends it as
            # its own read of the last byte would have: the connection is reusable.
            source.length = 0
            source.read()
            self._drop_body(complete=True)

    def _get(self, offset: int, length: int) -> Any:
        backend, info = self._backend, self.info
        args: dict[str, Any] = {
            "Bucket": backend.root.bucket, "Key": backend.root.prefix + info.path,
            "Range": f"bytes={offset}-{offset + length - 1}", "IfMatch": info.etag,
        }
        if self.version is not None:
            args["VersionId"] = self.version
        try:
            answer = backend.client.get_object(**args)
        except ClientError as exc:
            raise _answer_error(exc, info.path) from None
        except BotoCoreError as exc:
            raise _unavailable(exc, info.path) from None
        body = answer["Body"]
        expected = f"bytes {offset}-{offset + length - 1}/{info.size}"
        same_version = _strong_etag(answer.get("ETag")) == info.etag
        if not same_version or (
            answer.get("ContentRange") not in (expected, None)
            or int(answer.get("ContentLength", -1)) != length
        ):
            body.close()
            if not same_version:
                raise ObjectChanged(f"{info.path} changed while it was read; retry")
            raise StoreRefused(f"the store answered another range than {expected} "
                               f"for {info.path!r}")
        return body

    def _fill(self, view: memoryview) -> None:
        """All of ``view`` from the open GET, or an error (a short body, a reset)."""
        length = len(view)
        got = 0
        raw = getattr(self._body, "_raw_stream", self._body)
        # urllib3's own readinto reads a bytes object and copies it; http.client's
        # reads the socket into the buffer given, and still counts the body's length.
        source = getattr(raw, "_fp", None)
        try:
            while got < length:
                if source is not None:
                    n = source.readinto(view[got:])
                else:
                    part = self._body.read(length - got)
                    n = len(part)
                    view[got:got + n] = part
                if not n:
                    break
                got += n
        except (BotoCoreError, Urllib3Error, HTTPException, OSError, ValueError) as exc:
            self._drop_body()
            raise StoreUnavailable(
                f"object store cut the body of {self.info.path!r}: {type(exc).__name__}"
            ) from None
        if got != length:
            self._drop_body()
            raise StoreUnavailable(f"object store sent a short body for {self.info.path!r}")

    def _drop_body(self, complete: bool = False) -> None:
        """Close the open GET; ``complete``: it was read to its end, without error."""
        body, self._body = self._body, None
        if body is None:
            return
        raw = getattr(body, "_raw_stream", body)
        source = getattr(raw, "_fp", None)
        if complete and source is not None and source.isclosed():
            # Read to its end through http.client: the connection goes back to the
            # pool, as urllib3 would have done had it read the end itself.
            raw.release_conn()
        body.close()

    def close(self) -> None:
        with self._lock:
            self._drop_body()
            self._span = None


def open_store(
    root: StoreRoot, endpoint: str | None, env: Mapping[str, str], timeout_s: float
) -> S3Backend:
    """A checked backend over ``root``; :class:`StoreStartupError` if it cannot serve."""
    try:
        client = make_client(endpoint_from(endpoint, env), env, timeout_s)
    except ProfileNotFound as exc:
        raise StoreStartupError(f"{exc} (for bucket {root.bucket!r})") from None
    except (BotoCoreError, ValueError) as exc:
        raise StoreStartupError(f"bucket {root.bucket!r}: {exc}") from None
    backend = S3Backend(client, root)
    backend.check()
    return backend
