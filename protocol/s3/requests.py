"""What an S3 request asks for, decided without I/O.

Addressing (path-style ``/{bucket}/{key}``, or virtual-hosted when the Host is
``{bucket}.{domain}``), which operation it is, its list parameters, and one page of a
listing. A bucket is the first segment of an object path, so ``s3://ds/train/a.bin``
is object ``ds/train/a.bin``.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, unquote_to_bytes

from protocol.errors import BadPath
from protocol.paths import validate_path, validate_prefix
from protocol.s3.errors import (
    InvalidArgument,
    InvalidBucketName,
    MethodNotAllowed,
    OperationNotImplemented,
)

MAX_KEYS = 1000
# S3 refuses a max-keys beyond a signed 32-bit integer and clamps the rest to 1000.
_MAX_KEYS_LIMIT = 2**31 - 1
MAX_QUERY_PARAMS = 64
_TOKEN_PREFIX = b"hs1:"


class Operation(enum.Enum):
    LIST_BUCKETS = "ListBuckets"
    HEAD_BUCKET = "HeadBucket"
    GET_BUCKET_LOCATION = "GetBucketLocation"
    LIST_OBJECTS = "ListObjects"
    LIST_OBJECTS_V2 = "ListObjectsV2"
    GET_OBJECT = "GetObject"
    HEAD_OBJECT = "HeadObject"


@dataclass(frozen=True, slots=True)
class Target:
    """The bucket and key a request names (either may be absent)."""

    bucket: str | None
    key: str | None

    @property
    def path(self) -> str:
        """The object path: ``bucket/key``."""
        assert self.bucket is not None and self.key is not None
        return f"{self.bucket}/{self.key}"


# Sub-resources of a bucket or an object that S3 has and we do not (reads among them,
# such as ?acl): NotImplemented, never a listing or the object's bytes.
_SUBRESOURCES = frozenset({
    "accelerate", "acl", "analytics", "attributes", "cors", "delete", "encryption",
    "intelligent-tiering", "inventory", "legal-hold", "lifecycle", "logging", "metrics",
    "notification", "object-lock", "ownershipControls", "partNumber", "policy",
    "policyStatus", "publicAccessBlock", "replication", "requestPayment", "restore",
    "retention", "select", "select-type", "tagging", "torrent", "uploadId", "uploads",
    "versionId", "versioning", "versions", "website", "session", "metadataTable",
})
_READS = ("GET", "HEAD")
# Methods S3 has, answered NotImplemented (writes, deletes, multipart); others are 405.
_S3_METHODS = frozenset({"PUT", "POST", "DELETE"})


BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def decodes(text: str) -> bool:
    """Whether ``text``'s percent-escapes are whole and decode as UTF-8."""
    if "%" not in text:
        return True
    if BAD_PERCENT.search(text):
        return False
    try:
        unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_query(raw_query: str) -> dict[str, str]:
    """The query's parameters (a name without ``=`` has the value ``""``). Raises
    :class:`InvalidArgument` for bad percent-encodings, repeats and floods."""
    if not raw_query:
        return {}
    if BAD_PERCENT.search(raw_query):
        # parse_qsl keeps a bad escape as it is: "%zz" would name a parameter.
        raise InvalidArgument("the query string has a bad percent-encoding")
    try:
        pairs = parse_qsl(raw_query, keep_blank_values=True, strict_parsing=False,
                          errors="strict", max_num_fields=MAX_QUERY_PARAMS)
    except UnicodeDecodeError:
        raise InvalidArgument("the query string is not valid UTF-8") from None
    except ValueError:
        raise InvalidArgument(f"more than {MAX_QUERY_PARAMS} query parameters") from None
    params: dict[str, str] = {}
    for name, value in pairs:
        if name in params:
            raise InvalidArgument(f"query parameter {name!r} given twice")
        if _has_controls(name) or _has_controls(value):
            raise InvalidArgument("control characters in the query string")
        params[name] = value
    return params


def _has_controls(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def bucket_from_host(host: str, domain: str | None) -> str | None:
    """The bucket a virtual-hosted Host (``{bucket}.{domain}[:port]``) names, or None
    (path-style: the Host is the domain itself, an address, or anything else)."""
    if not domain:
        return None
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    suffix = "." + domain.lower().rstrip(".")
    if name.endswith(suffix) and len(name) > len(suffix):
        return name[: -len(suffix)]
    return None


def target(raw_path: str, host_bucket: str | None) -> Target:
    """The bucket and key of a request for ``raw_path`` (still percent-encoded, no
    query); ``host_bucket``: the bucket its Host names, if virtual-hosted.

    Raises :class:`InvalidBucketName` and :class:`~protocol.errors.BadPath` (400)."""
    if not raw_path.startswith("/"):
        raise InvalidArgument("the request target is not an absolute path")
    rest = raw_path[1:]
    if host_bucket is None:
        raw_bucket, slash, raw_key = rest.partition("/")
        if not raw_bucket:
            if slash:
                raise InvalidBucketName("empty bucket name")
            return Target(None, None)
        try:
            bucket = check_bucket(_decode(raw_bucket))
        except BadPath as exc:
            raise InvalidBucketName(f"not a bucket name: {exc}") from None
    else:
        bucket, raw_key, slash = check_bucket(host_bucket), rest, "/"
    if not slash or not raw_key:
        return Target(bucket, None)
    key = _decode(raw_key)
    # A key ending in "/" (a "folder" clients probe for) names no object, but is no
    # bad input either: the caller answers NoSuchKey.
    validate_path(key[:-1] if key.endswith("/") and len(key) > 1 else key)
    return Target(bucket, key)


def check_bucket(bucket: str) -> str:
    """``bucket`` if it is one path segment, else :class:`InvalidBucketName`."""
    try:
        validate_path(bucket)
    except BadPath as exc:
        raise InvalidBucketName(f"not a bucket name: {exc}") from None
    if "/" in bucket:
        raise InvalidBucketName("a bucket name is one path segment")
    return bucket


def _decode(raw: str) -> str:
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise BadPath("the key is not valid UTF-8 once percent-decoded") from None


def operation(method: str, where: Target, params: Mapping[str, str]) -> Operation:
    """Which operation a request is; raises :class:`OperationNotImplemented` (501) for
    the S3 operations we do not serve and :class:`MethodNotAllowed` (405) for methods S3
    does not have."""
    if method not in _READS:
        if method in _S3_METHODS:
            raise OperationNotImplemented(f"{method} is not implemented: the spoke is read-only")
        raise MethodNotAllowed(f"{method} is not allowed here")
    sub = sorted(_SUBRESOURCES.intersection(params))
    if sub and not (sub == ["versionId"] and params["versionId"] == "null"):
        raise OperationNotImplemented(f"?{sub[0]} is not implemented")
    if where.bucket is None:
        if method == "HEAD":
            raise MethodNotAllowed("HEAD of the service is not allowed")
        return Operation.LIST_BUCKETS
    if where.key is None:
        if method == "HEAD":
            return Operation.HEAD_BUCKET
        if "location" in params:
            return Operation.GET_BUCKET_LOCATION
        if "list-type" in params:
            if params["list-type"] != "2":
                raise InvalidArgument("list-type must be 2")
            return Operation.LIST_OBJECTS_V2
        return Operation.LIST_OBJECTS
    return Operation.GET_OBJECT if method == "GET" else Operation.HEAD_OBJECT


@dataclass(frozen=True, slots=True)
class ListParams:
    """A list request's parameters, checked. ``after``: list keys after this one
    (from ``marker``, ``start-after`` or a continuation token)."""

    v2: bool
    prefix: str = ""
    delimiter: str = ""
    max_keys: int = MAX_KEYS
    after: str = ""
    encode_url: bool = False
    marker: str = ""  # v1's, echoed
    start_after: str = ""  # v2's, echoed
    continuation_token: str | None = None  # v2's, echoed


def list_params(params: Mapping[str, str], v2: bool) -> ListParams:
    """The parameters of a ListObjects (``v2``: ListObjectsV2) request; raises
    :class:`InvalidArgument` for bad ones."""
    prefix = params.get("prefix", "")
    if prefix:
        try:
            validate_prefix(prefix)
        except BadPath as exc:
            raise InvalidArgument(f"bad prefix: {exc}") from None
    delimiter = params.get("delimiter", "")
    if len(delimiter) > 1 and delimiter != "/":
        raise InvalidArgument("only single-character delimiters are supported")
    encoding = params.get("encoding-type")
    if encoding is not None and encoding != "url":
        raise InvalidArgument("encoding-type must be url")
    max_keys = _max_keys(params.get("max-keys"))
    if v2:
        token = params.get("continuation-token")
        start_after = params.get("start-after", "")
        after = decode_token(token) if token is not None else start_after
        return ListParams(True, prefix, delimiter, max_keys, after, encoding == "url",
                          start_after=start_after, continuation_token=token)
    marker = params.get("marker", "")
    return ListParams(False, prefix, delimiter, max_keys, marker, encoding == "url",
                      marker=marker)


def _max_keys(text: str | None) -> int:
    if text is None:
        return MAX_KEYS
    if not text.isascii() or not text.isdigit() or len(text) > 10 or int(text) > _MAX_KEYS_LIMIT:
        raise InvalidArgument("max-keys must be an integer between 0 and 2147483647")
    return min(int(text), MAX_KEYS)


def encode_token(after: str) -> str:
    """An opaque continuation token that resumes a listing after key ``after``."""
    return base64.urlsafe_b64encode(_TOKEN_PREFIX + after.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str:
    """The key a continuation token resumes after; :class:`InvalidArgument` if it is
    not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
        if not raw.startswith(_TOKEN_PREFIX):
            raise ValueError("not our token")
        return raw[len(_TOKEN_PREFIX):].decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise InvalidArgument("The continuation token provided is incorrect") from None


@dataclass(frozen=True, slots=True)
class Entry:
    """An object in a listing: its key within the bucket."""

    key: str
    size: int
    etag: str


@dataclass(frozen=True, slots=True)
class ListPage:
    contents: tuple[Entry, ...]
    common_prefixes: tuple[str, ...]
    truncated: bool
    last: str  # the last key or common prefix on the page (resumes the next one)

    @property
    def count(self) -> int:
        return len(self.contents) + len(self.common_prefixes)


def list_page(entries: Iterable[Entry], params: ListParams) -> ListPage:
    """One page of ``entries`` (in key order) as ``params`` ask for it: the keys under
    the prefix after ``params.after``, those holding the delimiter past the prefix
    rolled up into common prefixes, at most ``max_keys`` of the two."""
    prefix, delimiter, after = params.prefix, params.delimiter, params.after
    # A page that ended on a common prefix resumes past every key under it.
    skip_under = after if delimiter and after.endswith(delimiter) else None
    contents: list[Entry] = []
    prefixes: list[str] = []
    last = ""
    for entry in entries:
        key = entry.key
        if not key.startswith(prefix) or key <= after:
            continue
        if skip_under is not None and key.startswith(skip_under):
            continue
        rolled = None
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                rolled = key[: cut + len(delimiter)]
                if prefixes and prefixes[-1] == rolled:
                    continue
        if len(contents) + len(prefixes) >= params.max_keys:
            return ListPage(tuple(contents), tuple(prefixes), True, last)
        if rolled is not None:
            prefixes.append(rolled)
            last = rolled
        else:
            contents.append(entry)
            last = key
    return ListPage(tuple(contents), tuple(prefixes), False, last)


def buckets(paths: Sequence[str]) -> list[str]:
    """The buckets among object ``paths``: their first segments, for those in one."""
    return sorted({p.split("/", 1)[0] for p in paths if "/" in p})
