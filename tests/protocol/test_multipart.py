"""parse_byteranges reads back exactly what plan_response frames."""

from __future__ import annotations

import pytest

import protocol.multipart
from protocol.multipart import (
    BOUNDARY_BYTES,
    BadMultipart,
    BoundaryWatch,
    boundary_avoiding,
    boundary_occurs,
    new_boundary,
    parse_byteranges,
    scan_for_delimiters,
    scanned_part_holds,
    slice_parts,
)
from protocol.ranges import ByteRange
from protocol.response import Representation, plan_response, reframed

DATA = bytes(range(256)) * 4
REP = Representation(size=len(DATA), etag='"v1"', mtime_ns=0)


def render(header: str) -> tuple[str, bytes]:
    plan = plan_response("GET", {"Range": header}, REP, "b0UNDARY", 0)
    body = b"".join(p if isinstance(p, bytes) else DATA[p.start:p.stop] for p in plan.body)
    return dict(plan.headers)["Content-Type"], body


@pytest.mark.parametrize(
    ("header", "ranges"),
    [
        ("bytes=0-1,4-5", [(0, 2), (4, 6)]),
        ("bytes=1000-,0-0", [(1000, 1024), (0, 1)]),
        ("bytes=-3,10-12,500-700", [(1021, 1024), (10, 13), (500, 701)]),
        ("bytes=0-9,5-14", [(0, 15)]),  # overlapping: merged by the server
    ],
)
def test_round_trip(header: str, ranges: list[tuple[int, int]]) -> None:
    content_type, body = render(header)
    if len(ranges) == 1:
        assert not content_type.startswith("multipart/")
        return
    parts = parse_byteranges(content_type, body)
    assert [(r.start, r.stop) for r, _ in parts] == ranges
    assert all(data == DATA[r.start:r.stop] for r, data in parts)


def test_slice_parts_finds_bytes_inside_merged_parts() -> None:
    parts = parse_byteranges(*render("bytes=0-9,100-199"))
    assert slice_parts(parts, ByteRange(150, 160)) == DATA[150:160]
    with pytest.raises(BadMultipart):
        slice_parts(parts, ByteRange(50, 60))


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/octet-stream", b""),
        ("multipart/byteranges", b"--x\r\n"),
        ("multipart/byteranges; boundary=x", b"nothing here"),
        ("multipart/byteranges; boundary=x", b"--x\r\nContent-Range: bytes 0-9/10\r\n\r\nshort"),
        ("multipart/byteranges; boundary=x", b"--x\r\nContent-Type: a/b\r\n\r\n0123\r\n--x--"),
        ("multipart/byteranges; boundary=x", b"--x\r\nContent-Range: bytes 5-1/9\r\n\r\n\r\n--x--"),
        ("multipart/byteranges; boundary=x", b"--x\r\nContent-Range: bytes 0-1/9"),
        # a part's Content-Range is read as strictly as any other (protocol.ranges)
        ("multipart/byteranges; boundary=x",
         b"--x\r\nContent-Range: bytes 0-1/1\r\n\r\n01\r\n--x--"),
        ("multipart/byteranges; boundary=x",
         b"--x\r\nContent-Range: bytes */9\r\n\r\n\r\n--x--"),
        ("multipart/byteranges; boundary=x",
         b"--x\r\nContent-Range: bytes 0 -1/9\r\n\r\n01\r\n--x--"),
    ],
)
def test_malformed_bodies_raise_bad_multipart(content_type: str, body: bytes) -> None:
    with pytest.raises(BadMultipart):
        parse_byteranges(content_type, body)


def test_a_part_range_of_unknown_length_is_read() -> None:
    body = b"--x\r\nContent-Range: bytes 2-3/*\r\n\r\n23\r\n--x--"
    assert parse_byteranges("multipart/byteranges; boundary=x", body) == [(ByteRange(2, 4), b"23")]


B = "0123456789abcdef01234567"
NEEDLE = b"--" + B.encode()


def test_boundaries_are_fresh_random_hex_of_one_length() -> None:
    seen = {new_boundary() for _ in range(1000)}
    assert len(seen) == 1000
    assert all(len(b) == 2 * BOUNDARY_BYTES and int(b, 16) >= 0 for b in seen)
    # Not a shared prefix and a counter: two in a row differ throughout, nearly always.
    pairs = [(new_boundary(), new_boundary()) for _ in range(50)]
    assert sum(a[:16] == b[:16] for a, b in pairs) == 0


# (name, one part's pieces, whether "--B" occurs in them)
OCCURS_CASES: list[tuple[str, list[bytes], bool]] = [
    ("absent", [b"x" * 100, b"y" * 100], False),
    ("empty", [], False),
    ("inside a piece", [b"abc" + NEEDLE + b"def"], True),
    ("the data starts with it", [NEEDLE + b"!"], True),
    ("the data ends with it", [b"!" + NEEDLE], True),
    ("across two pieces", [b"abc" + NEEDLE[:10], NEEDLE[10:] + b"def"], True),
    ("across three pieces", [NEEDLE[:5], NEEDLE[5:7], NEEDLE[7:]], True),
    ("all but the last byte", [b"abc" + NEEDLE[:-1], b"x"], False),
    ("without its dashes", [B.encode()], False),
    ("split, with a gap", [NEEDLE[:10], b"x", NEEDLE[10:]], False),
]


@pytest.mark.parametrize(
    ("name", "pieces", "occurs"), OCCURS_CASES, ids=[c[0] for c in OCCURS_CASES]
)
def test_boundary_occurs(name: str, pieces: list[bytes], occurs: bool) -> None:
    assert boundary_occurs(B, pieces) is occurs
    assert boundary_occurs(B, [memoryview(p) for p in pieces]) is occurs


@pytest.mark.parametrize(
    ("name", "pieces", "occurs"), OCCURS_CASES, ids=[c[0] for c in OCCURS_CASES]
)
def test_boundary_watch_refuses_what_holds_the_boundary(
    name: str, pieces: list[bytes], occurs: bool
) -> None:
    watch = BoundaryWatch(B)
    watch.next_part()
    assert all(watch.clean(p) for p in pieces) is not occurs


def test_boundary_watch_starts_each_part_afresh() -> None:
    watch = BoundaryWatch(B)
    watch.next_part()
    assert watch.clean(b"x" + NEEDLE[:10])
    watch.next_part()  # framing lies between: the halves are not adjacent
    assert watch.clean(NEEDLE[10:])


def test_boundary_avoiding_a_planted_one(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = iter([B, B, "fedcba9876543210fedcba98"])
    monkeypatch.setattr(protocol.multipart.secrets, "token_hex", lambda n: next(drawn))
    assert boundary_avoiding([[b"x", NEEDLE]]) == "fedcba9876543210fedcba98"


def test_reframed_plan_reads_back_with_the_new_boundary() -> None:
    planted = DATA[:100] + NEEDLE + DATA[100 + len(NEEDLE):]
    rep = Representation(size=len(planted), etag='"v1"', mtime_ns=0)
    plan = plan_response("GET", {"Range": "bytes=0-199,500-599"}, rep, B, 0)
    assert plan.boundary == B
    other = "fedcba9876543210fedcba98"
    again = reframed(plan, other)
    assert again.boundary == other and again.ranges == plan.ranges
    assert again.content_length == plan.content_length
    fields = dict(again.headers)
    assert fields["Content-Type"] == f"multipart/byteranges; boundary={other}"
    assert fields["Content-Length"] == str(plan.content_length)
    body = b"".join(p if isinstance(p, bytes) else planted[p.start:p.stop] for p in again.body)
    assert B.encode() not in b"".join(p for p in again.body if isinstance(p, bytes))
    parts = parse_byteranges(fields["Content-Type"], body)
    assert [data for _, data in parts] == [planted[:200], planted[500:600]]


def test_a_scan_finds_every_boundary_like_run_and_only_those() -> None:
    upper = b"--" + B.upper().encode()  # not a boundary of ours: those are lowercase
    data = b"x" + NEEDLE + b"--nothex" + b"-" * 30 + upper + b"-" + NEEDLE
    scan = scan_for_delimiters(data)
    assert scan.found == ((1, B.encode()), (len(data) - 26, B.encode()))  # "---" ends in "--"
    assert scan.head == data[:25] and scan.tail == data[-25:]


# (name, blocks and their [lo, hi) in one part, whether "--B" occurs in the part)
SCANNED_CASES: list[tuple[str, list[tuple[bytes, int, int]], bool]] = [
    ("absent", [(b"x" * 100, 10, 100), (b"y" * 100, 0, 50)], False),
    ("inside the slice", [(b"ab" + NEEDLE + b"cd", 0, 30)], True),
    ("before the slice", [(b"ab" + NEEDLE + b"cd", 3, 30)], False),
    ("after the slice", [(b"ab" + NEEDLE + b"cd", 0, 27)], False),
    ("across two chunks", [(b"x" * 40 + NEEDLE[:9], 5, 49), (NEEDLE[9:] + b"y" * 40, 0, 50)], True),
    ("another boundary", [(b"ab--fedcba9876543210fedcba98cd", 0, 30)], False),
]


@pytest.mark.parametrize(
    ("name", "blocks", "holds"), SCANNED_CASES, ids=[c[0] for c in SCANNED_CASES]
)
def test_scanned_part_holds(name: str, blocks: list[tuple[bytes, int, int]], holds: bool) -> None:
    slices = [(scan_for_delimiters(data), lo, hi) for data, lo, hi in blocks]
    assert scanned_part_holds(B, slices) is holds
    # What the scan decides is what reading the part's bytes would.
    assert boundary_occurs(B, [data[lo:hi] for data, lo, hi in blocks]) is holds
