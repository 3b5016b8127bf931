"""Table-driven tests for :mod:`protocol.conditional` (RFC 9110 §13)."""

from __future__ import annotations

import pytest

from protocol.conditional import (
    NS,
    PreconditionFailed,
    evaluate_preconditions,
    http_date,
    if_range_holds,
    last_modified,
    parse_http_date,
)
from protocol.errors import ProtocolError

ETAG = '"v1"'
MTIME = 784111777
MTIME_NS = MTIME * NS + 250_000_000  # a quarter second into MTIME
NOW = MTIME + 86400  # the answer's Date: a day after the version
SAME = "Sun, 06 Nov 1994 08:49:37 GMT"
BEFORE = "Sun, 06 Nov 1994 08:49:36 GMT"
AFTER = "Sun, 06 Nov 1994 08:49:38 GMT"
RFC850 = "Sunday, 06-Nov-94 08:49:37 GMT"
ASCTIME = "Sun Nov  6 08:49:37 1994"
FAIL = 412

# (method, headers, expected): None (go on), 304, or FAIL (PreconditionFailed raised)
PRECONDITION_CASES: list[tuple[str, dict[str, str], int | None]] = [
    ("GET", {}, None),
    ("POST", {}, None),
    # If-Match: strong comparison
    ("GET", {"If-Match": '"v1"'}, None),
    ("GET", {"If-Match": '"v2"'}, FAIL),
    ("GET", {"If-Match": "*"}, None),
    ("GET", {"If-Match": 'W/"v1"'}, FAIL),  # weak tags never match If-Match
    ("GET", {"If-Match": '"v2", "v1"'}, None),
    ("GET", {"If-Match": '"v2",W/"v1"'}, FAIL),
    ("GET", {"If-Match": ' "v1" '}, None),
    ("GET", {"If-Match": "v1"}, FAIL),  # unquoted
    ("GET", {"If-Match": ""}, FAIL),
    ("PUT", {"If-Match": '"v1"'}, None),
    ("PUT", {"If-Match": '"v2"'}, FAIL),
    # If-None-Match: weak comparison; 304 for GET/HEAD, 412 otherwise
    ("GET", {"If-None-Match": '"v1"'}, 304),
    ("HEAD", {"If-None-Match": '"v1"'}, 304),
    ("POST", {"If-None-Match": '"v1"'}, FAIL),
    ("PUT", {"If-None-Match": '"v1"'}, FAIL),
    ("DELETE", {"If-None-Match": '"v1"'}, FAIL),
    ("GET", {"If-None-Match": 'W/"v1"'}, 304),
    ("HEAD", {"If-None-Match": 'W/"v1"'}, 304),
    ("POST", {"If-None-Match": 'W/"v1"'}, FAIL),
    ("GET", {"If-None-Match": '"v2"'}, None),
    ("GET", {"If-None-Match": 'W/"v2"'}, None),
    ("POST", {"If-None-Match": '"v2"'}, None),
    ("GET", {"If-None-Match": "*"}, 304),
    ("PUT", {"If-None-Match": "*"}, FAIL),
    ("GET", {"If-None-Match": '"v2", "v1"'}, 304),
    ("GET", {"If-None-Match": '"v2",W/"v1" '}, 304),
    ("GET", {"If-None-Match": "v1"}, None),
    ("get", {"If-None-Match": '"v1"'}, FAIL),  # methods are case-sensitive
    # If-Unmodified-Since: only without If-Match
    ("GET", {"If-Unmodified-Since": SAME}, None),
    ("GET", {"If-Unmodified-Since": AFTER}, None),
    ("GET", {"If-Unmodified-Since": BEFORE}, FAIL),
    ("PUT", {"If-Unmodified-Since": BEFORE}, FAIL),
    ("GET", {"If-Unmodified-Since": "garbage"}, None),  # invalid dates are ignored
    # §13.1.4: a list of dates is not a date, so it is ignored rather than evaluated
    ("GET", {"If-Unmodified-Since": f"{BEFORE}, {BEFORE}"}, None),
    ("GET", {"If-Unmodified-Since": f"{AFTER}, {BEFORE}"}, None),
    ("GET", {"If-Unmodified-Since": "Sun, 06 Nov 1994 08:49:36 +0000"}, None),
    ("GET", {"If-Unmodified-Since": "06 Nov 1994 08:49:36 GMT"}, None),
    ("GET", {"If-Unmodified-Since": "Sun, 06 Nov 1994 08:49:36 GMT garbage"}, None),
    ("GET", {"If-Match": '"v1"', "If-Unmodified-Since": BEFORE}, None),
    ("GET", {"If-Match": '"v2"', "If-Unmodified-Since": AFTER}, FAIL),
    # If-Modified-Since: only GET/HEAD, only without If-None-Match
    ("GET", {"If-Modified-Since": SAME}, 304),
    ("GET", {"If-Modified-Since": AFTER}, 304),
    ("GET", {"If-Modified-Since": BEFORE}, None),
    ("HEAD", {"If-Modified-Since": SAME}, 304),
    ("HEAD", {"If-Modified-Since": BEFORE}, None),
    ("POST", {"If-Modified-Since": SAME}, None),
    ("GET", {"If-Modified-Since": "garbage"}, None),
    ("GET", {"If-Modified-Since": f"{SAME}, {SAME}"}, None),  # §13.1.3: more than one member
    ("GET", {"If-Modified-Since": f"{AFTER}, garbage"}, None),
    ("GET", {"If-Modified-Since": "Sun, 06 Nov 1994 09:49:37 +0100"}, None),  # not GMT
    # The Date's second or later: no Last-Modified this server sent, and maybe weak
    ("GET", {"If-Modified-Since": http_date(NOW + 1)}, None),
    ("GET", {"If-Modified-Since": http_date(NOW)}, None),
    ("GET", {"If-Modified-Since": http_date(NOW - 1)}, 304),
    ("GET", {"If-Modified-Since": ""}, None),
    ("GET", {"If-Modified-Since": RFC850}, 304),
    ("GET", {"If-Modified-Since": ASCTIME}, 304),
    ("GET", {"If-None-Match": '"v2"', "If-Modified-Since": SAME}, None),
    ("GET", {"If-None-Match": '"v1"', "If-Modified-Since": BEFORE}, 304),
    # §13.2.2 order: If-Match / If-Unmodified-Since before If-None-Match
    ("GET", {"If-Match": '"v2"', "If-None-Match": '"v1"'}, FAIL),
    ("GET", {"If-Match": '"v1"', "If-None-Match": '"v1"'}, 304),
    ("GET", {"If-Match": '"v1"', "If-None-Match": '"v2"'}, None),
    ("GET", {"If-Unmodified-Since": BEFORE, "If-None-Match": '"v1"'}, FAIL),
    ("GET", {"If-Unmodified-Since": BEFORE, "If-Modified-Since": SAME}, FAIL),
    ("GET", {"If-Unmodified-Since": SAME, "If-Modified-Since": SAME}, 304),
]


@pytest.mark.parametrize(("method", "headers", "expected"), PRECONDITION_CASES)
def test_evaluate_preconditions(method: str, headers: dict[str, str], expected: int | None) -> None:
    if expected == FAIL:
        with pytest.raises(PreconditionFailed) as info:
            evaluate_preconditions(method, headers, ETAG, MTIME_NS, NOW)
        assert info.value.status_hint == 412
        assert isinstance(info.value, ProtocolError)
    else:
        assert evaluate_preconditions(method, headers, ETAG, MTIME_NS, NOW) == expected


# (If-Range value or None, holds)
IF_RANGE_CASES: list[tuple[str | None, bool]] = [
    (None, True),
    ('"v1"', True),
    (' "v1" ', True),
    ('"v2"', False),
    ('W/"v1"', False),  # weak tags never validate a range
    ('W/"v2"', False),
    ('"v1", "v2"', False),
    ('"v1', False),
    ("v1", False),
    ("*", False),
    (SAME, True),
    (f"  {SAME} ", True),
    (BEFORE, False),
    (AFTER, False),
    (RFC850, True),
    (ASCTIME, True),
    ("garbage", False),
    ("", False),
    ("Sun, 06 Nov 1994 25:49:37 GMT", False),
]


@pytest.mark.parametrize(("value", "holds"), IF_RANGE_CASES)
def test_if_range_holds(value: str | None, holds: bool) -> None:
    headers = {} if value is None else {"If-Range": value}
    assert if_range_holds(headers, ETAG, MTIME_NS, NOW) is holds


# (mtime in ns, the answer's Date, whether If-Range: <the version's date> holds)
IF_RANGE_DATE_CASES: list[tuple[int, int, bool]] = [
    (MTIME * NS, MTIME + 1, True),  # a whole second before the Date: strong (§8.8.2.2)
    (MTIME * NS + 1, MTIME + 1, False),  # less than a second before: weak
    (MTIME_NS, MTIME + 1, False),
    (MTIME_NS, MTIME + 2, True),
    (MTIME_NS, MTIME, False),  # written in the very second it is read
    (MTIME * NS + NS - 1, MTIME, False),  # the last nanosecond of it
    (MTIME_NS, MTIME - 3600, False),  # an mtime ahead of the clock
]


@pytest.mark.parametrize(("mtime_ns", "now", "holds"), IF_RANGE_DATE_CASES)
def test_if_range_date_holds_only_when_strong(mtime_ns: int, now: int, holds: bool) -> None:
    assert if_range_holds({"If-Range": SAME}, ETAG, mtime_ns, now) is holds


@pytest.mark.parametrize(
    ("mtime_ns", "now", "expected"),
    [
        (MTIME_NS, NOW, MTIME),
        (MTIME_NS, MTIME + 1, MTIME),
        (MTIME_NS, MTIME, MTIME - 1),  # read in the second it was written: a second back
        (MTIME_NS, MTIME - 1, MTIME - 2),  # ahead of the clock: before the Date
        (MTIME_NS + 3600 * NS, MTIME, MTIME - 1),
        # st_mtime as a float rounds this one up into the next second; nanoseconds do not
        (1_700_000_000_999_999_999, 1_800_000_000, 1_700_000_000),
    ],
)
def test_last_modified_is_the_mtime_but_a_second_before_the_date_at_most(
    mtime_ns: int, now: int, expected: int
) -> None:
    assert last_modified(mtime_ns, now) == expected


# (text, epoch seconds or None)
DATE_CASES: list[tuple[str, int | None]] = [
    (SAME, MTIME),
    (RFC850, MTIME),
    (ASCTIME, MTIME),
    ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
    # RFC 9110 §5.6.7: only the three GMT forms are HTTP-dates
    ("Sun, 06 Nov 1994 08:49:37 +0100", None),
    ("Sun, 06 Nov 1994 08:49:37 -0000", None),
    ("Sun, 06 Nov 1994 08:49:37 UTC", None),
    ("Sun, 6 Nov 1994 08:49:37 GMT", None),
    ("sun, 06 nov 1994 08:49:37 gmt", None),
    (f"{SAME}, {SAME}", None),
    (f"{SAME},{SAME}", None),
    (f" {SAME} ", MTIME),  # optional whitespace around a field value
    ("Sun, 31 Feb 1994 08:49:37 GMT", None),
    ("Sun, 06 Nov 1994 08:60:37 GMT", None),
    ("Sunday, 06-Nov-94 08:49:37", None),
    ("Tuesday, 14-Nov-23 22:13:20 GMT", 1700000000),
    ("Tue Nov 14 22:13:20 2023", 1700000000),
    ("garbage", None),
    ("", None),
    ("Sun, 06 Nov 1994 25:49:37 GMT", None),
    ("Sun, 32 Nov 1994 08:49:37 GMT", None),
    ("Sun, 06 Nov 99999 08:49:37 GMT", None),
    ("784111777", None),
]


@pytest.mark.parametrize(("text", "expected"), DATE_CASES)
def test_parse_http_date(text: str, expected: int | None) -> None:
    assert parse_http_date(text) == expected


@pytest.mark.parametrize(
    ("epoch", "text"),
    [
        (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        (MTIME, SAME),
        (1700000000, "Tue, 14 Nov 2023 22:13:20 GMT"),
    ],
)
def test_http_date(epoch: int, text: str) -> None:
    assert http_date(epoch) == text
    assert parse_http_date(text) == epoch
