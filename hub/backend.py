"""Where the hub's objects live. The handlers only see :class:`Backend`.

The filesystem backend is the embedded default; an object-store backend only has
to implement the same four methods. All methods are blocking and are called from
a thread executor.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import BadPath, ProtocolError, no_object
from protocol.media import content_type_for
from protocol.paths import validate_path, validate_prefix


class ObjectNotFound(ProtocolError):
    status_hint = 404
    title = "Not Found"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One version of one object."""

    path: str
    size: int
    etag: str
    # st_mtime_ns: the float st_mtime can round up into the next second.
    mtime_ns: int

    @property
    def content_type(self) -> str:
        return content_type_for(self.path)


class OpenObject(Protocol):
    """An opened object version: reads always return bytes of ``info``'s version."""

    info: ObjectInfo

    def read(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


class Backend(Protocol):
    def stat(self, path: str) -> ObjectInfo: ...

    def open(self, path: str) -> OpenObject: ...

    def list(self, prefix: str) -> list[ObjectInfo]: ...

    def still_current(self, info: ObjectInfo) -> bool: ...


def etag_for(st: os.stat_result) -> str:
    """A strong ETag that changes whenever the file's content can have changed.

    Size and mtime alone miss a same-size rewrite within the mtime resolution or a
    file replaced by rename; inode and ctime catch those (ctime cannot be set back
    by ``touch``). A spurious change only costs a re-fetch, a missed one would
    serve mixed versions, so err towards changing.
    """
    ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return '"' + hashlib.blake2b(ident.encode(), digest_size=12).hexdigest() + '"'


class _OpenFile:
    def __init__(self, fd: int, info: ObjectInfo) -> None:
        self._fd = fd
        self.info = info

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def fileno(self) -> int:
        """The open file, for ``os.sendfile`` (a backend object without it is read)."""
        return self._fd

    def close(self) -> None:
        os.close(self._fd)


class FilesystemBackend:
    """Objects are the regular files under ``root``; symlinks may not leave it."""

    # Opening (realpath, open, fstat) and closing a local file are metadata calls
    # the kernel answers from its caches in microseconds: cheaper on the event loop
    # than the two thread hops per request they would otherwise cost.
    opens_quickly = True

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def resolve(self, path: str) -> str:
        """The real file path of object ``path``, guaranteed inside the root."""
        validate_path(path)
        real = os.path.realpath(os.path.join(self.root, path))
        if os.path.commonpath([self.root, real]) != self.root or real == self.root:
            raise BadPath("object path resolves outside the hub's root")
        return real

    def stat(self, path: str) -> ObjectInfo:
        real = self.resolve(path)
        try:
            st = os.stat(real)
        except OSError:  # missing, a symlink loop, a name too long: no object either way
            raise ObjectNotFound(no_object(path)) from None
        return self._info(path, st)

    def open(self, path: str) -> OpenObject:
        real = self.resolve(path)
        try:
            # O_NONBLOCK: opening a FIFO would otherwise block until a writer appears.
            fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:  # missing, a directory, a symlink loop: no object either way
            raise ObjectNotFound(no_object(path)) from None
        try:
            # fstat on the open fd: the etag describes exactly the bytes we will read.
            return _OpenFile(fd, self._info(path, os.fstat(fd)))
        except BaseException:
            os.close(fd)
            raise

    def still_current(self, info: ObjectInfo) -> bool:
        try:
            return self.stat(info.path).etag == info.etag
        except ProtocolError:
            return False

    def list(self, prefix: str) -> list[ObjectInfo]:
        validate_prefix(prefix)
        directory, _, _ = prefix.rpartition("/")
        start = os.path.join(self.root, directory) if directory else self.root
        real_start = os.path.realpath(start)
        # os.walk(followlinks=False) still follows a symlink given as its top: refuse
        # to walk anything outside the root.
        if os.path.commonpath([self.root, real_start]) != self.root:
            return []
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                info = self._listed(dirpath, name)
                if info is not None and info.path.startswith(prefix):
                    found.append(info)
        found.sort(key=lambda i: i.path)
        return found

    def _listed(self, dirpath: str, name: str) -> ObjectInfo | None:
        rel = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
        try:
            return self.stat(rel)
        except (ProtocolError, OSError):
            return None  # unsafe names, dangling, looping or escaping symlinks are not objects

    @staticmethod
    def _info(path: str, st: os.stat_result) -> ObjectInfo:
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(no_object(path))
        return ObjectInfo(path, st.st_size, etag_for(st), st.st_mtime_ns)
