"""What can go wrong between a spoke and its hub, as HTTP statuses for loaders."""

from __future__ import annotations

from protocol.errors import ProtocolError


class HubError(ProtocolError):
    """Base of failures talking to the hub."""

    status_hint = 502
    title = "Bad Gateway"
    retryable = True  # worth another attempt (the same request may well succeed)
    retry_after_s: float | None = None


class HubUnavailable(HubError):
    """The hub cannot be reached (connection refused, reset, DNS)."""

    status_hint = 503
    title = "Hub unavailable"
    retry_after_s: float | None = 1.0


class UnavailableAnswer(HubUnavailable):
    """The upstream answered 502, 503 or 504: it is there, what is behind it is not (for a
    peer of the tier: its own hub fetch failed, which says nothing of the peer)."""


class HubTimeout(HubError):
    """The hub did not answer in time."""

    status_hint = 504
    title = "Hub timeout"
    retry_after_s: float | None = 1.0


class BadGateway(HubError):
    """The hub answered something a spoke cannot use (wrong status, short body)."""


class HubRefused(BadGateway):
    """The hub refused the request itself (4xx): asking again changes nothing."""

    retryable = False


class ChunkCorrupt(HubError):
    """A chunk from the hub did not match its manifest digest; nothing was cached."""

    title = "Chunk failed verification"


class StaleVersion(HubError):
    """The object changed at the hub while we were reading the version we planned on."""

    retryable = False
    status_hint = 503
    title = "Object changed at the hub"
    retry_after_s: float | None = 1.0


class ObjectChanging(HubError):
    """The hub saw the object change while it hashed it (its 409): asked again, it
    hashes the version then current, so the spoke retries, and past its own bounded
    retries the loader is told to (503, ``Retry-After``). Not a connectivity failure:
    the breaker does not count it, and no stale manifest stands in for it (the
    object's bytes at the hub are no longer that version's)."""

    status_hint = 503
    title = "Object changing at the hub"
    retry_after_s: float | None = 1.0


class GoneAtHub(HubError):
    """The hub has no such object (its 404): not retried, and the loader is told so."""

    retryable = False
    status_hint = 404
    title = "Not Found"
