"""``python -m hub index --root s3://BUCKET[/PREFIX] --prefix P``: hash a prefix ahead of time.

Every object under the prefix is read once, streamed, and its per-chunk digests go into
the index a hub serving the same root, chunk size and algorithm reads
(``--index-dir``). Objects whose current version is indexed already are skipped, so an
interrupted run resumes where it stopped; a progress bar counts bytes on stderr.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Never

from tqdm import tqdm

from hub.backend import ObjectInfo, OpenObject
from hub.config import IndexConfig
from hub.manifests import ObjectChanged, compute_manifest
from hub.roots import RootError, open_backend
from hub.store.index import DigestIndex
from hub.store.url import is_store_root
from protocol.errors import ProtocolError

logger = logging.getLogger("hub.index")


class _Counted:
    """An open object whose reads advance the progress bar."""

    def __init__(self, inner: OpenObject, bar: tqdm[Never]) -> None:
        self._inner = inner
        self._bar = bar
        self.info = inner.info
        self.will_read = getattr(inner, "will_read", None)

    def read(self, offset: int, length: int) -> bytes:
        data = self._inner.read(offset, length)
        self._bar.update(len(data))
        return data

    def close(self) -> None:
        self._inner.close()


def run_index(config: IndexConfig, env: Mapping[str, str]) -> int:
    if not is_store_root(config.root):
        print(f"hub index: {config.root!r} is not an s3:// root (a directory needs no index)",
              file=sys.stderr)
        return 2
    try:
        backend = open_backend(config.root, config.s3_endpoint, config.s3_timeout, env)
    except RootError as exc:
        print(f"hub index: {exc}", file=sys.stderr)
        return 2
    scope = getattr(backend, "scope", None)
    assert isinstance(scope, str)
    index = DigestIndex(config.index_dir, scope)
    try:
        listed = list(backend.list(config.prefix))
    except ProtocolError as exc:
        print(f"hub index: cannot list {config.prefix!r}: {exc}", file=sys.stderr)
        return 1
    todo: list[ObjectInfo] = [
        info for info in listed
        if index.load(info.path, info.etag, config.chunk_size, config.digest_alg) is None
    ]
    failed = 0
    with tqdm(total=sum(i.size for i in todo), unit="B", unit_scale=True, unit_divisor=1024,
              desc=f"{len(todo)} objects", file=sys.stderr) as bar:
        for info in todo:
            try:
                obj = backend.open(info.path)
                try:
                    manifest = compute_manifest(_Counted(obj, bar), config.chunk_size,
                                                config.digest_alg)
                finally:
                    obj.close()
                if not backend.still_current(obj.info):
                    raise ObjectChanged(f"{info.path} changed while it was hashed")
                index.save(manifest)
            except ProtocolError as exc:
                failed += 1
                logger.warning("not indexed: %s", exc)
    index.close()
    print(f"indexed {len(todo) - failed} objects, {len(listed) - len(todo)} already indexed, "
          f"{failed} failed, in {index.path}", file=sys.stderr)
    return 1 if failed else 0
