"""HubClient: the spoke's only way to the hub; owns the one aiohttp session.

Foreign failures are translated here, once: aiohttp errors and timeouts become
:mod:`spoke.errors` types that carry the status a loader should see.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

import aiohttp

from protocol.errors import BadPath
from protocol.manifest import Manifest, decode_manifest
from protocol.ranges import ByteRange, range_header
from service.logs import REQUEST_ID_HEADER, request_id
from spoke.errors import (
    BadGateway,
    HubRefused,
    HubTimeout,
    HubUnavailable,
    ObjectNotFound,
    VersionChanged,
)

logger = logging.getLogger(__name__)


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
            auto_decompress=False, headers=self._headers,
        )

    async def close(self) -> None:
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

    async def fetch_range(self, path: str, etag: str, r: ByteRange) -> bytes:
        """Bytes ``r`` of version ``etag`` of ``path``; never fewer, never another version."""
        headers = {"Range": range_header(r), "If-Match": etag}
        async with self._get(self._url("objects", path), headers) as response:
            await _expect(response, (200, 206), path)
            if response.headers.get("ETag") != etag:
                raise VersionChanged(f"{path} changed at the hub")
            body = await response.read()
        if response.status == 200:
            body = body[r.start : r.stop]  # a hub may ignore Range for a whole-object read
        if len(body) != r.length:
            raise BadGateway(f"hub sent {len(body)} bytes of {path} for a {r.length}-byte range")
        return body

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


async def _expect(response: aiohttp.ClientResponse, ok: tuple[int, ...], path: str) -> None:
    if response.status in ok:
        return
    if response.status == 404:
        raise ObjectNotFound(f"no object {path!r} at the hub")
    if response.status == 412:
        raise VersionChanged(f"{path} changed at the hub")
    if response.status == 400:
        # The hub refused the path (e.g. it escapes the root): the loader's fault.
        raise BadPath(f"hub refused {path!r}: {(await response.text())[:200]}")
    if response.status in (401, 403):
        # The spoke's own credentials, not the loader's: say which flag to look at.
        detail = (await response.text())[:200]
        raise HubRefused(f"hub answered {response.status} to the spoke's token for {path!r} "
                         f"(check --hub-token-file): {detail}")
    if 400 <= response.status < 500:
        detail = (await response.text())[:200]
        raise HubRefused(f"hub answered {response.status} for {path!r}: {detail}")
    if response.status in (502, 503, 504):
        raise HubUnavailable(f"hub answered {response.status} for {path!r}")
    raise BadGateway(f"hub answered {response.status} for {path!r}")


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
