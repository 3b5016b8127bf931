"""Chunk files checked before they are served: the right kind of file, the right bytes.

Anything can happen to a file on the spoke's disk after it was verified and stored:
bit rot, a tool or a person copying another chunk's file over it, two files swapped,
the file turned into a symlink (to ``/etc/passwd``), or cut short. So a process
serves a chunk's file only once it has checked it itself:

- opened with ``O_NOFOLLOW`` (a symlink is refused, not followed) and ``O_NONBLOCK``
  (a FIFO put in its place cannot hang the event loop), then, on the descriptor, a
  regular file owned by this user, of the chunk's size;
- its digest (the manifest's, kept with the chunk) checked over the whole file, the
  first time this process serves it, and again whenever the file's identity (inode,
  size, modification and change times) differs from the one last verified. The
  change time moves with any write, chown or chmod, and cannot be set back the way
  ``utime`` sets the modification time back.

The verified identity is remembered per chunk, so the warm path pays one ``fstat``
per read and a chunk's hash once per process, not per read. A change that keeps
the identity (a rewrite within one tick of the filesystem's clock, or with the
system clock set back) is not seen here; the background scrub (:mod:`spoke.cache.scrub`)
re-hashes every chunk over time for that.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from protocol.digests import digest
from spoke.cache.store import BadChunkFile, ChunkStore

if TYPE_CHECKING:
    from spoke.cache.counters import SpokeStats

# Verified identities remembered per process: each costs ~200 bytes; a chunk that
# fell out is hashed again at its next open.
MAX_REMEMBERED = 1 << 20

Identity = tuple[int, int, int, int]  # st_ino, st_size, st_mtime_ns, st_ctime_ns


class Expected(NamedTuple):
    """What a chunk's file must hold: its size and digest (from its manifest)."""

    size: int
    digest_alg: str
    digest: bytes


def identity_of(st: os.stat_result) -> Identity:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def shape_fault(st: os.stat_result, expected: Expected) -> str | None:
    """Why an open chunk file cannot be the chunk, by its ``fstat`` alone, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not-regular"
    if st.st_uid != os.geteuid():
        return "owner"
    if st.st_size != expected.size:
        return "size"
    return None


def content_fault(fd: int, expected: Expected) -> str | None:
    """Why the bytes of open chunk file ``fd`` are not the chunk's, or None. Read, not
    mapped: a file cut short while it is hashed then reads short instead of killing
    the process (SIGBUS)."""
    data = os.pread(fd, expected.size, 0)
    if len(data) != expected.size:
        return "size"
    if digest(expected.digest_alg, data) != expected.digest:
        return "digest"
    return None


class ChunkChecker:
    """Opens chunk files for serving, checked and verified (see the module doc).

    ``expected(name)`` tells what a resident chunk must hold (None: not resident,
    then :meth:`open` raises ``FileNotFoundError``); hashes are counted in
    ``stats`` (``chunks_verified``, ``bytes_verified``). Failures raise
    :class:`~spoke.cache.store.BadChunkFile`, a ``FileNotFoundError``: every read path
    that copes with a vanished file (by fetching it again) copes with a bad one.
    For one thread (the event loop's).
    """

    def __init__(
        self, store: ChunkStore, expected: Callable[[str], Expected | None], stats: SpokeStats
    ) -> None:
        self.store = store
        self.expected = expected
        self.stats = stats
        self._verified: dict[str, Identity] = {}

    def open(self, name: str) -> tuple[int, Identity]:
        """A descriptor on chunk ``name``'s file, checked, and its verified identity."""
        fd = self.store.open(name)
        try:
            return fd, self.check(name, fd, os.fstat(fd), force=False)
        except BaseException:
            os.close(fd)
            raise

    def recheck(self, name: str, fd: int, known: Identity) -> Identity:
        """The identity of open chunk file ``fd``, checked again if it is not ``known``."""
        st = os.fstat(fd)
        if identity_of(st) == known:
            return known
        return self.check(name, fd, st, force=False)

    def check(self, name: str, fd: int, st: os.stat_result, *, force: bool) -> Identity:
        """Check chunk ``name``'s open file ``fd`` (``st``: its ``fstat``); hashed unless
        its identity was verified already (``force``: hashed anyway)."""
        expected = self.expected(name)
        if expected is None:
            raise FileNotFoundError(f"chunk {name} is not resident")
        fault = shape_fault(st, expected)
        identity = identity_of(st)
        if fault is None and (force or self._verified.get(name) != identity):
            fault = content_fault(fd, expected)
            self.stats.chunks_verified += 1
            self.stats.bytes_verified += expected.size
            if fault is None:
                self.remember(name, identity)
        if fault is not None:
            self.forget(name)
            raise BadChunkFile(name, fault)
        return identity

    def remember(self, name: str, identity: Identity) -> None:
        """``identity`` of chunk ``name``'s file holds verified bytes (just written)."""
        verified = self._verified
        verified.pop(name, None)
        if len(verified) >= MAX_REMEMBERED:
            del verified[next(iter(verified))]  # the longest remembered
        verified[name] = identity

    def forget(self, name: str) -> None:
        self._verified.pop(name, None)


def verify_stored(store: ChunkStore, name: str, expected: Expected) -> None:
    """Check chunk ``name``'s file in full, whatever was verified before (the scrub's
    check): ``FileNotFoundError`` if it is gone, :class:`BadChunkFile` if it is bad."""
    fd = store.open(name)
    try:
        fault = shape_fault(os.fstat(fd), expected) or content_fault(fd, expected)
    finally:
        os.close(fd)
    if fault is not None:
        raise BadChunkFile(name, fault)
