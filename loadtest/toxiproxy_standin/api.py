"""Toxiproxy's HTTP API: its routes, middlewares and replies, byte for byte where it matters."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from loadtest.toxiproxy_standin import gojson
from loadtest.toxiproxy_standin.errors import (
    PROXY_EXISTS,
    PROXY_NOT_FOUND,
    ApiError,
    fail,
    missing_field,
)
from loadtest.toxiproxy_standin.proxy import Proxy
from loadtest.toxiproxy_standin.toxics import apply_toxic_update, decoded, parse_new_toxic

logger = logging.getLogger(__name__)

VERSION = "2.12.0-hubspoke-standin"


JSON_TYPE = "application/json"
# Go's http.Error answers in plain text, whatever the handler set before.
TEXT_TYPE = "text/plain; charset=utf-8"
VERSION_TYPE = "application/json;charset=utf-8"
REQUEST_ID_HEADER = "X-Toxiproxy-Request-Id"
# Toxiproxy refuses browsers, so a web page cannot drive the API (a CSRF guard).
BROWSER_PREFIX = "Mozilla/"


def _json_reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=gojson.encode(data), status=status,
                        headers={"Content-Type": JSON_TYPE})  # fmt: skip


def _text_reply(text: str, status: int) -> web.Response:
    """Go's ``http.Error``: the text and a newline, as text/plain with nosniff."""
    headers = {"Content-Type": TEXT_TYPE, "X-Content-Type-Options": "nosniff"}
    return web.Response(body=f"{text}\n".encode(), status=status, headers=headers)


def _error_reply(exc: ApiError) -> web.Response:
    # Toxiproxy's apiError writes its JSON through http.Error: a JSON body, text/plain.
    body = gojson.encode({"error": exc.message, "status": exc.status}).decode()
    return _text_reply(body, exc.status)


def _request_id() -> str:
    # zerolog's hlog.RequestIDHandler stamps an xid: 12 bytes, base32hex, 20 characters.
    return base64.b32hexencode(os.urandom(12)).decode().rstrip("=").lower()


@web.middleware
async def _as_toxiproxy(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Toxiproxy's router and its middlewares, in their order.

    gorilla/mux runs route middlewares only on a match: an unknown path gets
    ``http.NotFound``'s text and a method not allowed an empty 405, with no request
    id. A match gets a request id, then browsers are refused, then the handler runs.
    """
    unmatched = request.match_info.http_exception
    if unmatched is not None:
        if unmatched.status == 405:
            return web.Response(status=405)
        return _text_reply("404 page not found", 404)
    request_id = _request_id()
    response: web.StreamResponse
    if request.headers.get("User-Agent", "").startswith(BROWSER_PREFIX):
        response = _text_reply("User agent not allowed", 403)
    else:
        try:
            response = await handler(request)
        except ApiError as exc:
            if exc.status >= 500:
                logger.warning("%s %s: %s", request.method, request.path, exc.message)
            response = _error_reply(exc)
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


@dataclass
class _ProxySpec:
    name: str
    listen: str
    upstream: str
    enabled: bool | None  # None: not given (populate's nullable field)


def _decode_proxy(body: gojson.Fields | None, current: _ProxySpec) -> _ProxySpec:
    """Decode a Proxy over ``current``, as Go decodes into a prefilled struct."""
    # The exported Logger field decodes too: only an object (or null) fits it.
    gojson.object_field(body, "Logger", "Proxy", "zerolog.Logger")
    return _ProxySpec(
        name=gojson.string_field(body, "name", "Proxy", current.name),
        listen=gojson.string_field(body, "listen", "Proxy", current.listen),
        upstream=gojson.string_field(body, "upstream", "Proxy", current.upstream),
        enabled=gojson.bool_field(body, "enabled", "Proxy", current.enabled),
    )


def _decode_proxy_body(raw: bytes, current: _ProxySpec) -> _ProxySpec:
    def decode() -> _ProxySpec:
        return _decode_proxy(gojson.struct_fields(gojson.decode(raw), "toxiproxy.Proxy"), current)

    spec: _ProxySpec = decoded(decode)
    return spec


def _decode_populate(raw: bytes) -> list[_ProxySpec]:
    def decode() -> list[_ProxySpec]:
        items = gojson.decode(raw)
        if items is None:
            return []
        if not isinstance(items, list) or isinstance(items, gojson.Fields):
            raise gojson.DecodeError(f"json: cannot unmarshal {gojson.kind(items).split()[0]} "
                                     "into Go value of type []struct")  # fmt: skip
        blank = _ProxySpec("", "", "", None)
        return [_decode_proxy(gojson.struct_fields(item, "struct"), blank) for item in items]

    specs: list[_ProxySpec] = decoded(decode)
    return specs


def _check_required(spec: _ProxySpec, where: str = "") -> None:
    if not spec.name:
        raise missing_field(f"name{where}")
    if not spec.upstream:
        raise missing_field(f"upstream{where}")


def _check_populate(specs: list[_ProxySpec]) -> None:
    """Toxiproxy 2.12 checks every entry's required fields before it changes anything."""
    for number, spec in enumerate(specs, start=1):
        _check_required(spec, f" at proxy {number}")


def _listed(proxies: list[Proxy]) -> list[dict[str, Any]] | None:
    # Go marshals the empty (nil) result list as null.
    return [proxy.to_json() for proxy in proxies] or None


class ToxiproxyServer:
    """The stand-in, in-process: ``port = await server.start(host, port)``; ``await stop()``."""

    def __init__(self) -> None:
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()  # API changes that await (listen/stop) don't interleave
        self._runner: web.AppRunner | None = None
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> int:
        app = web.Application(middlewares=[_as_toxiproxy])
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        self._runner = runner
        sockname = runner.addresses[0]
        self.host, self.port = str(sockname[0]), int(sockname[1])
        logger.info("toxiproxy stand-in API on %s", self.url)
        return self.port

    async def stop(self) -> None:
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.stop()
            self._proxies.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _add_routes(self, app: web.Application) -> None:
        proxy, toxic = "/proxies/{proxy}", "/proxies/{proxy}/toxics/{toxic}"
        routes: dict[str, dict[str, Callable[[web.Request], Awaitable[web.Response]]]] = {
            "/version": {"GET": self._version},
            "/reset": {"POST": self._reset},
            "/populate": {"POST": self._populate},
            "/proxies": {"GET": self._proxy_index, "POST": self._proxy_create},
            proxy: {"GET": self._proxy_show, "POST": self._proxy_update,
                    "PATCH": self._proxy_update, "DELETE": self._proxy_delete},
            f"{proxy}/toxics": {"GET": self._toxic_index, "POST": self._toxic_create},
            toxic: {"GET": self._toxic_show, "POST": self._toxic_update,
                    "PATCH": self._toxic_update, "DELETE": self._toxic_delete},
        }  # fmt: skip
        for path, handlers in routes.items():
            for method, handler in handlers.items():
                # add_route, unlike add_get, adds no HEAD: gorilla/mux answers HEAD 405 too.
                app.router.add_route(method, path, handler)

    def _proxy(self, request: web.Request) -> Proxy:
        proxy = self._proxies.get(request.match_info["proxy"])
        if proxy is None:
            fail(PROXY_NOT_FOUND)
        return proxy

    # ---- handlers

    async def _version(self, request: web.Request) -> web.Response:
        # Written by hand in Toxiproxy, with a space after the colon and a newline.
        body = f'{{"version": "{VERSION}"}}\n'.encode()
        return web.Response(body=body, headers={"Content-Type": VERSION_TYPE})

    async def _reset(self, request: web.Request) -> web.Response:
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.start()
                proxy.remove_all_toxics()
        return web.Response(status=204)

    async def _populate(self, request: web.Request) -> web.Response:
        raw = await request.read()
        proxies: list[Proxy] = []
        try:
            specs = _decode_populate(raw)
            _check_populate(specs)
            async with self._lock:
                # In order, one by one: a later entry that fails leaves the earlier
                # ones applied, and they are listed in the error reply.
                for spec in specs:
                    proxies.append(await self._add_or_replace(spec))
        except ApiError as exc:
            payload = {"error": exc.message, "status": exc.status, "proxies": _listed(proxies)}
            return _json_reply(payload, exc.status)
        return _json_reply({"proxies": _listed(proxies)}, 201)

    async def _add_or_replace(self, spec: _ProxySpec) -> Proxy:
        existing = self._proxies.get(spec.name)
        if existing is not None:
            if not await existing.differs(spec.listen, spec.upstream):
                return existing
            # Stopped first; it stays listed (stopped) if the new one cannot start.
            await existing.stop()
        proxy = await self._start_new(spec)
        self._proxies[spec.name] = proxy
        return proxy

    async def _start_new(self, spec: _ProxySpec) -> Proxy:
        proxy = Proxy(spec.name, spec.listen, spec.upstream)
        if spec.enabled is not False:
            await proxy.start()
        return proxy

    async def _proxy_index(self, request: web.Request) -> web.Response:
        # A Go map marshals with its keys sorted.
        return _json_reply({name: self._proxies[name].to_json() for name in sorted(self._proxies)})

    async def _proxy_create(self, request: web.Request) -> web.Response:
        spec = _decode_proxy_body(await request.read(), _ProxySpec("", "", "", True))
        _check_required(spec)
        async with self._lock:
            if spec.name in self._proxies:
                fail(PROXY_EXISTS)
            proxy = await self._start_new(spec)
            self._proxies[spec.name] = proxy
        return _json_reply(proxy.to_json(), 201)

    async def _proxy_show(self, request: web.Request) -> web.Response:
        return _json_reply(self._proxy(request).to_json())

    async def _proxy_update(self, request: web.Request) -> web.Response:
        raw = await request.read()
        async with self._lock:
            proxy = self._proxy(request)
            current = _ProxySpec(proxy.name, proxy.listen, proxy.upstream, proxy.enabled)
            spec = _decode_proxy_body(raw, current)
            await proxy.update(spec.listen, spec.upstream, bool(spec.enabled))
        return _json_reply(proxy.to_json())

    async def _proxy_delete(self, request: web.Request) -> web.Response:
        async with self._lock:
            proxy = self._proxy(request)
            await proxy.stop()
            del self._proxies[proxy.name]
        return web.Response(status=204)

    async def _toxic_index(self, request: web.Request) -> web.Response:
        return _json_reply([t.to_json() for t in self._proxy(request).ordered_toxics()])

    async def _toxic_create(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = parse_new_toxic(await request.read(), proxy.has_toxic)
        proxy.add_toxic(toxic)
        return _json_reply(toxic.to_json())

    async def _toxic_show(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        return _json_reply(proxy.find_toxic(request.match_info["toxic"]).to_json())

    async def _toxic_update(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = proxy.find_toxic(request.match_info["toxic"])
        apply_toxic_update(toxic, await request.read())
        proxy.update_toxic(toxic)
        return _json_reply(toxic.to_json())

    async def _toxic_delete(self, request: web.Request) -> web.Response:
        self._proxy(request).remove_toxic(request.match_info["toxic"])
        return web.Response(status=204)
