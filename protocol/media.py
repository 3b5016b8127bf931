"""The media type announced for an object, by its name's suffix.

A fixed table rather than :mod:`mimetypes`, whose database depends on the host's
``/etc/mime.types``: the hub and the spoke must announce the same type for the
same path on any machine.
"""

from __future__ import annotations

DEFAULT_MEDIA_TYPE = "application/octet-stream"
_BY_SUFFIX = {
    ".csv": "text/csv",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".txt": "text/plain",
    ".parquet": "application/vnd.apache.parquet",
    ".arrow": "application/vnd.apache.arrow.file",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".tar": "application/x-tar",
}


def content_type_for(path: str) -> str:
    """The ``Content-Type`` of object ``path``; octet-stream when unknown."""
    name = path.rpartition("/")[2].lower()
    dot = name.rfind(".")
    return _BY_SUFFIX.get(name[dot:], DEFAULT_MEDIA_TYPE) if dot > 0 else DEFAULT_MEDIA_TYPE
