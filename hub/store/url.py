"""Which roots name an object store, and the bucket and prefix they name (pure)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMES = ("s3://",)


class BadStoreRoot(ValueError):
    """A root that looks like a store URL but names no bucket."""


@dataclass(frozen=True, slots=True)
class StoreRoot:
    bucket: str
    # "" or ends with "/": the keys the hub serves are exactly those that start with it.
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def is_store_root(root: str) -> bool:
    return root.startswith(SCHEMES)


def parse_store_root(root: str) -> StoreRoot:
    """``s3://bucket`` or ``s3://bucket/some/prefix`` (a trailing slash is optional)."""
    if not root.startswith("s3://"):
        raise BadStoreRoot(f"not an s3:// root: {root!r}")
    bucket, _, prefix = root[len("s3://"):].partition("/")
    if not bucket or any(c in bucket for c in "?#\\ ") or ".." in prefix.split("/"):
        raise BadStoreRoot(f"no bucket named in root {root!r} (s3://BUCKET[/PREFIX])")
    prefix = prefix.strip("/")
    return StoreRoot(bucket, prefix + "/" if prefix else "")
