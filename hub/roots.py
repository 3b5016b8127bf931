"""What ``--root`` names: a directory (the default), or an object store (``s3://``).

The one place that turns a root into a :class:`hub.backend.Backend`, and refuses, with
one line naming what is missing, a root that cannot be served (a missing directory, a
bucket that does not exist, credentials the store refuses).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hub.backend import Backend, FilesystemBackend
from hub.manifests import DigestStore
from hub.store.url import BadStoreRoot, is_store_root, parse_store_root


class RootError(Exception):
    """The root cannot be served; the message is one line for the operator."""


def open_backend(
    root: str, s3_endpoint: str | None, s3_timeout: float, env: Mapping[str, str],
    check_directory: bool = True,
) -> Backend:
    if not is_store_root(root):
        scheme, sep, _ = root.partition("://")
        if sep and scheme.isalnum():
            raise RootError(f"{scheme}:// roots are not served (s3:// or a directory): {root!r}")
        if check_directory and not os.path.isdir(root):
            raise RootError(f"no directory {root!r} to serve (--root)")
        return FilesystemBackend(root)
    # botocore is imported only by a hub that serves a store.
    from hub.store.s3 import StoreStartupError, open_store

    try:
        return open_store(parse_store_root(root), s3_endpoint, env, s3_timeout)
    except (BadStoreRoot, StoreStartupError) as exc:
        raise RootError(str(exc)) from None


def digest_store_for(backend: Backend, index_dir: str) -> DigestStore | None:
    """The persistent digest index of a backend whose reads cost (a store); None for files."""
    scope = getattr(backend, "scope", None)
    if not isinstance(scope, str):
        return None
    from hub.store.index import DigestIndex

    return DigestIndex(index_dir, scope)


def check_index_dir(backend: Backend, index_dir: str) -> None:
    """Refuse (:class:`RootError`) an index directory a store's hub could not write."""
    if getattr(backend, "scope", None) is None:
        return
    try:
        os.makedirs(index_dir, exist_ok=True)
        probe = os.path.join(index_dir, ".hub-write-check")
        with open(probe, "wb"):
            os.unlink(probe)
    except OSError as exc:
        raise RootError(f"cannot keep the digest index in {index_dir!r} (--index-dir): "
                        f"{exc.strerror}") from None
