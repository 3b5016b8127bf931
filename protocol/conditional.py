"""Conditional requests (RFC 9110 §13): which status a precondition forces.

Evaluated in the order of §13.2.2. Entity tags are strong (``"..."``); weak tags
(``W/"..."``) never match ``If-Match``/``If-Range`` and match ``If-None-Match``
by weak comparison.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime
from functools import lru_cache

from protocol.errors import ProtocolError


class PreconditionFailed(ProtocolError):
    """``If-Match`` or ``If-Unmodified-Since`` did not hold (RFC 9110 §13.1.1)."""

    status_hint = 412
    title = "Precondition Failed"


_LAST_HTTP_DATE = 253402300799  # 9999-12-31T23:59:59Z


@lru_cache(maxsize=4096)  # one object's Last-Modified is formatted on every read of it
def http_date(epoch_s: int) -> str:
    """An IMF-fixdate such as ``Sun, 06 Nov 1994 08:49:37 GMT``.

    Clamped to the years 1970-9999 that the format can express, so a file with an
    absurd mtime still gets an answer rather than an error.
    """
    return formatdate(min(max(epoch_s, 0), _LAST_HTTP_DATE), usegmt=True)


def parse_http_date(text: str) -> int | None:
    """Seconds since the epoch, or ``None`` when ``text`` is not an HTTP date."""
    try:
        parsed = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:
        # asctime dates carry no zone; every HTTP-date is GMT (RFC 9110 §5.6.7).
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return int(parsed.timestamp())
    except (OverflowError, ValueError, OSError):
        return None


def evaluate_preconditions(
    method: str, headers: Mapping[str, str], etag: str, mtime: int
) -> int | None:
    """The status the preconditions force (304), ``None`` to go on normally.

    Raises :class:`PreconditionFailed` for a 412.
    """
    if_match = headers.get("If-Match")
    if if_match is not None:
        if not _matches(if_match, etag, weak=False):
            raise PreconditionFailed(f"If-Match does not match the current etag {etag}")
    else:
        since = _date(headers.get("If-Unmodified-Since"))
        if since is not None and mtime > since:
            raise PreconditionFailed("object modified since If-Unmodified-Since")
    if_none_match = headers.get("If-None-Match")
    safe = method in ("GET", "HEAD")
    if if_none_match is not None:
        if _matches(if_none_match, etag, weak=True):
            if safe:
                return 304
            raise PreconditionFailed("If-None-Match matches the current etag")
    elif safe:
        modified_since = _date(headers.get("If-Modified-Since"))
        if modified_since is not None and mtime <= modified_since:
            return 304
    return None


def if_range_holds(headers: Mapping[str, str], etag: str, mtime: int) -> bool:
    """Whether a ``Range`` header may be honoured given ``If-Range`` (§13.1.5)."""
    if_range = headers.get("If-Range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return not if_range.startswith("W/") and if_range == etag
    date = parse_http_date(if_range)
    return date is not None and date == mtime


def _date(value: str | None) -> int | None:
    return None if value is None else parse_http_date(value)


def _matches(header: str, etag: str, *, weak: bool) -> bool:
    tags = [t.strip() for t in header.split(",")]
    if "*" in tags:
        return True
    for tag in tags:
        if tag.startswith("W/"):
            if weak and tag[2:] == etag:
                return True
        elif tag == etag:
            return True
    return False
