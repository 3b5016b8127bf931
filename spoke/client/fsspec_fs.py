"""hubspoke as an fsspec filesystem: ``hubspoke://dataset/shard-0001.bin``.

Lets pandas, pyarrow, Hugging Face datasets, ... read through a spoke (or a hub)::

    fsspec.open("hubspoke://other/notes.csv", endpoint="http://spoke:8701")
    pd.read_csv("hubspoke://other/notes.csv", storage_options={"endpoint": url})

The endpoint comes from ``endpoint=`` or, failing that, ``HUBSPOKE_ENDPOINT``. The
namespace is flat object paths; directories are the '/'-separated prefixes of those
paths, as in object stores. Read-only: every write raises :class:`PermissionError`.
Files opened here pin the version they opened, like :meth:`spoke.client.clients.Client.open`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from fsspec.spec import (  # type: ignore[import-untyped]
    AbstractBufferedFile,
    AbstractFileSystem,
    make_instance,
)
from fsspec.utils import stringify_path  # type: ignore[import-untyped]

from spoke.client.clients import Client, ObjectNotFound, ObjectStat

ENDPOINT_ENV = "HUBSPOKE_ENDPOINT"
# The spoke's usual chunk size: a block then costs the spoke one chunk lookup.
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
_READ_ONLY = "hubspoke is read-only"


class HubspokeFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """Read-only fsspec filesystem over a hubspoke hub or spoke's HTTP API."""

    protocol = "hubspoke"
    root_marker = ""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_retries: int = 5,
        max_retry_wait_s: float = 10.0,
        **storage_options: Any,
    ) -> None:
        resolved = endpoint or os.environ.get(ENDPOINT_ENV)
        if not resolved:
            raise ValueError(f"hubspoke needs endpoint= or the {ENDPOINT_ENV} variable")
        super().__init__(**storage_options)
        self.endpoint = resolved
        self.block_size = block_size
        self.client = Client(
            resolved, max_retries=max_retries, max_retry_wait_s=max_retry_wait_s
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the resolved endpoint, so that a copy (a spawned worker) talks to the
        # same server whatever its environment says.
        options = {**self.storage_options, "endpoint": self.endpoint}
        return make_instance, (type(self), self.storage_args, options)

    def close(self) -> None:
        """Close the client's connections (it reconnects if used again)."""
        self.client.close()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """``hubspoke://a/b.bin``, ``/a/b.bin`` and ``a/b.bin/`` → ``a/b.bin``.

        The URL's "host" is the first path segment: object paths are relative.
        """
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text: str = stringify_path(path)
        text = text.removeprefix(f"{cls.protocol}://")
        return text.strip("/")

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """The files and synthesised directories directly under ``path``.

        ``ls`` of a file lists that file; a path that is neither raises
        :class:`FileNotFoundError`.
        """
        path = self._strip_protocol(path)
        prefix = f"{path}/" if path else ""
        entries = self.client.list(prefix)
        if entries:
            children = _children(prefix, entries)
        elif path:
            children = [_file_info(self.client.stat(path))]
        else:
            children = []  # an empty namespace: the root exists but holds nothing
        return children if detail else [c["name"] for c in children]

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Every file under ``path`` (and directory, with ``withdirs``), from one listing
        rather than fsspec's default of one listing per directory."""
        if maxdepth is not None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail)
        path = self._strip_protocol(path)
        prefix = f"{path}/" if path else ""
        found = {e.path: _file_info(e) for e in self.client.list(prefix)}
        if found and withdirs:
            found.update(_directories(path, found))
        elif not found and path:
            try:
                found = {path: _file_info(self.client.stat(path))}
            except ObjectNotFound:
                found = {}
        ordered = dict(sorted(found.items()))
        return ordered if detail else list(ordered)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """``name``, ``size``, ``type`` (file or directory) and, for files, ``etag``, ``mtime``."""
        path = self._strip_protocol(path)
        if not path:
            return _dir_info("")
        try:
            return _file_info(self.client.stat(path))
        except ObjectNotFound:
            if self.client.list(f"{path}/"):
                return _dir_info(path)
            raise FileNotFoundError(path) from None

    def ukey(self, path: str) -> str:
        """The object's ETag: changes exactly when its bytes do."""
        return str(self.info(path)["etag"])

    def modified(self, path: str) -> datetime:
        mtime = self.info(path).get("mtime")
        if mtime is None:
            raise IsADirectoryError(path)
        return datetime.fromtimestamp(mtime, tz=UTC)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes ``[start, end)`` of the object; negative positions count from the end."""
        path = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.client.stat(path).size
            start = None if start is None else max(0, start + size if start < 0 else start)
            end = None if end is None else max(0, end + size if end < 0 else end)
        first = start or 0
        if end is None:
            return self.client.read(path, first, -1)
        return self.client.read(path, first, max(0, end - first)) if end > first else b""

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> HubspokeFile:
        if mode != "rb":
            raise PermissionError(f"{_READ_ONLY}: cannot open {path!r} with mode {mode!r}")
        path = self._strip_protocol(path)
        return HubspokeFile(
            self, path, self.client.stat(path), block_size=block_size or self.block_size,
            cache_options=cache_options, **kwargs,
        )

    # Everything that would change the namespace is refused.

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot create {path!r}")

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot create {path!r}")

    def rmdir(self, path: str) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot remove {path!r}")

    def _rm(self, path: str) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot remove {path!r}")

    def rm_file(self, path: str) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot remove {path!r}")

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot copy to {path2!r}")

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot write {path!r}")

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot write {rpath!r}")

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        raise PermissionError(f"{_READ_ONLY}: cannot write {path!r}")


class HubspokeFile(AbstractBufferedFile):  # type: ignore[misc]
    """A read-only fsspec file pinned to the version it opened.

    Each block is a range request with ``If-Match: <etag>``; if the object has since
    been replaced, reading raises :class:`spoke.client.clients.VersionChanged`.
    """

    def __init__(
        self,
        fs: HubspokeFileSystem,
        path: str,
        stat: ObjectStat,
        block_size: int,
        cache_type: str = "readahead",
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.etag = stat.etag
        super().__init__(
            fs, path, mode="rb", block_size=block_size, cache_type=cache_type,
            cache_options=cache_options, size=stat.size, **kwargs,
        )
        self.details = _file_info(stat)

    def _fetch_range(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        client: Client = self.fs.client
        return client.read(self.path, start, end - start, etag=self.etag)


def _file_info(stat: ObjectStat) -> dict[str, Any]:
    return {
        "name": stat.path, "size": stat.size, "type": "file", "etag": stat.etag,
        "mtime": stat.mtime,
    }


def _dir_info(path: str) -> dict[str, Any]:
    return {"name": path, "size": 0, "type": "directory"}


def _directories(path: str, files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``path`` and every directory between it and ``files`` (all of which lie under it)."""
    dirs = {path: _dir_info(path)} if path else {}
    for name in files:
        parent = name.rpartition("/")[0]
        while len(parent) > len(path) and parent not in dirs:
            dirs[parent] = _dir_info(parent)
            parent = parent.rpartition("/")[0]
    return dirs


def _children(prefix: str, entries: list[ObjectStat]) -> list[dict[str, Any]]:
    """The direct children of ``prefix``: its files, and one entry per subdirectory."""
    files: list[dict[str, Any]] = []
    dirs: dict[str, dict[str, Any]] = {}
    for entry in entries:
        head, sep, _ = entry.path[len(prefix) :].partition("/")
        if sep:
            dirs.setdefault(head, _dir_info(prefix + head))
        else:
            files.append(_file_info(entry))
    return sorted([*files, *dirs.values()], key=lambda info: str(info["name"]))


__all__ = ["ENDPOINT_ENV", "HubspokeFile", "HubspokeFileSystem"]
