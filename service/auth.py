"""Bearer-token checks for hub and spoke: one middleware, configured by a route table.

Each app names what every route needs (:class:`Access`), keyed by method and route
pattern; a route missing from the table needs the admin scope, so a route added later
fails closed rather than open. Unknown paths and methods need any valid token before
they get their 404/405, so an anonymous client learns nothing but 401.

Missing or bad tokens get 401 with ``WWW-Authenticate: Bearer realm="hubspoke"``
(RFC 6750 §3); a valid token outside its prefixes or scope gets 403. Both are
problem+json. The token itself is never logged or echoed: the access log records
method, path and status only, and :mod:`protocol.auth` errors never quote it.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgpack
from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol.auth import (
    AuthError,
    BadToken,
    Claims,
    Forbidden,
    MissingToken,
    allows,
    authorize,
    authorize_admin,
    authorize_listing,
    check_secret,
    verify,
)
from protocol.errors import ProtocolError
from protocol.paths import validate_path, validate_prefix
from service.metrics import Series
from service.problem import Handler, problem_response
from service.settings import setting, settings

logger = logging.getLogger(__name__)

REALM = "hubspoke"
CLAIMS = web.RequestKey("claims", Claims)


class Access(enum.Enum):
    """What a route asks of the caller's token."""

    OPEN = "open"  # no token (health checks)
    TOKEN = "token"  # any valid token
    OBJECT = "object"  # a token whose prefixes cover match_info["path"]
    LISTING = "listing"  # may list match_info["prefix"]; the answer is filtered per object
    ADMIN = "admin"  # admin scope
    ADMIN_OBJECT = "admin_object"  # admin scope, and match_info["path"] inside the prefixes


RouteTable = Mapping[tuple[str, str], Access]  # (method, route pattern) -> access


class UnfilterableListing(ProtocolError):
    """A listing this server cannot decode, so cannot filter: refused rather than leaked."""

    status_hint = 502
    title = "Listing could not be filtered"


@dataclass
class AuthCounters:
    unauthorized: int = 0
    forbidden: int = 0


@dataclass
class Guard:
    """The secrets tokens are checked against, and what each route needs."""

    secrets: tuple[bytes, ...]
    routes: RouteTable
    clock: Callable[[], float] = time.time
    counters: AuthCounters = field(default_factory=AuthCounters)

    def access(self, request: web.Request) -> Access:
        """What ``request``'s route needs; unknown routes need a token, unlisted ones admin."""
        resource = request.match_info.route.resource
        if resource is None:  # no route matched: 404 or 405 once authenticated
            return Access.TOKEN
        method = "GET" if request.method == "HEAD" else request.method
        return self.routes.get((method, resource.canonical), Access.ADMIN)

    def authenticate(self, header: str | None) -> Claims:
        """The claims of the ``Authorization: Bearer`` header's token."""
        scheme, _, token = (header or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise MissingToken("send Authorization: Bearer <token>")
        return verify(token.strip(), self.secrets, self.clock())

    def series(self, prefix: str) -> list[Series]:
        """``/metrics`` counters of refused requests, named ``{prefix}_auth_*``."""
        c = self.counters
        return [
            Series(f"{prefix}_auth_unauthorized_total", "counter",
                   "requests refused 401 (missing, bad or expired token)",
                   lambda: c.unauthorized),
            Series(f"{prefix}_auth_forbidden_total", "counter",
                   "requests refused 403 (path or scope outside the token)", lambda: c.forbidden),
        ]


def middleware(guard: Guard) -> Middleware:
    """The aiohttp middleware enforcing ``guard``; install it after the problem middleware."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        access = guard.access(request)
        if access is Access.OPEN:
            return await handler(request)
        try:
            claims = guard.authenticate(request.headers.get("Authorization"))
        except AuthError as exc:
            guard.counters.unauthorized += 1
            return unauthorized(exc)
        request[CLAIMS] = claims
        try:
            _authorize(access, claims, request)
            response = await handler(request)
        except Forbidden:
            guard.counters.forbidden += 1
            raise
        if access is Access.LISTING:
            filter_listing(response, claims)
        return response

    return check_token


GUARD = web.AppKey("auth_guard", Guard)


def install(app: web.Application, guard: Guard | None) -> None:
    """Enforce ``guard`` on ``app`` (innermost, so the problem middleware renders 403s)."""
    if guard is not None:
        app[GUARD] = guard
        app.middlewares.append(middleware(guard))


def app_series(app: web.Application, prefix: str) -> list[Series]:
    """The ``/metrics`` counters of ``app``'s guard; none when auth is off."""
    guard = app.get(GUARD)
    return guard.series(prefix) if guard is not None else []


def unauthorized(exc: AuthError) -> web.Response:
    """401 problem+json with the RFC 6750 challenge; ``error`` only when a token was sent."""
    challenge = f'Bearer realm="{REALM}"'
    if isinstance(exc, BadToken):
        challenge += ', error="invalid_token"'
    return problem_response(exc.status_hint, exc.title, str(exc), {"WWW-Authenticate": challenge})


def _authorize(access: Access, claims: Claims, request: web.Request) -> None:
    if access is Access.OBJECT:
        authorize(claims, validate_path(request.match_info["path"]))
    elif access is Access.LISTING:
        authorize_listing(claims, validate_prefix(request.match_info.get("prefix", "")))
    elif access in (Access.ADMIN, Access.ADMIN_OBJECT):
        authorize_admin(claims)
        if access is Access.ADMIN_OBJECT:
            _authorize_target(claims, request.match_info["path"])


def _authorize_target(claims: Claims, raw: str) -> None:
    """A purge target: one object, or with a trailing ``/`` a prefix."""
    if raw.endswith("/"):
        authorize_listing(claims, validate_prefix(raw))
    else:
        authorize(claims, validate_path(raw))


def check_paths(request: web.Request, paths: Iterable[str]) -> None:
    """For handlers that take paths in a body: raise Forbidden unless every one is granted."""
    claims = request.get(CLAIMS)
    if claims is not None:
        for path in paths:
            authorize(claims, path)


def check_prefix(request: web.Request, prefix: str) -> None:
    """For handlers that take a prefix in a body: raise Forbidden unless it is granted."""
    claims = request.get(CLAIMS)
    if claims is not None:
        authorize_listing(claims, prefix)


def filter_listing(response: web.StreamResponse, claims: Claims) -> None:
    """Drop the entries of a ``/list`` answer that ``claims`` may not read.

    ``/list/ds`` is a string prefix and also lists ``dsX/...``; the check on the prefix
    alone cannot exclude those, so the answer (JSON or msgpack) is filtered per object.
    """
    if not isinstance(response, web.Response) or response.status != 200:
        return
    body = response.body
    if not isinstance(body, bytes):
        raise UnfilterableListing("listing body is not in memory")
    packed = response.content_type == "application/msgpack"
    try:
        doc = msgpack.unpackb(body, raw=False) if packed else json.loads(body)
        doc["objects"] = [e for e in doc["objects"] if allows(claims, str(e["path"]))]
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise UnfilterableListing(f"listing does not decode: {type(exc).__name__}") from None
    response.body = msgpack.packb(doc, use_bin_type=True) if packed else json.dumps(doc).encode()


def load_secret(path: str) -> bytes:
    """The secret in file ``path`` (surrounding whitespace dropped); refuses short ones."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_mode & 0o077:
            # Anyone who reads the secret can mint any token: say so, but keep going.
            logger.warning("secret file %s is readable by other users (chmod 600 it)", path)
        secret = f.read().strip()
    check_secret(secret)
    return secret


def load_token(path: str) -> str:
    """The token in file ``path``, without its trailing newline; an empty file is an error."""
    with open(path, encoding="ascii") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def make_guard(
    secret_file: str | None, previous_secret_file: str | None, routes: RouteTable
) -> Guard | None:
    """A guard checking tokens against the current (and previous) secret; None: auth off."""
    if not secret_file:
        return None
    secrets = [load_secret(secret_file)]
    if previous_secret_file:
        secrets.append(load_secret(previous_secret_file))
    logger.info("bearer tokens required (%d accepted secrets)", len(secrets))
    return Guard(tuple(secrets), routes)


def metrics_access(metrics_auth: str) -> Access:
    """``--metrics-auth on`` asks any valid token for ``/metrics``; off leaves it open."""
    return Access.TOKEN if metrics_auth == "on" else Access.OPEN


@settings
class AuthSettings:
    """Bearer tokens (both servers take these)."""

    auth_secret_file: str | None = setting(
        "--auth-secret-file", default=None,
        help="file holding the HMAC secret; when set, every data and admin endpoint "
             "requires Authorization: Bearer <token>")
    auth_previous_secret_file: str | None = setting(
        "--auth-previous-secret-file", default=None,
        help="the secret being rotated out: its tokens stay valid until they expire")
    metrics_auth: str = setting("--metrics-auth", default="off", choices=("on", "off"),
                                help="require a token for /metrics too")
