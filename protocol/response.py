"""What to answer to ``GET``/``HEAD /objects/{path}``, decided without any I/O.

Both servers feed the request headers and the object's :class:`Representation`
in and get a :class:`ResponsePlan` out: status, headers and the body as an
ordered list of literal bytes (multipart framing) and object byte ranges. The
hub and the spoke then only differ in where the range bytes come from, which is
what keeps a loader unable to tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

from protocol.conditional import (
    evaluate_preconditions,
    http_date,
    if_range_holds,
    last_modified,
)
from protocol.ranges import ByteRange, content_range, parse_range

BodyPart = bytes | ByteRange


@dataclass(frozen=True, slots=True)
class Representation:
    """The selected representation of an object: what its headers describe."""

    size: int
    etag: str
    mtime_ns: int
    content_type: str = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class ResponsePlan:
    """Status, headers and body layout of one response."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: tuple[BodyPart, ...]
    boundary: str | None = None  # a multipart/byteranges answer's
    # The body's length when the planner counted it already (-1: not given); a batch's
    # body has a part per range and per part head, and it is asked for several times.
    length: int = field(default=-1, compare=False, repr=False)

    @property
    def content_length(self) -> int:
        if self.length >= 0:
            return self.length
        return sum(len(p) if isinstance(p, bytes) else p.length for p in self.body)

    @property
    def ranges(self) -> list[ByteRange]:
        """The object ranges the body needs, in order."""
        return [p for p in self.body if isinstance(p, ByteRange)]


def plan_response(
    method: str, headers: Mapping[str, str], rep: Representation,
    boundary: str | Callable[[], str], now: int,
) -> ResponsePlan:
    """Plan the answer to a ``GET`` or ``HEAD`` of ``rep``.

    ``boundary`` separates multipart/byteranges parts: pass
    :func:`protocol.multipart.new_boundary` itself, called only for a multipart
    answer (a fixed string is for tests). ``now``: the second the answer's
    ``Date`` will name, or an earlier one (dates are validators only relative to it).
    Raises :class:`~protocol.conditional.PreconditionFailed` (412) and
    :class:`~protocol.errors.RangeNotSatisfiable` (416, also for too many ranges).
    """
    common = (
        ("Accept-Ranges", "bytes"),
        ("ETag", rep.etag),
        ("Last-Modified", http_date(last_modified(rep.mtime_ns, now))),
    )
    forced = evaluate_preconditions(method, headers, rep.etag, rep.mtime_ns, now)
    if forced is not None:
        return ResponsePlan(forced, common, ())
    # RFC 9110 §14.2: range handling is defined for GET only; HEAD gets the 200 headers.
    ranges = _requested_ranges(headers, rep, now) if method == "GET" else None
    if ranges is None:
        return _whole(common, rep)
    if len(ranges) == 1:
        return _single_part(common, rep, ranges[0])
    return _multipart(common, rep, ranges, boundary if isinstance(boundary, str) else boundary())


def _requested_ranges(
    headers: Mapping[str, str], rep: Representation, now: int
) -> list[ByteRange] | None:
    header = headers.get("Range")
    if header is None or not if_range_holds(headers, rep.etag, rep.mtime_ns, now):
        return None
    ranges = parse_range(header, rep.size)
    return None if ranges is None else _bounded(ranges)


def _bounded(ranges: list[ByteRange]) -> list[ByteRange]:
    """Merge ranges that overlap so a response never repeats object bytes.

    RFC 9110 §14.2 lets a server coalesce ranges; doing it only when some overlap
    keeps the order a loader asked for in the common (disjoint) case and bounds
    the body to at most the object's size.
    """
    if all(a.stop <= b.start for a, b in pairwise(ranges)):
        return ranges  # ascending and disjoint, as a loader lists a batch: nothing to sort
    ordered = sorted(ranges, key=lambda r: r.start)
    overlap = any(b.start < a.stop for a, b in pairwise(ordered))
    if not overlap:
        return ranges
    merged = [ordered[0]]
    for r in ordered[1:]:
        last = merged[-1]
        if r.start <= last.stop:
            merged[-1] = ByteRange(last.start, max(last.stop, r.stop))
        else:
            merged.append(r)
    return merged


def _whole(common: tuple[tuple[str, str], ...], rep: Representation) -> ResponsePlan:
    body: tuple[BodyPart, ...] = (ByteRange(0, rep.size),) if rep.size else ()
    headers = (*common, ("Content-Type", rep.content_type), ("Content-Length", str(rep.size)))
    return ResponsePlan(200, headers, body)


def _single_part(
    common: tuple[tuple[str, str], ...], rep: Representation, r: ByteRange
) -> ResponsePlan:
    headers = (
        *common,
        ("Content-Type", rep.content_type),
        ("Content-Range", content_range(r, rep.size)),
        ("Content-Length", str(r.length)),
    )
    return ResponsePlan(206, headers, (r,))


def _multipart(
    common: tuple[tuple[str, str], ...],
    rep: Representation,
    ranges: list[ByteRange],
    boundary: str,
) -> ResponsePlan:
    # RFC 9110 §14.6: each part has its own Content-Type and Content-Range.
    body: list[BodyPart] = []
    length = 0
    for i, r in enumerate(ranges):
        lead = "\r\n" if i else ""
        head = (
            f"{lead}--{boundary}\r\nContent-Type: {rep.content_type}\r\n"
            f"Content-Range: {content_range(r, rep.size)}\r\n\r\n"
        ).encode("ascii")
        body += [head, r]
        length += len(head) + r.stop - r.start
    end = f"\r\n--{boundary}--\r\n".encode("ascii")
    body.append(end)
    length += len(end)
    headers = (
        *common,
        ("Content-Type", f"multipart/byteranges; boundary={boundary}"),
        ("Content-Length", str(length)),
    )
    return ResponsePlan(206, headers, tuple(body), boundary, length)


def reframed(plan: ResponsePlan, boundary: str) -> ResponsePlan:
    """Multipart ``plan`` with ``boundary`` in place of its own, for when the parts'
    bytes turn out to hold the first one."""
    assert plan.boundary is not None
    old, new = f"--{plan.boundary}".encode("ascii"), f"--{boundary}".encode("ascii")
    body = tuple(p.replace(old, new) if isinstance(p, bytes) else p for p in plan.body)
    length = sum(len(p) if isinstance(p, bytes) else p.length for p in body)
    replaced = {
        "Content-Type": f"multipart/byteranges; boundary={boundary}",
        "Content-Length": str(length),
    }
    headers = tuple((name, replaced.get(name, value)) for name, value in plan.headers)
    return ResponsePlan(plan.status, headers, body, boundary, length)
