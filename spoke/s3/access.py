"""Who may read what through the S3 front end.

Without keys (no ``--s3-credentials``) reads are anonymous, as from a public bucket:
signed and unsigned requests alike, signatures unchecked. With keys, every request
carries a SigV4 signature (:mod:`protocol.s3.sigv4`) and its key's prefixes bound what it
reads, checked before any byte (cached or not) is served.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping

from protocol.http1 import Headers as RequestFields
from protocol.s3.credentials import S3Key, parse_credentials
from protocol.s3.errors import AccessDenied
from protocol.s3.sigv4 import Headers, Verified, epoch_s, verified

# The clock: epoch seconds (time.time, read on every signed request) or a datetime.
Now = Callable[[], datetime.datetime | float]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def load_keys(path: str) -> dict[str, S3Key]:
    """The keys in credentials file ``path``; raises ValueError (naming the line) or OSError."""
    with open(path, encoding="utf-8") as f:
        keys = parse_credentials(f.read())
    if not keys:
        raise ValueError(f"{path} lists no keys")
    return keys


class S3Access:
    """The front end's check of each request: anonymous when ``keys`` is None."""

    def __init__(self, keys: Mapping[str, S3Key] | None, now: Now = time.time) -> None:
        self.keys = keys
        self.now = now

    def caller(self, method: str, raw_path: str, raw_query: str, headers: Headers) -> S3Key | None:
        """The key a request is signed with (None: anonymous mode); raises
        :class:`~protocol.s3.sigv4.S3AuthError`. ``headers``: as
        :func:`~protocol.s3.sigv4.authenticate` takes them."""
        if self.keys is None:
            return None
        return self.verified(method, raw_path, raw_query, headers).key

    def verified(self, method: str, raw_path: str, raw_query: str, headers: Headers) -> Verified:
        """:meth:`caller`'s verdict as a :class:`~protocol.s3.sigv4.Verified` (keys are
        required), to ask again with :meth:`holds`."""
        assert self.keys is not None
        return verified(method, raw_path, raw_query, headers, self.keys, self.now())

    def holds(self, seen: Verified, method: str, headers: RequestFields) -> bool:
        """Whether a request of the path and query ``seen`` verified for (the caller's to
        compare), with ``method`` and a fast path's ``headers``, verifies now as it did."""
        assert self.keys is not None
        return seen.holds(method, headers, self.keys, epoch_s(self.now()))


def check_object(key: S3Key | None, path: str) -> None:
    if key is not None and not key.allows(path):
        raise AccessDenied("the key's prefixes do not cover this object")


def check_listing(key: S3Key | None, prefix: str) -> None:
    if key is not None and not key.allows_listing(prefix):
        raise AccessDenied("the key's prefixes do not cover this listing")


def sees_bucket(key: S3Key | None, bucket: str) -> bool:
    """Whether a key's prefixes reach into ``bucket`` (it may see the bucket exists)."""
    return key is None or any(p == "" or p.split("/", 1)[0] == bucket for p in key.prefixes)
