"""Object path validation, shared by hub, spoke and clients.

An object path is a relative, '/'-separated name such as ``dataset/shard-0001.bin``.
The hub additionally reaches the file without following any link, so a name is
only ever its own file (:class:`hub.backend.FilesystemBackend`); this module is the
pure half.
"""

from __future__ import annotations

from urllib.parse import unquote

from protocol.errors import BadPath

MAX_PATH_BYTES = 1024
MAX_SEGMENT_BYTES = 255
# Decoding is repeated so that '%252e%252e' (double-encoded '..') is caught too; a
# path still changing after this many rounds is not a real object name.
_MAX_DECODE_ROUNDS = 4


def validate_path(path: str) -> str:
    """Return ``path`` unchanged if it is a safe object path, else raise :class:`BadPath`.

    Rejected: empty paths, absolute paths, empty segments (``a//b``, trailing ``/``),
    ``.`` and ``..`` segments in any percent-encoding, NUL and other control
    characters, backslashes, and paths longer than ``MAX_PATH_BYTES``.
    """
    if not path:
        raise BadPath("empty object path")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise BadPath(f"object path longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise BadPath("object paths are relative; absolute paths are refused")
    for segment in path.split("/"):
        _check_segment(segment)
    return path


def validate_prefix(prefix: str) -> str:
    """Validate a listing prefix: ``''`` (everything), or a path with optional trailing ``/``."""
    stripped = prefix[:-1] if prefix.endswith("/") else prefix
    if stripped:
        validate_path(stripped)
    return prefix


def _check_segment(segment: str) -> None:
    if not segment:
        raise BadPath("empty path segment")
    if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
        raise BadPath(f"path segment longer than {MAX_SEGMENT_BYTES} bytes")
    for decoded in _decodings(segment):
        if decoded in (".", ".."):
            raise BadPath("'.' and '..' segments are refused")
        if "\\" in decoded or "/" in decoded:
            raise BadPath("backslashes and encoded slashes are refused")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
            raise BadPath("NUL and control characters are refused")
        try:
            decoded.encode("utf-8")
        except UnicodeEncodeError:
            raise BadPath("path is not valid UTF-8") from None


def _decodings(segment: str) -> list[str]:
    """The segment as written, then each successive percent-decoding of it."""
    forms = [segment]
    for _ in range(_MAX_DECODE_ROUNDS):
        if "%" not in forms[-1]:
            break
        decoded = unquote(forms[-1], errors="surrogateescape")
        if decoded == forms[-1]:
            break
        forms.append(decoded)
    else:
        if unquote(forms[-1], errors="surrogateescape") != forms[-1]:
            raise BadPath("path segment is percent-encoded too many times")
    return forms
