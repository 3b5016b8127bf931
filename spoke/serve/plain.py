"""Plain reads: a loader's most common request, answered with the least work.

A ``GET`` of one ``bytes=a-b`` range within the object, of chunks all on disk,
with no field that could change the answer (conditionals, a read plan, a token).
Its answer is always the 206 that :meth:`spoke.serve.objects.ObjectReads.prepare` would
plan, so it is written from a head prefix made once per object version, from the
planner's own headers. Anything else, or any doubt, is None: the caller's general
path answers (tests check that both answer alike, line for line).

Where the chunks come from is a :class:`HitSource`: the spoke's own cache, or, in a
reader worker (:mod:`spoke.workers.pool`), its mirror of what the owner holds.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Awaitable
from itertools import takewhile
from typing import Protocol

from protocol.errors import ProtocolError
from protocol.headers import CACHE_HEADER, REQUEST_ID_HEADER
from protocol.http1 import RequestHead
from protocol.manifest import Manifest
from protocol.multipart import (
    DelimiterScan,
    new_boundary,
    scan_for_delimiters,
    scanned_part_holds,
)
from protocol.paths import validate_path
from protocol.ranges import ByteRange
from protocol.response import ResponsePlan, plan_response, reframed
from service.fast import FastConnection, Reply
from spoke.cache.engine import ChunkGone
from spoke.cache.keys import chunk_name, manifest_version
from spoke.serve.objects import representation

logger = logging.getLogger(__name__)

OBJECTS = "/objects/"
# Hits up to this size (a batch of samples) are answered within the read callback,
# when no single range is worth a sendfile: a connection then holds at most this
# much past flow control, as the next request is not read until it has drained.
SYNC_BYTES = 4 << 20
# Below this, one writev of the head and views of the mapped chunks costs less than
# a head held back and a sendfile (docs/performance.md).
SENDFILE_MIN_BYTES = 256 << 10
MAX_REMEMBERED_PATHS = 10_000
# The fields a plain read may carry; any other may change the answer (If-*, the
# read plan, a token) and is the general path's.
PLAIN_FIELDS = frozenset({
    "host", "range", "user-agent", "accept", "accept-encoding", "connection", "keep-alive",
    REQUEST_ID_HEADER.lower(),
})
WRITE_BLOCK_BYTES = 1 << 20
# A hit's X-Cache, as a field and as a head's line.
_HIT_FIELD = (CACHE_HEADER, "HIT")
_HIT_LINE = f"{CACHE_HEADER}: HIT\r\n"
_ONE_RANGE = re.compile(r"bytes=([0-9]{1,15})-([0-9]{1,15})")
# A head's fields are keyed by lower-case name: dict's own methods skip Headers' lower().
_has_field = dict.__contains__
_field = dict.__getitem__


class HitSource(Protocol):
    """Cached chunks by name (:func:`spoke.cache.keys.chunk_name`)."""

    def is_resident(self, name: str) -> bool: ...

    def read_hit(self, name: str, start: int, stop: int) -> bytes:
        """Bytes of a resident chunk, counted as a loader's hit; raises ChunkGone."""
        ...

    def peek(self, name: str, start: int, stop: int) -> bytes:
        """Bytes of a resident chunk, not counted as a hit (a check made once per
        chunk); raises ChunkGone."""
        ...

    def view_hit(self, name: str, start: int, stop: int) -> memoryview:
        """:meth:`read_hit`'s bytes as a view of the chunk's mapped file, no copy: only
        for a plain socket's transport (see :mod:`spoke.cache.open_chunks`)."""
        ...

    def fd_hit(self, name: str, need_bytes: int) -> int:
        """A resident chunk's open descriptor (valid within this callback), counted as
        a loader's hit; raises ChunkGone, also when it holds under ``need_bytes``."""
        ...

    def forget(self, name: str) -> None:
        """A resident chunk's file turned out short: not to be read again."""
        ...

    def served(self, manifest: Manifest, ranges: list[ByteRange]) -> None:
        """``ranges`` of ``manifest`` went to a loader from the cache, as one answer."""
        ...


class FileHitSource(HitSource, Protocol):
    def open_hit(self, name: str, need_bytes: int) -> int:
        """A new descriptor on a resident chunk's file (the caller closes it), counted as a
        loader's hit; raises ChunkGone if it is gone or shorter than ``need_bytes``."""
        ...


class PlainReads:
    def __init__(self) -> None:
        self._prefixes: dict[str, tuple[Manifest, bytes]] = {}
        self._paths: dict[str, str] = {}

    def object_path(self, target: str) -> str:
        """The object path in ``/objects/...`` ``target``; validated once, then remembered.
        Raises :class:`~protocol.errors.ProtocolError` for an invalid one."""
        path = self._paths.get(target)
        if path is None:
            path = validate_path(target[len(OBJECTS):])
            if len(self._paths) >= MAX_REMEMBERED_PATHS:
                self._paths.clear()
            self._paths[target] = path
        return path

    @staticmethod
    def is_plain(head: RequestHead) -> bool:
        """Whether ``head`` is a plain read (cached or not)."""
        return head.method == "GET" and PLAIN_FIELDS.issuperset(head.headers) and \
            _has_field(head.headers, "range")

    def answer(
        self, source: HitSource, conn: FastConnection, head: RequestHead, path: str,
        manifest: Manifest,
    ) -> Reply | None:
        """Answer ``head`` if it is a plain read of cached chunks, else None (nothing sent)."""
        if not self.is_plain(head):
            return None
        match = _ONE_RANGE.fullmatch(_field(head.headers, "range"))
        if match is None:
            return self._planned(source, conn, head, path, manifest)
        r = _one_range(match, manifest.size)
        if r is None or r.length > SYNC_BYTES or sendfile_worthy(conn, r):
            return None
        slices = _resident_slices(source, manifest, r)
        if slices is None:
            return None
        # A plain socket takes views of the mapped chunk files: head and bytes leave in
        # one writev, one copy (the kernel's), which below SENDFILE_MIN_BYTES costs less
        # than a head sent apart and a sendfile.
        read = source.view_hit if conn.can_sendfile else source.read_hit
        try:
            data = [read(*piece) for piece in slices]
        except ChunkGone:
            return None  # deleted behind our back: the general path fetches it again
        source.served(manifest, [r])
        start = self._head_prefix(path, manifest) + _head_rest(conn, head, r, manifest.size)
        conn.writelines([start, *data])
        return Reply(206, r.length, "HIT")

    def answer_large(
        self, source: FileHitSource, conn: FastConnection, head: RequestHead, path: str,
        manifest: Manifest,
    ) -> Reply | Awaitable[Reply] | None:
        """A plain read of one cached range worth a sendfile, sent that way; None when
        ``head`` is not one (then :meth:`answer` is the one to ask). What the socket
        takes at once goes within this callback; an awaitable sends the rest."""
        if not conn.can_sendfile or not self.is_plain(head):
            return None
        match = _ONE_RANGE.fullmatch(_field(head.headers, "range"))
        r = None if match is None else _one_range(match, manifest.size)
        if r is None or r.length < SENDFILE_MIN_BYTES:
            return None
        slices = _resident_slices(source, manifest, r)
        if slices is None:
            return None
        fds: list[int] = []
        try:
            fds += [source.open_hit(name, hi) for name, _, hi in slices]
        except ChunkGone:
            _close_all(fds)
            return None  # nothing sent yet: the general path fetches it again
        _, lo, hi = slices[0]
        start = self._head_prefix(path, manifest) + _head_rest(conn, head, r, manifest.size)
        try:
            sent = conn.sendfile_now(start, fds[0], lo, hi - lo)
        except (ConnectionError, EOFError) as exc:
            # The head may be gone: a cut connection is the only honest signal left.
            logger.warning("aborting a plain read of %s mid-body: %s", path, exc)
            conn.abort()
            _close_all(fds)
            return Reply(206, 0, "HIT")
        if sent == hi - lo and len(slices) == 1:
            _close_all(fds)
            source.served(manifest, [r])
            return Reply(206, r.length, "HIT")
        return self._send_rest(source, conn, path, manifest, r, slices, fds, sent)

    async def _send_rest(
        self, source: FileHitSource, conn: FastConnection, path: str, manifest: Manifest,
        r: ByteRange, slices: list[tuple[str, int, int]], fds: list[int], sent: int,
    ) -> Reply:
        """The bytes of a plain read the socket did not take at once (``sent`` of the
        first slice went); closes ``fds``."""
        try:
            for fd, (_, lo, hi) in zip(fds, slices, strict=True):
                await send_file_range(conn, fd, lo + sent, hi)
                sent = 0
        except ConnectionError:
            raise
        except Exception as exc:
            # The head is gone: a cut connection is the only honest signal left.
            logger.warning("aborting a plain read of %s mid-body: %s", path, exc)
            conn.abort()
        finally:
            _close_all(fds)
        source.served(manifest, [r])
        return Reply(206, r.length, "HIT")

    def _planned(
        self, source: HitSource, conn: FastConnection, head: RequestHead, path: str,
        manifest: Manifest,
    ) -> Reply | None:
        """Any other Range (several ranges: a batch of samples; a suffix), planned by
        the planner itself; None unless it is a 206 of cached chunks."""
        try:
            plan = plan_response("GET", head.headers, representation(manifest, path),
                                 new_boundary, int(time.time()))
        except ProtocolError:
            return None  # 416, too many ranges: the general path's answer
        ranges = plan.ranges
        if plan.status != 206 or not _fits_now(conn, plan.content_length, ranges):
            return None
        try:
            read = read_cached_body(source, manifest, plan, zero_copy=conn.can_sendfile)
        except ChunkGone:
            return None
        if read is None:
            return None
        plan, body = read
        source.served(manifest, ranges)
        conn.writelines([conn.head(206, [*plan.headers, _HIT_FIELD], head.keep_alive),
                         *body])
        return Reply(206, plan.content_length, "HIT")

    def _head_prefix(self, path: str, manifest: Manifest) -> bytes:
        """The head of a plain 206 of ``manifest``, up to the Content-Range's numbers."""
        known = self._prefixes.get(path)
        if known is not None and known[0] is manifest:
            return known[1]
        now = int(time.time())
        planned = plan_response(
            "GET", {"Range": "bytes=0-0"}, representation(manifest, path), "", now
        )
        prefix = "".join(
            f"{name}: {value}\r\n"
            for name, value in takewhile(lambda h: h[0] != "Content-Range", planned.headers)
        )
        head = f"HTTP/1.1 206 Partial Content\r\n{prefix}Content-Range: bytes ".encode("latin-1")
        if manifest.mtime >= now - 1:
            return head  # Last-Modified capped by this second's Date: not for later answers
        if len(self._prefixes) >= MAX_REMEMBERED_PATHS:
            self._prefixes.clear()
        self._prefixes[path] = (manifest, head)
        return head


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def sendfile_worthy(conn: FastConnection, r: ByteRange) -> bool:
    """Whether ``r`` goes out with sendfile rather than read and written."""
    return r.length >= SENDFILE_MIN_BYTES and conn.can_sendfile


def answerable_now(conn: FastConnection, plan: ResponsePlan) -> bool:
    """Whether ``plan``'s body, when cached, is sent within the read callback: small
    enough, and no range in it worth a sendfile."""
    return _fits_now(conn, plan.content_length, plan.ranges)


def _fits_now(conn: FastConnection, length: int, ranges: list[ByteRange]) -> bool:
    """:func:`answerable_now` of a plan of ``length`` bytes reading ``ranges``."""
    if length > SYNC_BYTES:
        return False
    return not conn.can_sendfile or all(r.stop - r.start < SENDFILE_MIN_BYTES for r in ranges)


async def send_file_range(conn: FastConnection, fd: int, lo: int, hi: int) -> None:
    """Bytes ``[lo, hi)`` of ``fd``: with sendfile, or, when the connection cannot
    (TLS, bytes still queued), read and written a block at a time. Raises EOFError
    when the file ends first (torn): the caller cuts the connection."""
    if await conn.sendfile(fd, lo, hi - lo):
        return
    for offset in range(lo, hi, WRITE_BLOCK_BYTES):
        data = os.pread(fd, min(hi, offset + WRITE_BLOCK_BYTES) - offset, offset)
        if len(data) < min(hi, offset + WRITE_BLOCK_BYTES) - offset:
            raise EOFError(f"the file ended at {offset + len(data)}, before {hi}")
        conn.write(data)
        await conn.drain()


def _one_range(match: re.Match[str], size: int) -> ByteRange | None:
    """The ``bytes=a-b`` range within an object of ``size`` bytes, or None (416's case)."""
    start, stop = int(match[1]), min(int(match[2]) + 1, size)
    return ByteRange(start, stop) if start < stop else None


Piece = bytes | memoryview
Slices = list[tuple[str, int, int]]


def read_cached_body(
    source: HitSource, manifest: Manifest, plan: ResponsePlan, *, zero_copy: bool
) -> tuple[ResponsePlan, list[Piece]] | None:
    """``plan`` and its body, its ranges read from cached chunks (each counted as a
    hit), or None, nothing counted, unless every chunk it needs is cached. Raises
    ChunkGone. ``zero_copy`` (the body goes to a plain TCP socket): views of the mapped
    chunk files rather than bytes read from them. A multipart plan comes back
    reframed if its boundary occurs in the bytes of its parts."""
    laid_out: list[bytes | Slices] = []
    for part in plan.body:
        slices = part if isinstance(part, bytes) else _resident_slices(source, manifest, part)
        if slices is None:
            return None
        laid_out.append(slices)
    if plan.boundary is not None:
        plan, laid_out = _clear_boundary(source, manifest, plan, laid_out)
    read = source.view_hit if zero_copy else source.read_hit
    body: list[Piece] = []
    for piece in laid_out:
        if isinstance(piece, bytes):
            body.append(piece)
        else:
            body += [read(*chunk) for chunk in piece]
    return plan, body


def _clear_boundary(
    source: HitSource, manifest: Manifest, plan: ResponsePlan, laid_out: list[bytes | Slices]
) -> tuple[ResponsePlan, list[bytes | Slices]]:
    """``plan`` and its layout, reframed if its parts hold its boundary. Decided from
    each chunk's :class:`DelimiterScan` (made once, by pread: Python never reads a
    mapped chunk, whose file may shrink under it), not by reading the parts again."""
    if not _suspect(source, manifest, plan, laid_out):
        return plan, laid_out
    parts = [
        [(_scan(source, manifest, name, part.start // manifest.chunk_size + k), lo, hi)
         for k, (name, lo, hi) in enumerate(piece)]
        for part, piece in zip(plan.body, laid_out, strict=True)
        if isinstance(part, ByteRange) and not isinstance(piece, bytes)
    ]
    boundary = plan.boundary
    assert boundary is not None
    if not _holds(parts, boundary):
        return plan, laid_out
    while _holds(parts, boundary):
        boundary = new_boundary()
    plan = reframed(plan, boundary)
    return plan, [p if isinstance(p, bytes) else slices
                  for p, slices in zip(plan.body, laid_out, strict=True)]


def _suspect(
    source: HitSource, manifest: Manifest, plan: ResponsePlan, laid_out: list[bytes | Slices]
) -> bool:
    """Whether a part might hold a boundary: it spans chunks, or its chunk holds
    something boundary-like. The usual batch (samples within chunks of binary data)
    is settled by one lookup per part."""
    for part, piece in zip(plan.body, laid_out, strict=True):
        if isinstance(piece, bytes):
            continue
        if len(piece) > 1:
            return True
        scan = _scans.get(piece[0][0])
        if scan is None:
            assert isinstance(part, ByteRange)
            scan = _scan(source, manifest, piece[0][0], part.start // manifest.chunk_size)
        if scan.found:
            return True
    return False


def _holds(parts: list[list[tuple[DelimiterScan, int, int]]], boundary: str) -> bool:
    return any(scanned_part_holds(boundary, part) for part in parts)


# Scans of chunks served in batches, by chunk name (a name is one version's bytes).
_scans: dict[str, DelimiterScan] = {}


def _scan(source: HitSource, manifest: Manifest, name: str, index: int) -> DelimiterScan:
    scan = _scans.get(name)
    if scan is None:
        stop = min(manifest.chunk_size, manifest.size - index * manifest.chunk_size)
        scan = scan_for_delimiters(source.peek(name, 0, stop))
        if len(_scans) >= MAX_REMEMBERED_PATHS:
            _scans.clear()
        _scans[name] = scan
    return scan


def _resident_slices(
    source: HitSource, manifest: Manifest, r: ByteRange
) -> list[tuple[str, int, int]] | None:
    """(chunk name, start, stop) of each chunk ``r`` touches, or None unless all are cached."""
    chunk_size, version = manifest.chunk_size, manifest_version(manifest)
    first, last = r.start // chunk_size, (r.stop - 1) // chunk_size
    if first == last:  # within one chunk: a batch's every sample, as a rule
        name = chunk_name(version, first)
        if not source.is_resident(name):
            return None
        base = first * chunk_size
        return [(name, r.start - base, r.stop - base)]
    slices = []
    for index in range(first, last + 1):
        name = chunk_name(version, index)
        if not source.is_resident(name):
            return None
        base = index * chunk_size
        slices.append((name, max(r.start, base) - base, min(r.stop, base + chunk_size) - base))
    return slices


def _head_rest(conn: FastConnection, head: RequestHead, r: ByteRange, size: int) -> bytes:
    """A plain 206's head after its prefix: the range's numbers, X-Cache, the end."""
    return (
        f"{r.start}-{r.stop - 1}/{size}\r\nContent-Length: {r.length}\r\n{_HIT_LINE}"
        f"{conn.head_end(head.keep_alive)}"
    ).encode("latin-1")
