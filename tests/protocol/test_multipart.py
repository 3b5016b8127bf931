"""parse_byteranges reads back exactly what plan_response frames."""

from __future__ import annotations

import pytest

from protocol.multipart import BadMultipart, parse_byteranges, slice_parts
from protocol.ranges import ByteRange
from protocol.response import Representation, plan_response

DATA = bytes(range(256)) * 4
REP = Representation(size=len(DATA), etag='"v1"', mtime=0)


def render(header: str) -> tuple[str, bytes]:
    plan = plan_response("GET", {"Range": header}, REP, "b0UNDARY")
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
    ],
)
def test_malformed_bodies_raise_bad_multipart(content_type: str, body: bytes) -> None:
    with pytest.raises(BadMultipart):
        parse_byteranges(content_type, body)
