"""Where the hub's objects live. The handlers only see :class:`Backend`.

The filesystem backend is the embedded default; an object-store backend only has
to implement the same four methods. All methods are blocking and are called from
a thread executor.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import ProtocolError, no_object
from protocol.media import content_type_for
from protocol.paths import validate_path, validate_prefix


class NoSuchObject(ProtocolError):
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

    def list(self, prefix: str) -> Iterable[ObjectInfo]:
        """A list when it is cheap to build whole; an iterator (consumed in executor
        threads, batch by batch) when it comes page by page."""
        ...

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


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW


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
    """Objects are the regular files under ``root``, each named by its own path only.

    No symlink below the root is followed, in any segment: a token's prefix is checked
    against the name a client asks for, so a link would let that name serve another
    prefix's bytes (``b/link -> ../a/x``). Without links the requested name is the
    file's own, and the check on the name is the check on the bytes, for every token,
    on the hub and on any spoke in front of it. The root itself may be a link: it is
    resolved once, at start, by the operator's choice rather than a tenant's.
    """

    # Opening (a walk of the path's directories, open, fstat) and closing a local file
    # are metadata calls the kernel answers from its caches in microseconds: cheaper on
    # the event loop than the two thread hops per request they would otherwise cost.
    opens_quickly = True

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def stat(self, path: str) -> ObjectInfo:
        parent, name = self._parent(validate_path(path))
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:  # missing, a name too long: no object either way
            raise NoSuchObject(no_object(path)) from None
        finally:
            os.close(parent)
        return self._info(path, st)  # a symlink is not a regular file: no object

    def open(self, path: str) -> OpenObject:
        return self.open_valid(validate_path(path))

    def open_valid(self, path: str) -> _OpenFile:
        """:meth:`open` for a ``path`` already through :func:`validate_path` (the fast
        path validates each request target once, not on every request)."""
        parent, name = self._parent(path)
        try:
            # O_NOFOLLOW: a link is not an object. O_NONBLOCK: opening a FIFO would
            # otherwise block until a writer appears.
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        except OSError:  # missing, a directory, a symlink: no object either way
            raise NoSuchObject(no_object(path)) from None
        finally:
            os.close(parent)
        try:
            # fstat on the open fd: the etag describes exactly the bytes we will read.
            return _OpenFile(fd, self._info(path, os.fstat(fd)))
        except BaseException:
            os.close(fd)
            raise

    def _parent(self, path: str) -> tuple[int, str]:
        """An open descriptor of valid ``path``'s directory, reached without following
        any link (:meth:`_directory`), and the last segment; the caller closes it."""
        *directories, name = path.split("/")
        try:
            return self._directory(directories), name
        except OSError:  # missing, not a directory, a symlink: no object below it
            raise NoSuchObject(f"no object {path!r}") from None

    def _directory(self, segments: list[str]) -> int:
        """An open descriptor of the directory ``segments`` below the root.

        Each segment is opened ``O_NOFOLLOW`` inside the one before: no moment passes
        between a check and the open in which a directory could be swapped for a link.
        """
        fd = os.open(self.root, _DIRECTORY_FLAGS)
        try:
            for segment in segments:
                child = os.open(segment, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def still_current(self, info: ObjectInfo) -> bool:
        try:
            return self.stat(info.path).etag == info.etag
        except ProtocolError:
            return False

    def list(self, prefix: str) -> list[ObjectInfo]:
        validate_prefix(prefix)
        directory, _, _ = prefix.rpartition("/")
        segments = directory.split("/") if directory else []
        try:
            top = self._directory(segments)
        except OSError:  # missing, not a directory, a symlink: nothing listed below it
            return []
        found: list[ObjectInfo] = []
        try:
            # fwalk without following links, from a descriptor reached without them:
            # a linked directory is neither the top nor entered.
            for dirpath, _, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                base = os.path.normpath(os.path.join(directory, dirpath))
                for name in filenames:
                    info = self._listed(dirfd, base, name)
                    if info is not None and info.path.startswith(prefix):
                        found.append(info)
        finally:
            os.close(top)
        found.sort(key=lambda i: i.path)
        return found

    def _listed(self, dirfd: int, base: str, name: str) -> ObjectInfo | None:
        path = name if base == "." else f"{base}/{name}"
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            return self._info(validate_path(path), st)
        except (ProtocolError, OSError):
            return None  # unsafe names and symlinks are not objects

    @staticmethod
    def _info(path: str, st: os.stat_result) -> ObjectInfo:
        if not stat.S_ISREG(st.st_mode):
            raise NoSuchObject(no_object(path))
        return ObjectInfo(path, st.st_size, etag_for(st), st.st_mtime_ns)
