"""Bearer tokens: mint, verify and authorize, with the clock passed in.

A token is three dot-separated fields::

    hs1.<base64url(claims JSON)>.<base64url(HMAC-SHA256(secret, "hs1." + claims field))>

base64url without padding (RFC 4648 §5). The claims are a JSON object::

    {"ten": "tenant-a", "pfx": ["ds/", "eval"], "adm": false, "iat": 1700000000, "exp": 1700003600}

``ten`` names the tenant (``[A-Za-z0-9._-]{1,64}``, so it is safe to log), ``pfx`` the path
prefixes the token may read, ``adm`` the admin scope (warm, purge, stats), ``iat``/``exp`` the
issue and expiry times in Unix seconds. The MAC is checked, in constant time, before the claims
are decoded, so unauthenticated bytes never reach the JSON parser. Verification accepts a list
of secrets, the current one first and the previous one during a key rotation.

Prefix rule (:func:`path_allowed`): a prefix matches on whole path segments. ``''`` allows
every path; ``ds`` and ``ds/`` both allow the object ``ds`` and every path under ``ds/``, and
never ``dsX/...``; ``ds/a.bin`` allows exactly that object (and anything under ``ds/a.bin/``).

Errors never quote the token: it is a credential, and error details reach logs and clients.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

from protocol.errors import BadPath, ProtocolError
from protocol.paths import validate_prefix

TOKEN_VERSION = "hs1"
# Far above any real token (a few hundred prefixes), small enough to bound the work an
# unauthenticated client can cause.
MAX_TOKEN_BYTES = 8192
MAX_PREFIXES = 256
# RFC 2104 advises a key at least as long as the hash output; 16 bytes is the floor we accept.
MIN_SECRET_BYTES = 16
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_TTL = re.compile(r"(\d{1,9})([smhd]?)")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class AuthError(ProtocolError):
    """The request carries no usable credentials (401)."""

    status_hint = 401
    title = "Unauthorized"


class MissingToken(AuthError):
    """No ``Authorization: Bearer`` header."""

    title = "Authentication required"


class BadToken(AuthError):
    """A token that does not parse, has a wrong signature, or carries invalid claims."""

    title = "Invalid token"


class ExpiredToken(BadToken):
    """A well-signed token whose expiry has passed."""

    title = "Token expired"


class Forbidden(ProtocolError):
    """A valid token that does not grant this path or scope (403)."""

    status_hint = 403
    title = "Forbidden"


class BadClaims(ProtocolError):
    """Claims no token may carry (a bad tenant name or prefix, no prefix at all)."""

    title = "Bad token claims"


class BadSecret(ProtocolError):
    """A signing secret too short to be safe."""

    title = "Bad secret"


class BadTtl(ProtocolError):
    """A lifetime such as ``1h`` that does not parse."""

    title = "Bad token lifetime"


@dataclass(frozen=True, slots=True)
class Claims:
    """What a token grants ``tenant``: reads under ``prefixes``, the admin scope when
    ``admin``, both until ``expires_at`` (Unix seconds)."""

    tenant: str
    prefixes: tuple[str, ...]
    admin: bool
    issued_at: int
    expires_at: int


def mint(secret: bytes, claims: Claims) -> str:
    """The token carrying ``claims``, signed with ``secret``; checks the claims first."""
    check_secret(secret)
    _check_claims(claims)
    body = {
        "ten": claims.tenant, "pfx": list(claims.prefixes), "adm": claims.admin,
        "iat": claims.issued_at, "exp": claims.expires_at,
    }
    payload = _b64encode(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{TOKEN_VERSION}.{payload}.{_signature(secret, payload)}"


def issue(
    secret: bytes, tenant: str, prefixes: Sequence[str], *, admin: bool, ttl_s: int, now: float
) -> str:
    """A token for ``tenant`` valid for ``ttl_s`` seconds from ``now``."""
    if ttl_s <= 0:
        raise BadTtl("a token's lifetime must be positive")
    issued = int(now)
    return mint(secret, Claims(tenant, tuple(prefixes), admin, issued, issued + ttl_s))


def verify(token: str | bytes, secrets: Sequence[bytes], now: float) -> Claims:
    """The claims of ``token`` if one of ``secrets`` signed it and it has not expired at ``now``.

    Raises :class:`BadToken` (or :class:`ExpiredToken`) and nothing else, whatever the input.
    """
    text = _ascii(token)
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_VERSION:
        raise BadToken(f"not a {TOKEN_VERSION} token")
    _, payload, signature = parts
    if not (_B64URL.fullmatch(payload) and _B64URL.fullmatch(signature)):
        raise BadToken("token fields are not base64url")
    if not _signed_by_any(secrets, payload, signature):
        raise BadToken("token signature does not match")
    claims = _decode_claims(payload)
    if now >= claims.expires_at:
        raise ExpiredToken(f"token of tenant {claims.tenant} expired")
    return claims


def path_allowed(prefix: str, path: str) -> bool:
    """Whether ``prefix`` covers object ``path`` on whole segments (see the module docstring)."""
    if prefix == "":
        return True
    base = prefix.removesuffix("/")
    return path == base or path.startswith(base + "/")


def allows(claims: Claims, path: str) -> bool:
    """Whether ``claims`` may read object ``path``."""
    return any(path_allowed(p, path) for p in claims.prefixes)


def authorize(claims: Claims, path: str) -> None:
    """Raise :class:`Forbidden` unless ``claims`` may read object ``path``."""
    if not allows(claims, path):
        raise Forbidden(f"tenant {claims.tenant} may not read {path!r}")


def authorize_listing(claims: Claims, prefix: str) -> None:
    """Raise :class:`Forbidden` unless listing ``prefix`` stays inside the token's prefixes.

    A listing prefix is a plain string prefix (``ds/shard-0`` lists ``ds/shard-01.bin``), so
    it is allowed when its segment-wise form lies inside one of the token's prefixes: with
    ``ds/`` a tenant may list ``ds``, ``ds/`` and ``ds/shard-0``, but not ``''`` or ``d``.
    The listing itself is still filtered with :func:`allows` (``ds`` also matches ``dsX``).
    """
    base = prefix.removesuffix("/")
    if any(p == "" or (base and path_allowed(p, base)) for p in claims.prefixes):
        return
    raise Forbidden(f"tenant {claims.tenant} may not list {prefix!r}")


def authorize_admin(claims: Claims) -> None:
    """Raise :class:`Forbidden` unless ``claims`` has the admin scope."""
    if not claims.admin:
        raise Forbidden(f"tenant {claims.tenant} has no admin scope")


def parse_ttl(text: str) -> int:
    """Seconds named by ``30s``, ``15m``, ``1h``, ``7d`` or a bare number of seconds."""
    match = _TTL.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise BadTtl(f"not a lifetime: {text!r} (try 30s, 15m, 1h or 7d)")
    return int(match.group(1)) * _TTL_UNITS[match.group(2)]


def _ascii(token: str | bytes) -> str:
    if len(token) > MAX_TOKEN_BYTES:
        raise BadToken(f"token longer than {MAX_TOKEN_BYTES} bytes")
    try:
        return token.decode("ascii") if isinstance(token, bytes) else token.encode("ascii").decode()
    except (UnicodeDecodeError, UnicodeEncodeError):
        raise BadToken("token is not ASCII") from None


def _signature(secret: bytes, payload: str) -> str:
    mac = hmac.new(secret, f"{TOKEN_VERSION}.{payload}".encode(), hashlib.sha256).digest()
    return _b64encode(mac)


def _signed_by_any(secrets: Sequence[bytes], payload: str, signature: str) -> bool:
    # Every secret is tried (no early exit), each comparison in constant time, so the
    # answer's timing says nothing about which secret matched or how much of the MAC did.
    matched = False
    for secret in secrets:
        expected = _signature(secret, payload).encode()
        matched |= hmac.compare_digest(expected, signature.encode())
    return matched


def _decode_claims(payload: str) -> Claims:
    try:
        raw = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, RecursionError):
        raise BadToken("token claims do not decode") from None
    if not isinstance(raw, dict):
        raise BadToken("token claims are not an object")
    ten, pfx, adm, iat, exp = (raw.get(k) for k in ("ten", "pfx", "adm", "iat", "exp"))
    if not (isinstance(ten, str) and isinstance(adm, bool) and _is_int(iat) and _is_int(exp)):
        raise BadToken("token claims have the wrong types")
    if not (isinstance(pfx, list) and all(isinstance(p, str) for p in pfx)):
        raise BadToken("token prefixes are not a list of strings")
    claims = Claims(ten, tuple(pfx), adm, iat, exp)
    try:
        _check_claims(claims)
    except (BadPath, BadClaims) as exc:
        raise BadToken(f"token claims are invalid: {exc}") from None
    return claims


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_claims(claims: Claims) -> None:
    """Raise :class:`BadClaims` or :class:`BadPath` for claims no token may carry."""
    if not _TENANT.fullmatch(claims.tenant):
        raise BadClaims("a tenant is 1 to 64 of A-Z a-z 0-9 . _ -")
    if not 1 <= len(claims.prefixes) <= MAX_PREFIXES:
        raise BadClaims(f"a token names 1 to {MAX_PREFIXES} prefixes")
    for prefix in claims.prefixes:
        validate_prefix(prefix)


def check_secret(secret: bytes) -> None:
    """Raise :class:`BadSecret` unless ``secret`` is long enough to sign tokens."""
    if len(secret) < MIN_SECRET_BYTES:
        raise BadSecret(f"a signing secret needs at least {MIN_SECRET_BYTES} bytes")


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
