"""AWS Signature Version 4 for S3 reads: verify a request's signature, with the clock passed in.

Two carriers, as S3 has them:

* the ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...``
  header, dated by ``x-amz-date`` (or ``Date``), its payload named by ``x-amz-content-sha256``;
* a presigned query (``X-Amz-Algorithm``, ``X-Amz-Credential``, ``X-Amz-Date``,
  ``X-Amz-Expires``, ``X-Amz-SignedHeaders``, ``X-Amz-Signature``), payload ``UNSIGNED-PAYLOAD``.

The canonical request follows S3's variant of the rules, the one botocore's ``S3SigV4Auth``
signs: the canonical URI is the path exactly as sent (S3 neither normalises it nor encodes it
a second time); the query's names and values are decoded then RFC 3986-encoded and sorted by
name, then value; header names are lowercased, values trimmed with inner runs of spaces
collapsed, repeated headers joined with ``,``. A client that sends a path in a form other than
the canonical encoding of its key (``=`` or ``!`` left bare, ``%2f`` in lower case) signed that
canonical form, so a path that is not already canonical is also tried re-encoded: both forms
name the same key.

Only reads come here (the S3 front end refuses bodies), so the only payload hashes accepted
are ``UNSIGNED-PAYLOAD`` and the hash of the empty body.

Every comparison of a signature is constant-time (:func:`hmac.compare_digest`). The error
codes are S3's, with S3's statuses, so the front end answers them as S3's XML unchanged.
"""

from __future__ import annotations

import calendar
import datetime
import email.utils
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from urllib.parse import quote, unquote

from protocol.errors import ProtocolError
from protocol.http1 import Headers as RequestFields
from protocol.s3.credentials import S3Key

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# S3's bounds: a presigned URL lives one second to seven days.
MAX_EXPIRES_S = 604800
DEFAULT_MAX_SKEW_S = 900
# Far above any real Authorization header or signed-header list, small enough to bound the
# work an unauthenticated client can cause.
MAX_AUTH_BYTES = 8192
MAX_SIGNED_HEADERS = 64
# Requests already verified (see Verified): a presigned URL read over and over (a loader's
# shard list, a benchmark) costs one verification, then a comparison of the fields it
# depends on and a clock check per request. Only requests that verified get in, so a flood
# of bad signatures cannot churn it.
MAX_VERIFIED = 1024
# The presigned query's own parameters: the front end ignores them when it parses a request.
AUTH_QUERY_PARAMS = frozenset({
    "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
    "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token", "X-Amz-Content-Sha256",
})
# Signature Version 2 carriers: recognised so they get a clear "use SigV4" instead of a
# confusing anonymous answer.
_V2_QUERY_PARAMS = frozenset({"AWSAccessKeyId", "Signature"})

_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")
_SCOPE_PART = re.compile(r"[A-Za-z0-9-]{1,64}")
_UNRESERVED = "-_.~"
_PLAIN = re.compile(r"[A-Za-z0-9_.~-]*")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_.~/-]*")

# The fields a signature's verification reads besides those it signs.
_AUTH_FIELDS = frozenset({"authorization", "x-amz-date", "date", "x-amz-content-sha256"})

_STATUS = {
    "AccessDenied": 403,
    "InvalidAccessKeyId": 403,
    "SignatureDoesNotMatch": 403,
    "RequestTimeTooSkewed": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "InvalidArgument": 400,
    "XAmzContentSHA256Mismatch": 400,
}

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


class S3AuthError(ProtocolError):
    """A request S3 would refuse to authenticate; ``code`` is S3's error code.

    ``status_hint`` follows the code (403 for a credential that does not hold, 400 for one that
    does not parse). A :data:`SignatureDoesNotMatch` also carries the string to sign and the
    canonical request we computed, which S3 returns so a client's author can see the mismatch.
    """

    title = "S3 authentication failed"

    def __init__(
        self, code: str, message: str, *, string_to_sign: str = "", canonical_request: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status_hint = _STATUS[code]
        self.string_to_sign = string_to_sign
        self.canonical_request = canonical_request


@dataclass(frozen=True, slots=True)
class _Signed:
    """What a request claims about its signature, from either carrier."""

    access_key: str
    date: str  # the credential scope's YYYYMMDD
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str  # the request's YYYYMMDDTHHMMSSZ
    expires_s: int | None  # presigned only
    presigned: bool


def is_signed(raw_query: str, headers: Headers) -> bool:
    """Whether the request carries a signature of any version, in the header or the query."""
    if _header(_header_pairs(headers), "authorization") is not None:
        return True
    names = {unquote(p.partition("=")[0]) for p in raw_query.split("&") if p}
    return bool(names & (AUTH_QUERY_PARAMS | _V2_QUERY_PARAMS))


def authenticate(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Headers,
    keys: Mapping[str, S3Key],
    now: datetime.datetime | float,
    *,
    max_skew_s: int = DEFAULT_MAX_SKEW_S,
    service: str = "s3",
) -> S3Key:
    """The key whose signature ``method raw_path?raw_query`` carries, valid at ``now``
    (a datetime, naive ones in UTC, or epoch seconds).

    ``raw_path`` is the path as sent (percent-encoded, no query; a ``?query`` left on it is
    split off); ``raw_query`` the query as sent, without ``?``. ``headers`` are the request's,
    repeats included, as a mapping (a multidict's ``items()`` yields the repeats) or as pairs.
    Raises :class:`S3AuthError` and nothing else, whatever the input.
    """
    return verified(method, raw_path, raw_query, headers, keys, now, max_skew_s=max_skew_s,
                    service=service).key


def verified(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Headers,
    keys: Mapping[str, S3Key],
    now: datetime.datetime | float,
    *,
    max_skew_s: int = DEFAULT_MAX_SKEW_S,
    service: str = "s3",
) -> Verified:
    """:func:`authenticate`'s verdict as a :class:`Verified`, which a caller that sees
    the same request again may keep and ask (:meth:`Verified.holds`) instead."""
    path, sep, rest = raw_path.partition("?")
    if sep and not raw_query:
        raw_query = rest
    # (A fast path's fields, lower-case already, are taken as they are, without a call.)
    pairs = list(headers.items()) if type(headers) is RequestFields else _header_pairs(headers)
    now_s = epoch_s(now)
    target = (method, path, raw_query, service)
    seen = _VERIFIED.get(target)
    if seen is not None:
        names = seen.names
        fields = []  # _fields(pairs, names), inline: this runs on every signed read
        for pair in pairs:
            if pair[0] in names:
                fields.append(pair)
        held = keys.get(seen.key.access_key)
        if tuple(fields) == seen.fields and (held is seen.key or held == seen.key):
            # Every byte the signature depends on is as it was when it verified, under the
            # same secret: only the clock can have changed the answer.
            _check_age(now_s - seen.at_s, seen.expires_s, max_skew_s)
            return seen if seen.max_skew_s == max_skew_s else replace(seen, max_skew_s=max_skew_s)
    signed, key, at_s = _verify(method, path, raw_query, pairs, keys, now_s, max_skew_s,
                                service)
    names = _AUTH_FIELDS.union(signed.signed_headers)
    if len(_VERIFIED) >= MAX_VERIFIED and target not in _VERIFIED:
        _VERIFIED.pop(next(iter(_VERIFIED)))
    seen = Verified(method, names, _fields(pairs, names), key, at_s, signed.expires_s,
                    max_skew_s)
    _VERIFIED[target] = seen
    return seen


def epoch_s(now: datetime.datetime | float) -> float:
    """``now`` (a datetime, naive ones in UTC, or epoch seconds) in epoch seconds."""
    if not isinstance(now, datetime.datetime):
        return now
    return (now if now.tzinfo is not None else now.replace(tzinfo=datetime.UTC)).timestamp()


def _fields(pairs: list[tuple[str, str]], names: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """The fields among ``pairs`` named in ``names``, in order, repeats included."""
    return tuple([pair for pair in pairs if pair[0] in names])


@dataclass(frozen=True, slots=True)
class Verified:
    """A request that verified: its ``method`` (its path and query are what it is
    remembered by, in :data:`_VERIFIED` and by :meth:`holds`'s callers), and the rest of
    what its verification read: ``fields``, the request's fields among ``names`` (those
    it signed, and those any verification reads: the Authorization header, the dates,
    the payload's hash), in order and repeats included. A request with the same target
    and the same such fields carries the same signature over the same bytes; its other
    fields (a presigned URL's Range, an SDK's invocation id) sign nothing. ``key``: the
    key it is signed with; ``at_s``: the signature's date (epoch seconds);
    ``expires_s``: a presigned URL's lifetime (None for the header carrier);
    ``max_skew_s``: the skew it was judged with.
    """

    method: str
    names: frozenset[str]
    fields: tuple[tuple[str, str], ...]
    key: S3Key
    at_s: int
    expires_s: int | None
    max_skew_s: int

    def holds(
        self, method: str, headers: RequestFields, keys: Mapping[str, S3Key], now_s: float,
    ) -> bool:
        """Whether a request of the same path and query (the caller's to compare, every
        character), this ``method`` and these ``headers`` (a fast path's fields) verifies
        at ``now_s`` (epoch seconds) with ``keys``, for the same key; False: ask
        :func:`verified`, which says why not (or that it does, after all)."""
        key = self.key
        held = keys.get(key.access_key)
        if method != self.method or (held is not key and held != key):
            return False
        names = self.names
        fields = []
        for pair in headers.items():
            if pair[0] in names:
                fields.append(pair)
        if tuple(fields) != self.fields:
            return False
        # As _check_age judges it: a presigned URL to its expiry, a header within the skew.
        expires_s = self.expires_s
        return -self.max_skew_s <= now_s - self.at_s <= (
            self.max_skew_s if expires_s is None else expires_s)


_VERIFIED: dict[tuple[str, str, str, str], Verified] = {}


def _verify(
    method: str, path: str, raw_query: str, pairs: list[tuple[str, str]],
    keys: Mapping[str, S3Key], now_s: float, max_skew_s: int, service: str,
) -> tuple[_Signed, S3Key, int]:
    """The request's claims, its key and its date (epoch seconds), once its signature holds."""
    query = _split_query(raw_query)
    if sum(1 for key, _ in pairs if key == "authorization") > 1:
        # Which one a proxy on the way would read is anyone's guess: refused, as S3 does.
        raise S3AuthError("AuthorizationHeaderMalformed", "more than one Authorization header")
    authorization = _header(pairs, "authorization")
    query_names = {name for name, _ in query}
    if authorization is not None and query_names & AUTH_QUERY_PARAMS - {"X-Amz-Content-Sha256"}:
        raise S3AuthError("InvalidArgument", "only one auth mechanism allowed")
    if authorization is not None:
        signed = _parse_authorization(authorization, pairs)
        payload = _header_payload(pairs)
    elif "X-Amz-Algorithm" in query_names or "X-Amz-Signature" in query_names:
        signed = _parse_presigned(query)
        payload = _query_value(query, "X-Amz-Content-Sha256") or UNSIGNED_PAYLOAD
    elif query_names & _V2_QUERY_PARAMS:
        raise S3AuthError("InvalidArgument", f"only {ALGORITHM} (Signature Version 4) is supported")
    else:
        raise S3AuthError("AccessDenied", "anonymous access is not allowed: sign the request")
    _check_scope(signed, service)
    at_s = _epoch_s(signed)
    _check_age(now_s - at_s, signed.expires_s, max_skew_s)
    key = keys.get(signed.access_key)
    if key is None:
        raise S3AuthError(
            "InvalidAccessKeyId", "the access key id you provided does not exist in our records"
        )
    canonical_query = _canonical_query(
        pair for pair in query if not (signed.presigned and pair[0] == "X-Amz-Signature")
    )
    canonical_headers = _canonical_headers(signed.signed_headers, pairs)
    scope = f"{signed.date}/{signed.region}/{signed.service}/aws4_request"
    sign_key = signing_key(key.secret, signed.date, signed.region, signed.service)
    first_sts = ""
    first_request = ""
    for uri in _canonical_uris(path):
        request = "\n".join((
            method.upper(), uri, canonical_query, canonical_headers,
            ";".join(signed.signed_headers), payload,
        ))
        sts = string_to_sign(signed.amz_date, scope, request)
        expected = hmac.new(sign_key, sts.encode(), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected.encode(), _utf8(signed.signature)):
            return signed, key, at_s
        if not first_sts:
            first_sts, first_request = sts, request
    raise S3AuthError(
        "SignatureDoesNotMatch",
        "the request signature we calculated does not match the signature you provided",
        string_to_sign=first_sts, canonical_request=first_request,
    )


def canonical_request(
    method: str, raw_path: str, raw_query: str, headers: Headers,
    signed_headers: Iterable[str], payload_hash: str,
) -> str:
    """The canonical request of S3's SigV4 (see the module docstring), over ``raw_path`` as sent."""
    names = tuple(signed_headers)
    pairs = _header_pairs(headers)
    return "\n".join((
        method.upper(), raw_path, _canonical_query(_split_query(raw_query)),
        _canonical_headers(names, pairs), ";".join(names), payload_hash,
    ))


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    """SigV4's string to sign for ``canonical`` at ``amz_date`` under credential ``scope``."""
    digest = hashlib.sha256(_utf8(canonical)).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


@lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """SigV4's derived key; it changes once a day per key, region and service, hence the cache."""
    key = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def uri_encode(text: str, *, keep_slash: bool) -> str:
    """AWS's UriEncode: UTF-8, every byte but the unreserved ones as upper-case ``%XX``."""
    if (_PLAIN_PATH if keep_slash else _PLAIN).fullmatch(text):
        return text
    return quote(_utf8(text), safe=_UNRESERVED + ("/" if keep_slash else ""))


def _utf8(text: str) -> bytes:
    # surrogateescape gives back the bytes a lenient decoder (aiohttp's, unquote's) stood in
    # for; any other lone surrogate still has to become bytes rather than an exception.
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _canonical_uris(path: str) -> list[str]:
    # "/" for the service root: a request line always has a path, a caller may hand us "".
    raw = path or "/"
    encoded = uri_encode(_decode(raw), keep_slash=True)
    return [raw] if encoded == raw else [raw, encoded]


def _split_query(raw_query: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for part in raw_query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((_decode(name), _decode(value)))
    return pairs


def _decode(token: str) -> str:
    # Most tokens (dates, hex signatures, plain names) hold no escape: skip the decoder.
    return unquote(token, errors="surrogateescape") if "%" in token else token


def _canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    encoded = sorted(
        (uri_encode(name, keep_slash=False), uri_encode(value, keep_slash=False))
        for name, value in pairs
    )
    return "&".join(f"{name}={value}" for name, value in encoded)


def _canonical_headers(names: tuple[str, ...], pairs: list[tuple[str, str]]) -> str:
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(" ".join(value.split()))
    lines = []
    for name in names:
        if name not in values:
            raise S3AuthError(
                "AccessDenied", f"the signed header {name!r} is not in the request"
            )
        lines.append(f"{name}:{','.join(values[name])}\n")
    return "".join(lines)


def _header_pairs(headers: Headers) -> list[tuple[str, str]]:
    if isinstance(headers, RequestFields):  # lower-case names already
        return list(headers.items())
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(name.lower(), value) for name, value in items]


def _header(pairs: list[tuple[str, str]], name: str) -> str | None:
    for key, value in pairs:
        if key == name:
            return value
    return None


def _query_value(pairs: list[tuple[str, str]], name: str) -> str | None:
    for key, value in pairs:
        if key == name:
            return value
    return None


def _parse_authorization(value: str, pairs: list[tuple[str, str]]) -> _Signed:
    if len(value) > MAX_AUTH_BYTES:
        raise S3AuthError(
            "AuthorizationHeaderMalformed",
            f"the Authorization header exceeds {MAX_AUTH_BYTES} bytes",
        )
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        if algorithm == "AWS":
            raise S3AuthError(
                "InvalidArgument", f"only {ALGORITHM} (Signature Version 4) is supported"
            )
        raise S3AuthError(
            "AuthorizationHeaderMalformed", f"the authorization algorithm must be {ALGORITHM}"
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, field_value = part.strip().partition("=")
        if not eq or name in fields:
            raise S3AuthError(
                "AuthorizationHeaderMalformed",
                "the Authorization header is Credential=..., SignedHeaders=..., Signature=...",
            )
        fields[name] = field_value
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise S3AuthError(
            "AuthorizationHeaderMalformed",
            "the Authorization header needs exactly Credential, SignedHeaders and Signature",
        )
    amz_date = _header(pairs, "x-amz-date")
    if amz_date is None:
        amz_date = _from_http_date(_header(pairs, "date"))
    elif not _AMZ_DATE.fullmatch(amz_date):
        raise S3AuthError("AccessDenied", "x-amz-date is not of the form YYYYMMDDTHHMMSSZ")
    code = "AuthorizationHeaderMalformed"
    access_key, date, region, service = _parse_credential(fields["Credential"], code)
    return _Signed(
        access_key, date, region, service, _parse_signed_headers(fields["SignedHeaders"], code),
        fields["Signature"], amz_date, None, presigned=False,
    )


def _from_http_date(value: str | None) -> str:
    if value is None:
        raise S3AuthError(
            "AccessDenied", "a signed request needs a valid x-amz-date or Date header"
        )
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        raise S3AuthError("AccessDenied", "the Date header is not an HTTP date") from None
    return _utc(parsed).strftime("%Y%m%dT%H%M%SZ")


def _parse_presigned(query: list[tuple[str, str]]) -> _Signed:
    code = "AuthorizationQueryParametersError"
    values: dict[str, str] = {}
    for name, value in query:
        if name in AUTH_QUERY_PARAMS:
            if name in values:
                raise S3AuthError(code, f"{name} is given twice")
            values[name] = value
    missing = [
        n for n in ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                    "X-Amz-SignedHeaders", "X-Amz-Signature")
        if n not in values
    ]
    if missing:
        raise S3AuthError(code, f"a presigned request needs {', '.join(missing)}")
    if values["X-Amz-Algorithm"] != ALGORITHM:
        raise S3AuthError(code, f"X-Amz-Algorithm only supports {ALGORITHM}")
    if not _AMZ_DATE.fullmatch(values["X-Amz-Date"]):
        raise S3AuthError(code, "X-Amz-Date must be of the form YYYYMMDDTHHMMSSZ")
    expires = values["X-Amz-Expires"]
    if not (expires.isascii() and expires.isdigit() and len(expires) <= 7):
        raise S3AuthError(code, "X-Amz-Expires must be a whole number of seconds")
    expires_s = int(expires)
    if not 1 <= expires_s <= MAX_EXPIRES_S:
        raise S3AuthError(
            code, f"X-Amz-Expires must be between 1 and {MAX_EXPIRES_S} seconds (a week)"
        )
    access_key, date, region, service = _parse_credential(values["X-Amz-Credential"], code)
    signed_headers = _parse_signed_headers(values["X-Amz-SignedHeaders"], code)
    return _Signed(
        access_key, date, region, service, signed_headers,
        values["X-Amz-Signature"], values["X-Amz-Date"], expires_s, presigned=True,
    )


def _parse_credential(value: str, code: str) -> tuple[str, str, str, str]:
    parts = value.split("/")
    if len(parts) != 5 or not parts[0] or parts[4] != "aws4_request":
        raise S3AuthError(code, "a credential is ACCESS_KEY_ID/YYYYMMDD/REGION/s3/aws4_request")
    access_key, date, region, service, _ = parts
    if not (len(date) == 8 and date.isascii() and date.isdigit()):
        raise S3AuthError(code, "the credential's date must be YYYYMMDD")
    if not (_SCOPE_PART.fullmatch(region) and _SCOPE_PART.fullmatch(service)):
        raise S3AuthError(code, "the credential's region and service are letters, digits and -")
    return access_key, date, region, service


def _parse_signed_headers(value: str, code: str) -> tuple[str, ...]:
    names = tuple(value.split(";"))
    if len(names) > MAX_SIGNED_HEADERS:
        raise S3AuthError(code, f"more than {MAX_SIGNED_HEADERS} signed headers")
    if not all(_HEADER_NAME.fullmatch(n) for n in names):
        raise S3AuthError(code, "signed headers are lower-case header names separated by ';'")
    if list(names) != sorted(set(names)):
        raise S3AuthError(code, "signed headers must be sorted, each once")
    if "host" not in names:
        raise S3AuthError(code, "the host header must be signed")
    return names


def _header_payload(pairs: list[tuple[str, str]]) -> str:
    declared = _header(pairs, "x-amz-content-sha256")
    if declared is None:
        return EMPTY_SHA256
    if declared in (UNSIGNED_PAYLOAD, EMPTY_SHA256):
        return declared
    raise S3AuthError(
        "XAmzContentSHA256Mismatch",
        "x-amz-content-sha256 must be UNSIGNED-PAYLOAD or the hash of an empty body",
    )


def _check_scope(signed: _Signed, service: str) -> None:
    code = (
        "AuthorizationQueryParametersError" if signed.presigned else "AuthorizationHeaderMalformed"
    )
    if signed.service != service:
        raise S3AuthError(code, f"the credential's service must be {service!r}")
    if signed.amz_date[:8] != signed.date:
        raise S3AuthError(code, "the credential's date is not the request's date")


def _epoch_s(signed: _Signed) -> int:
    """The request's date in epoch seconds; a date that is no calendar date is refused."""
    d = signed.amz_date  # YYYYMMDDTHHMMSSZ, all digits where digits go (checked on parse)
    try:
        return calendar.timegm(datetime.datetime(
            int(d[0:4]), int(d[4:6]), int(d[6:8]), int(d[9:11]), int(d[11:13]), int(d[13:15]),
        ).timetuple())
    except ValueError:
        raise S3AuthError(
            "AuthorizationQueryParametersError" if signed.presigned else "AccessDenied",
            "the request's date is not a calendar date",
        ) from None


def _check_age(age_s: float, expires_s: int | None, max_skew_s: int) -> None:
    """A signature ``age_s`` old is still good: a presigned one (``expires_s``) from a
    skew before its date to its expiry, one in a header within the skew either side."""
    if expires_s is not None:
        if age_s < -max_skew_s:
            raise S3AuthError("AccessDenied", "request is not valid yet")
        if age_s > expires_s:
            raise S3AuthError("AccessDenied", "request has expired")
    elif abs(age_s) > max_skew_s:
        raise S3AuthError(
            "RequestTimeTooSkewed",
            "the difference between the request time and the server's time is too large",
        )


def _utc(moment: datetime.datetime) -> datetime.datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC)
