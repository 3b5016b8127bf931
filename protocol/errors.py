"""The protocol's error tree.

Every error carries the HTTP status it most likely maps to (``status_hint``), the
way h11's ``ProtocolError.error_status_hint`` does, so the servers translate them
in one middleware instead of in every handler.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error raised by :mod:`protocol`."""

    status_hint: int = 400
    title: str = "Bad Request"


class BadPath(ProtocolError):
    """An object path that is not a plain relative path inside the namespace."""

    title = "Bad object path"


class BadSize(ProtocolError):
    """A size string such as ``4MiB`` that does not parse."""

    title = "Bad size"


def no_object(path: str) -> str:
    """The detail of a 404 for object ``path``, in the same words on hub and spoke
    (a loader must not tell them apart)."""
    return f"no object {path!r}"


class RangeNotSatisfiable(ProtocolError):
    """No range in a ``Range`` header overlaps the object (RFC 9110 §15.5.17).

    Carries the object's size so the 416 answer can say ``Content-Range: bytes */N``.
    """

    status_hint = 416
    title = "Range Not Satisfiable"

    def __init__(self, size: int, detail: str | None = None) -> None:
        super().__init__(detail or f"no requested range overlaps the object's {size} bytes")
        self.size = size


class TooManyRanges(RangeNotSatisfiable):
    """A ``Range`` header listing more ranges than we are willing to consider.

    416, as RFC 9110 §15.5.17 has it for "an excessive request of small or
    overlapping ranges". The alternative it allows, ignoring Range for a 200, would
    answer a loader's batch of samples with the whole object: possibly gigabytes
    nobody asked for, which its multipart parser cannot take either.
    """


class ManifestError(ProtocolError):
    """A manifest that does not decode or does not validate."""

    status_hint = 502
    title = "Bad manifest"


class MalformedRequest(ProtocolError):
    """Bytes that are not an HTTP/1 request head (garbage, a TLS hello, a broken line)."""


class UnknownMethod(ProtocolError):
    """A method no route of ours knows (RFC 9110 §15.6.2: 501, not 405)."""

    status_hint = 501
    title = "Not Implemented"


class UnsupportedVersion(ProtocolError):
    """A request line of an HTTP version other than 1.0 and 1.1 (RFC 9110 §15.6.6)."""

    status_hint = 505
    title = "HTTP Version Not Supported"


class MalformedResponse(ProtocolError):
    """Bytes that are not an HTTP/1 response head a client can read."""

    status_hint = 502
    title = "Bad Gateway"
