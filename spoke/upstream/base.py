"""Upstream: what the spoke's cache asks of wherever its objects come from.

The seam between the cache engine and the hub: :class:`spoke.upstream.hub.HubClient`
is the first implementation (structurally; it names no base class), and peers or an
object store can be others. The cache calls nothing else, so a test can hand it a
fake upstream and run it without a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from protocol.manifest import Manifest
from protocol.ranges import ByteRange


class BodyTarget(Protocol):
    """Where a chunk body goes: bytes are received into :meth:`space`, then counted."""

    def space(self) -> memoryview: ...

    def advance(self, nbytes: int) -> None: ...


# Told an answer's ETag and range before its body (see Upstream.fetch_into).
HeadCheck = Callable[[str, ByteRange], None]


class Upstream(Protocol):
    """Manifests, chunks into a caller's buffer, listings and the chunk size."""

    @property
    def connections_opened(self) -> int:
        """Connections opened to the upstream so far (a gauge of link churn)."""
        ...

    async def fetch_manifest(self, path: str) -> tuple[Manifest, bytes]:
        """The current manifest of ``path`` and its encoded bytes (kept for restarts)."""
        ...

    async def fetch_into(
        self, path: str, etag: str | None, r: ByteRange, target: BodyTarget,
        on_head: HeadCheck | None = None,
    ) -> None:
        """Bytes ``r`` of version ``etag`` of ``path`` received into ``target``; ``etag``
        None takes whatever version there is, told to ``on_head`` before any byte."""
        ...

    async def chunk_size(self) -> int | None:
        """The chunk size manifests will have; None if the upstream does not say."""
        ...

    async def list_objects(self, prefix: str) -> list[tuple[str, int]]:
        """(path, size) of every object under ``prefix``."""
        ...

    async def fetch_list(self, prefix: str, accept: str) -> tuple[bytes, str]:
        """The listing of ``prefix`` as the upstream renders it for ``accept``, and its type."""
        ...

    async def close(self) -> None: ...


class Placement(Protocol):
    """Which chunks this spoke keeps, when it is one of a tier (:mod:`spoke.tier`): the
    chunks other spokes own are served but not stored, so that the tier's cache is the
    sum of its spokes'."""

    def keeps(self, path: str, etag: str, index: int) -> bool: ...

    async def prefetch_at_owner(self, manifest: Manifest, index: int) -> bool | None:
        """Have the spoke that keeps chunk ``index`` fetch it (True if it had to); None
        if no other spoke could be asked."""
        ...
