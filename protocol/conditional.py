"""Conditional requests (RFC 9110 §13): which status a precondition forces.

Evaluated in the order of §13.2.2. Entity tags are strong (``"..."``); weak tags
(``W/"..."``) never match ``If-Match``/``If-Range`` and match ``If-None-Match``
by weak comparison.

Modification times are nanoseconds (``st_mtime_ns``): a float ``st_mtime`` can round
up into the next second, and the second a version was written in is what decides
whether its date can stand for it. ``now`` is the second the response's ``Date``
names (or an earlier one): a date is only a validator relative to it.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping
from email.utils import formatdate
from functools import lru_cache

from protocol.errors import ProtocolError


class PreconditionFailed(ProtocolError):
    """``If-Match`` or ``If-Unmodified-Since`` did not hold (RFC 9110 §13.1.1)."""

    status_hint = 412
    title = "Precondition Failed"


_LAST_HTTP_DATE = 253402300799  # 9999-12-31T23:59:59Z
NS = 1_000_000_000

_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
)}
_MONTH = "(" + "|".join(_MONTHS) + ")"
_TIME = r"(\d\d):(\d\d):(\d\d)"
# RFC 9110 §5.6.7: the three forms a recipient must accept, and nothing else (no
# numeric zones, no lists: a field with two dates is invalid, and then ignored).
_IMF_FIXDATE = re.compile(
    rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) {_MONTH} (\d{{4}}) {_TIME} GMT"
)
_RFC850_DATE = re.compile(
    rf"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    rf"(\d\d)-{_MONTH}-(\d\d) {_TIME} GMT"
)
_ASCTIME_DATE = re.compile(
    rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} ([ \d]\d) {_TIME} (\d{{4}})"
)


@lru_cache(maxsize=4096)  # one object's Last-Modified is formatted on every read of it
def http_date(epoch_s: int) -> str:
    """An IMF-fixdate such as ``Sun, 06 Nov 1994 08:49:37 GMT``.

    Clamped to the years 1970-9999 that the format can express, so a file with an
    absurd mtime still gets an answer rather than an error.
    """
    return formatdate(min(max(epoch_s, 0), _LAST_HTTP_DATE), usegmt=True)


def last_modified(mtime_ns: int, now: int) -> int:
    """The ``Last-Modified`` second of a version: its mtime, but never later than the
    response's ``Date`` (RFC 9110 §8.8.2.1), whatever a skewed clock or an archive set
    the file's mtime to; and never the Date's own second either.

    A date sent within the second it names is weak (§8.8.2.2): a rewrite later in
    that second keeps it, so an ``If-Modified-Since`` or ``If-Range`` echoing it would
    vouch for bytes it never described. A second earlier, every date this server
    sends is strong: later versions all carry later dates. The cost is one 200 where
    a 304 could have done, for a version read within its first second.
    """
    return min(mtime_ns // NS, now - 1)


def parse_http_date(text: str) -> int | None:
    """Seconds since the epoch, or ``None`` when ``text`` is not one HTTP-date."""
    text = text.strip()
    if match := _IMF_FIXDATE.fullmatch(text):
        day, month, year, hour, minute, second = match.groups()
    elif match := _RFC850_DATE.fullmatch(text):
        day, month, yy, hour, minute, second = match.groups()
        # A two-digit year, pivoting at 1970: §5.6.7's "not more than 50 years ahead"
        # reads the same for every year but 2070-2076, which no file has.
        year = str(int(yy) + (1900 if int(yy) >= 70 else 2000))
    elif match := _ASCTIME_DATE.fullmatch(text):
        month, day, hour, minute, second, year = match.groups()
    else:
        return None
    fields = (int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second))
    if not _valid_fields(*fields):
        return None
    return calendar.timegm((*fields, 0, 0, 0))


def _valid_fields(year: int, month: int, day: int, hour: int, minute: int, second: int) -> bool:
    if year < 1970 or hour > 23 or minute > 59 or second > 60:
        return False
    return 1 <= day <= calendar.monthrange(year, month)[1]


def evaluate_preconditions(
    method: str, headers: Mapping[str, str], etag: str, mtime_ns: int, now: int
) -> int | None:
    """The status the preconditions force (304), ``None`` to go on normally.

    Raises :class:`PreconditionFailed` for a 412. Invalid dates are ignored
    (§13.1.3, §13.1.4), and so is an ``If-Modified-Since`` of ``now`` or later: no
    :func:`last_modified` this server sent can be, and a date that is not a second
    old may describe an earlier version of the same second.
    """
    mtime = mtime_ns // NS
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
        if modified_since is not None and mtime <= modified_since < now:
            return 304
    return None


def if_range_holds(headers: Mapping[str, str], etag: str, mtime_ns: int, now: int) -> bool:
    """Whether a ``Range`` header may be honoured given ``If-Range`` (§13.1.5).

    A date only holds when it is a strong validator (§8.8.2.2): the version's mtime
    at least a second before ``now``. A version written within the second it is read
    in shares its date with any rewrite in that second, and honouring the date then
    would splice the new version's bytes onto the old ones a client holds.
    """
    if_range = headers.get("If-Range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return not if_range.startswith("W/") and if_range == etag
    date = parse_http_date(if_range)
    return date is not None and date == mtime_ns // NS and mtime_ns <= (now - 1) * NS


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
