"""An object's first chunk, asked of the hub alongside its manifest rather than after it.

A loader's first read of an object the spoke holds nothing of cost two round trips
before its first byte: the manifest, then the chunk. Which chunk is known before the
manifest is (the offset read, and the hub's chunk size from the manifests seen so
far), so both requests go out at once. The chunk is asked for without a version; its
answer says which one it is (its ETag) before any byte is kept, and it is used only
for a manifest of that version whose chunk it is exactly, and verified against that
manifest's digest like any fetch. Anything else (another version, another chunk size,
a read that never wanted it) is dropped: the cost is one wasted request, never a wrong
byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.chunks import chunk_bounds
from protocol.manifest import Manifest
from protocol.ranges import ByteRange, first_byte_wanted
from spoke.cache.flight import Filling
from spoke.upstream.errors import VersionChanged

# An early fetch no read took on (the read was a hit after all, or went away) is
# dropped this long after it ended; a reader worker's read reaches the owner later.
KEPT_S = 5.0


def early_offset(method: str, headers: Mapping[str, str]) -> int | None:
    """Where the bytes of a read's answer start, if the read is one to fetch early for:
    a GET sure to carry bytes of whatever version the hub has (no precondition that
    could make it a 304 or a 412), from an offset known without the size (no suffix)."""
    if method != "GET" or any(name.lower().startswith("if-") for name in headers):
        return None
    return first_byte_wanted(headers.get("Range"))


@dataclass(eq=False)
class Ahead:
    """One chunk fetch made before its object's manifest was known."""

    path: str
    asked: ByteRange  # a whole chunk at the guessed chunk size
    fill: Filling
    task: asyncio.Task[None] | None = None
    etag: str | None = None  # the answer's, once its head came
    # The version and length a manifest wants of it, once a flight took it on.
    wanted: tuple[str, int] | None = None

    def on_head(self, etag: str, got: ByteRange) -> None:
        """The answer's version and range, before its body (``HeadCheck``)."""
        if self.wanted is not None and (etag, got.length) != self.wanted:
            raise VersionChanged(f"{self.path} changed at the hub")
        if got.length != self.fill.length:
            self.fill.shorten(got.length)  # the object ends inside the chunk
        self.etag = etag

    def bounds_in(self, manifest: Manifest) -> ByteRange | None:
        """The chunk of ``manifest`` this fetch is exactly, if any: same version (as far
        as the answer has said), same start, and it ends where that chunk does (where
        the object does, for its last one)."""
        if manifest.path != self.path or self.etag not in (None, manifest.etag):
            return None
        index = self.asked.start // manifest.chunk_size
        bounds = chunk_bounds(index, manifest.size, manifest.chunk_size) \
            if self.asked.start < manifest.size else None
        if bounds is None or bounds.start != self.asked.start or \
                bounds.stop != min(self.asked.stop, manifest.size):
            return None
        return bounds

    def take_on(self, manifest: Manifest, bounds: ByteRange) -> None:
        """A flight of ``manifest``'s chunk at ``bounds`` uses this fetch: its bytes must
        be of that version and length."""
        self.wanted = (manifest.etag, bounds.length)
        if self.etag is None and bounds.length != self.fill.length:
            self.fill.shorten(bounds.length)  # before any byte came (the head has not)
