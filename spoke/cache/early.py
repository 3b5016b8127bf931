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
import weakref
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.chunks import chunk_bounds
from protocol.manifest import Manifest
from protocol.ranges import ByteRange, first_byte_wanted
from spoke.cache.counters import SpokeStats
from spoke.cache.flight import BufferPool, Filling
from spoke.upstream.errors import StaleVersion

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
class EarlyFetch:
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
            raise StaleVersion(f"{self.path} changed at the hub")
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


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # a guess that failed: the flight that needed it fetches anew


class EarlyFetches:
    """The early fetches running or kept, at most one per object path.

    ``run`` brings an early fetch's bytes (a fetch slot, the upstream). A flight takes
    one on (:meth:`take`); the caller drops the others (:meth:`drop`) when its read
    is over, and one nobody drops is dropped :data:`KEPT_S` after it ended.
    """

    def __init__(
        self, run: Callable[[EarlyFetch], Coroutine[Any, Any, None]], buffers: BufferPool,
        stats: SpokeStats,
    ) -> None:
        self._run = run
        self._buffers = buffers
        self.stats = stats
        self._by_path: dict[str, EarlyFetch] = {}

    def __len__(self) -> int:
        return len(self._by_path)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def start(self, path: str, offset: int, chunk_size: int) -> EarlyFetch:
        """Fetch the chunk at ``offset`` of ``path``, guessing the chunk size."""
        start = offset - offset % chunk_size
        early = EarlyFetch(path, ByteRange(start, start + chunk_size),
                           Filling(chunk_size, self._buffers))
        early.task = asyncio.create_task(self._run(early))
        early.task.add_done_callback(_retrieve)
        # The timer holds it weakly: one a flight took on is the flight's to keep, and
        # its chunk buffer must not outlive the flight by KEPT_S.
        kept = weakref.ref(early)
        early.task.add_done_callback(lambda _: asyncio.get_running_loop().call_later(
            KEPT_S, lambda: self.drop(kept())))
        self._by_path[path] = early
        self.stats.early_fetches += 1
        return early

    def drop(self, early: EarlyFetch | None) -> None:
        """Let ``early`` go, cancelled if it runs; a no-op once a flight took it on."""
        if early is not None and self._by_path.get(early.path) is early:
            del self._by_path[early.path]
            if early.task is not None:
                early.task.cancel()

    def drop_all(self) -> None:
        for early in list(self._by_path.values()):
            self.drop(early)

    def drop_unusable(self, manifest: Manifest) -> None:
        """Drop the early fetch of ``manifest``'s object if it is of no use to it
        (another version or chunk size)."""
        early = self._by_path.get(manifest.path)
        if early is not None and early.bounds_in(manifest) is None:
            self.drop(early)

    def take(self, manifest: Manifest, bounds: ByteRange) -> EarlyFetch | None:
        """The early fetch that is exactly the chunk of ``manifest`` at ``bounds``,
        taken on by that chunk's flight."""
        early = self._by_path.get(manifest.path)
        if early is None or early.bounds_in(manifest) != bounds:
            return None
        del self._by_path[manifest.path]
        early.take_on(manifest, bounds)
        self.stats.early_fetches_used += 1
        return early
