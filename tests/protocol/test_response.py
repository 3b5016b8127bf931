"""Table-driven tests for :mod:`protocol.response`: exact status, headers and body."""

from __future__ import annotations

import pytest

from protocol.conditional import NS, PreconditionFailed
from protocol.errors import RangeNotSatisfiable, TooManyRanges
from protocol.ranges import MAX_RANGES, ByteRange
from protocol.response import Representation, ResponsePlan, plan_response, reframed

DATA = b"0123456789"
ETAG = '"v1"'
MTIME = 784111777
NOW = MTIME + 86400  # the Date of every answer: a day after the version
DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
OTHER_DATE = "Sun, 06 Nov 1994 08:49:38 GMT"
REP = Representation(size=len(DATA), etag=ETAG, mtime_ns=MTIME * NS)
OCTET = "application/octet-stream"
COMMON = (("Accept-Ranges", "bytes"), ("ETag", ETAG), ("Last-Modified", DATE))
B = "BOUNDARY"


def whole(size: int = 10, content_type: str = OCTET) -> ResponsePlan:
    body = (ByteRange(0, size),) if size else ()
    headers = (*COMMON, ("Content-Type", content_type), ("Content-Length", str(size)))
    return ResponsePlan(200, headers, body)


def partial(start: int, stop: int, content_type: str = OCTET) -> ResponsePlan:
    headers = (
        *COMMON,
        ("Content-Type", content_type),
        ("Content-Range", f"bytes {start}-{stop - 1}/10"),
        ("Content-Length", str(stop - start)),
    )
    return ResponsePlan(206, headers, (ByteRange(start, stop),))


def part_head(start: int, stop: int, first: bool = False) -> bytes:
    lead = b"" if first else b"\r\n"
    return (
        lead + b"--BOUNDARY\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Range: bytes %d-%d/10\r\n\r\n" % (start, stop - 1)
    )


def multipart(*ranges: tuple[int, int], length: int) -> ResponsePlan:
    body: list[bytes | ByteRange] = []
    for i, (start, stop) in enumerate(ranges):
        body += [part_head(start, stop, first=i == 0), ByteRange(start, stop)]
    body.append(b"\r\n--BOUNDARY--\r\n")
    headers = (
        *COMMON,
        ("Content-Type", "multipart/byteranges; boundary=BOUNDARY"),
        ("Content-Length", str(length)),
    )
    return ResponsePlan(206, headers, tuple(body), "BOUNDARY")


# (name, headers, plan) for GET; HEAD plans like a GET without Range (RFC 9110 §14.2).
SIMPLE_CASES: list[tuple[str, dict[str, str], ResponsePlan]] = [
    ("no range", {}, whole()),
    ("first bytes", {"Range": "bytes=0-3"}, partial(0, 4)),
    ("one byte", {"Range": "bytes=5-5"}, partial(5, 6)),
    ("last byte", {"Range": "bytes=-1"}, partial(9, 10)),
    ("suffix", {"Range": "bytes=-3"}, partial(7, 10)),
    ("suffix longer than the object", {"Range": "bytes=-100"}, partial(0, 10)),
    ("open range", {"Range": "bytes=4-"}, partial(4, 10)),
    ("last clipped", {"Range": "bytes=8-100"}, partial(8, 10)),
    ("whole as a range", {"Range": "bytes=0-"}, partial(0, 10)),
    ("unparseable: first > last", {"Range": "bytes=5-4"}, whole()),
    ("unparseable: unit", {"Range": "items=0-1"}, whole()),
    ("unparseable: garbage", {"Range": "garbage"}, whole()),
    ("unparseable: non-ASCII digit", {"Range": "bytes=٣-5"}, whole()),
    ("unparseable: empty", {"Range": ""}, whole()),
    # If-Range
    ("If-Range etag matches", {"Range": "bytes=0-3", "If-Range": ETAG}, partial(0, 4)),
    ("If-Range etag differs", {"Range": "bytes=0-3", "If-Range": '"v2"'}, whole()),
    ("If-Range weak etag", {"Range": "bytes=0-3", "If-Range": 'W/"v1"'}, whole()),
    ("If-Range date equal", {"Range": "bytes=0-3", "If-Range": DATE}, partial(0, 4)),
    ("If-Range date differs", {"Range": "bytes=0-3", "If-Range": OTHER_DATE}, whole()),
    ("If-Range garbage", {"Range": "bytes=0-3", "If-Range": "garbage"}, whole()),
    ("If-Range mismatch beats 416", {"Range": "bytes=20-", "If-Range": '"v2"'}, whole()),
    ("If-Range without Range", {"If-Range": '"v2"'}, whole()),
    # several ranges: overlapping ones merge, disjoint ones keep their order
    ("unsatisfiable one dropped", {"Range": "bytes=0-1,20-30"}, partial(0, 2)),
    ("duplicates merge", {"Range": "bytes=0-1,0-1"}, partial(0, 2)),
    ("overlap merges", {"Range": "bytes=0-5,3-8"}, partial(0, 9)),
    ("contained merges", {"Range": "bytes=0-9,3-4"}, partial(0, 10)),
    ("reversed overlap merges", {"Range": "bytes=3-8,0-5"}, partial(0, 9)),
    ("one shared byte", {"Range": "bytes=0-1,1-2"}, partial(0, 3)),
    ("suffix overlaps", {"Range": "bytes=-4,5-6"}, partial(5, 10)),
    ("disjoint", {"Range": "bytes=0-1,4-5"}, multipart((0, 2), (4, 6), length=188)),
    ("disjoint keep order", {"Range": "bytes=6-7,0-1"}, multipart((6, 8), (0, 2), length=188)),
    ("adjacent stay apart", {"Range": "bytes=0-1,2-3"}, multipart((0, 2), (2, 4), length=188)),
    (
        "overlap merges, then sorted",
        {"Range": "bytes=6-7,0-1,1-2"},
        multipart((0, 3), (6, 8), length=189),
    ),
    (
        "three disjoint",
        {"Range": "bytes=9-9,0-0,4-5"},
        multipart((9, 10), (0, 1), (4, 6), length=273),
    ),
    # conditionals win over ranges
    ("If-None-Match matches", {"If-None-Match": ETAG}, ResponsePlan(304, COMMON, ())),
    (
        "304 ignores Range",
        {"If-None-Match": ETAG, "Range": "bytes=0-1"},
        ResponsePlan(304, COMMON, ()),
    ),
    ("304 before 416", {"If-None-Match": "*", "Range": "bytes=20-"}, ResponsePlan(304, COMMON, ())),
    ("If-Modified-Since", {"If-Modified-Since": DATE}, ResponsePlan(304, COMMON, ())),
    ("If-None-Match differs", {"If-None-Match": '"v2"', "Range": "bytes=0-3"}, partial(0, 4)),
    ("If-Match matches", {"If-Match": ETAG, "Range": "bytes=0-3"}, partial(0, 4)),
]


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize(
    ("name", "headers", "expected"), SIMPLE_CASES, ids=[c[0] for c in SIMPLE_CASES]
)
def test_plan(method: str, name: str, headers: dict[str, str], expected: ResponsePlan) -> None:
    plan = plan_response(method, headers, REP, B, NOW)
    if method == "HEAD":
        without_range = {k: v for k, v in headers.items() if k != "Range"}
        expected = plan_response("GET", without_range, REP, B, NOW)
    assert plan == expected
    announced = dict(plan.headers).get("Content-Length")
    if plan.status != 304:
        assert announced == str(plan.content_length)


def render(plan: ResponsePlan, data: bytes = DATA) -> bytes:
    return b"".join(p if isinstance(p, bytes) else data[p.start : p.stop] for p in plan.body)


def test_multipart_body_exact_bytes() -> None:
    plan = plan_response("GET", {"Range": "bytes=0-1,4-5"}, REP, B, NOW)
    body = render(plan)
    assert body == (
        b"--BOUNDARY\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Range: bytes 0-1/10\r\n\r\n01"
        b"\r\n--BOUNDARY\r\nContent-Type: application/octet-stream\r\n"
        b"Content-Range: bytes 4-5/10\r\n\r\n45"
        b"\r\n--BOUNDARY--\r\n"
    )
    assert len(body) == 188 == plan.content_length
    assert dict(plan.headers)["Content-Length"] == "188"
    assert plan.ranges == [ByteRange(0, 2), ByteRange(4, 6)]


def test_multipart_uses_the_representation_content_type() -> None:
    rep = Representation(size=10, etag=ETAG, mtime_ns=MTIME * NS, content_type="text/plain")
    plan = plan_response("GET", {"Range": "bytes=0-0,9-9"}, rep, "b", NOW)
    body = render(plan)
    assert body == (
        b"--b\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-0/10\r\n\r\n0"
        b"\r\n--b\r\nContent-Type: text/plain\r\nContent-Range: bytes 9-9/10\r\n\r\n9"
        b"\r\n--b--\r\n"
    )
    assert dict(plan.headers)["Content-Type"] == "multipart/byteranges; boundary=b"
    assert dict(plan.headers)["Content-Length"] == str(len(body)) == "137"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({}, whole(content_type="text/plain")), ({"Range": "bytes=1-2"}, partial(1, 3, "text/plain"))],
)
def test_content_type_is_announced(headers: dict[str, str], expected: ResponsePlan) -> None:
    rep = Representation(size=10, etag=ETAG, mtime_ns=MTIME * NS, content_type="text/plain")
    assert plan_response("GET", headers, rep, B, NOW) == expected


EMPTY = Representation(size=0, etag=ETAG, mtime_ns=MTIME * NS)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_empty_object_whole(method: str) -> None:
    plan = plan_response(method, {}, EMPTY, B, NOW)
    assert plan == whole(size=0)
    assert plan.content_length == 0
    assert plan.ranges == []


# (representation, Range) that must be answered with 416 carrying the size
UNSATISFIABLE_CASES: list[tuple[Representation, str]] = [
    (EMPTY, "bytes=0-"),
    (EMPTY, "bytes=0-0"),
    (EMPTY, "bytes=-1"),
    (EMPTY, "bytes=-100"),
    (EMPTY, "bytes=0-0,-5"),
    (REP, "bytes=10-"),
    (REP, "bytes=10-20,-0"),
    (REP, "bytes=99999999999999999999999-"),
]


@pytest.mark.parametrize(("rep", "header"), UNSATISFIABLE_CASES)
def test_unsatisfiable(rep: Representation, header: str) -> None:
    with pytest.raises(RangeNotSatisfiable) as info:
        plan_response("GET", {"Range": header}, rep, B, NOW)
    assert info.value.size == rep.size
    assert info.value.status_hint == 416


@pytest.mark.parametrize(("rep", "header"), UNSATISFIABLE_CASES)
def test_head_ignores_range(rep: Representation, header: str) -> None:
    plan = plan_response("HEAD", {"Range": header}, rep, B, NOW)
    assert plan.status == 200
    assert dict(plan.headers)["Content-Length"] == str(rep.size)


def test_empty_object_unparseable_range_is_whole() -> None:
    assert plan_response("GET", {"Range": "bytes=5-4"}, EMPTY, B, NOW) == whole(size=0)


@pytest.mark.parametrize(
    "headers",
    [
        {"If-Match": '"v2"'},
        {"If-Match": 'W/"v1"', "Range": "bytes=0-1"},
        {"If-Unmodified-Since": "Sun, 06 Nov 1994 08:49:36 GMT"},
        {"If-Match": '"v2"', "Range": "bytes=20-"},  # 412 before 416
    ],
)
def test_precondition_failed(headers: dict[str, str]) -> None:
    with pytest.raises(PreconditionFailed):
        plan_response("GET", headers, REP, B, NOW)


def test_too_many_ranges() -> None:
    header = "bytes=" + ",".join(["0-0"] * (MAX_RANGES + 1))
    with pytest.raises(TooManyRanges) as info:
        plan_response("GET", {"Range": header}, REP, B, NOW)
    # RFC 9110 §15.5.17: 416, and the size for its Content-Range
    assert isinstance(info.value, RangeNotSatisfiable)
    assert (info.value.status_hint, info.value.size) == (416, len(DATA))


def test_last_modified_never_follows_the_date() -> None:
    ahead = Representation(size=len(DATA), etag=ETAG, mtime_ns=(MTIME + 3600) * NS)
    plan = plan_response("GET", {}, ahead, B, MTIME + 1)
    assert dict(plan.headers)["Last-Modified"] == DATE  # a second before the Date
    assert plan_response("GET", {}, REP, B, MTIME + 1) == whole()


@pytest.mark.parametrize(
    ("mtime_ns", "now", "status"),
    [
        (MTIME * NS, MTIME + 1, 206),  # a second old: the date is a strong validator
        (MTIME * NS + 1, MTIME + 1, 200),  # rewritable within the same second: weak
        (MTIME * NS, MTIME, 200),
        ((MTIME + 3600) * NS, MTIME, 200),  # ahead of the clock
    ],
)
def test_if_range_date_only_validates_a_version_a_second_old(
    mtime_ns: int, now: int, status: int
) -> None:
    rep = Representation(size=len(DATA), etag=ETAG, mtime_ns=mtime_ns)
    plan = plan_response("GET", {"Range": "bytes=2-3", "If-Range": DATE}, rep, B, now)
    assert plan.status == status


def test_if_modified_since_of_a_capped_date_is_not_a_304() -> None:
    """Last-Modified was capped, as the mtime was ahead: that date vouches for nothing."""
    ahead = Representation(size=len(DATA), etag=ETAG, mtime_ns=(MTIME + 3600) * NS)
    sent = dict(plan_response("GET", {}, ahead, B, MTIME).headers)["Last-Modified"]
    for now in (MTIME, MTIME + 1, MTIME + 2, MTIME + 7200):
        assert plan_response("GET", {"If-Modified-Since": sent}, ahead, B, now).status == 200


def test_max_ranges_multipart_length_matches_body() -> None:
    data = bytes(range(256)) * 4
    rep = Representation(size=len(data), etag=ETAG, mtime_ns=MTIME * NS)
    header = "bytes=" + ",".join(f"{4 * i}-{4 * i + 1}" for i in range(MAX_RANGES))
    plan = plan_response("GET", {"Range": header}, rep, B, NOW)
    assert plan.status == 206
    assert plan.ranges == [ByteRange(4 * i, 4 * i + 2) for i in range(MAX_RANGES)]
    body = render(plan, data)
    assert len(body) == plan.content_length == int(dict(plan.headers)["Content-Length"])
    assert body.count(b"--BOUNDARY\r\n") == MAX_RANGES
    assert body.endswith(b"\r\n--BOUNDARY--\r\n")


@pytest.mark.parametrize("header, ranges", [
    ("bytes=0-1,2-3,7-8", [(0, 2), (2, 4), (7, 9)]),  # ascending, touching: kept apart
    ("bytes=7-8,0-1,4-5", [(7, 9), (0, 2), (4, 6)]),  # disjoint: the order asked for
    ("bytes=4-6,0-1,5-8", [(0, 2), (4, 9)]),  # overlapping: merged, in order
])
def test_ranges_are_merged_only_when_they_overlap(
    header: str, ranges: list[tuple[int, int]]
) -> None:
    plan = plan_response("GET", {"Range": header}, REP, B, NOW)
    assert plan.ranges == [ByteRange(a, b) for a, b in ranges]
    body = render(plan, DATA)
    assert len(body) == plan.content_length == int(dict(plan.headers)["Content-Length"])
    again = reframed(plan, "OTHER")
    assert len(render(again, DATA)) == again.content_length == len(body) - 3 * (len(ranges) + 1)


def test_overlapping_many_ranges_merge_to_whole() -> None:
    header = "bytes=" + ",".join(f"{i}-{i + 1}" for i in range(9))
    assert plan_response("GET", {"Range": header}, REP, B, NOW) == partial(0, 10)


def test_response_plan_properties() -> None:
    plan = ResponsePlan(206, (), (b"ab", ByteRange(3, 7), b"c", ByteRange(0, 1)))
    assert plan.content_length == 8
    assert plan.ranges == [ByteRange(3, 7), ByteRange(0, 1)]


def test_a_date_sent_in_its_own_second_never_validates_a_rewrite_of_that_second() -> None:
    v1 = Representation(size=len(DATA), etag=ETAG, mtime_ns=MTIME * NS + 300_000_000)
    sent = dict(plan_response("GET", {}, v1, B, MTIME).headers)["Last-Modified"]
    v2 = Representation(size=len(DATA), etag='"v2"', mtime_ns=MTIME * NS + 800_000_000)
    for now in (MTIME, MTIME + 1, MTIME + 60):
        revalidated = plan_response("GET", {"If-Modified-Since": sent}, v2, B, now)
        assert revalidated.status == 200
        ranged = plan_response("GET", {"Range": "bytes=2-3", "If-Range": sent}, v2, B, now)
        assert ranged.status == 200
