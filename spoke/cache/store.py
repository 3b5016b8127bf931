"""ChunkStore: chunk bytes on local disk, and nothing else.

One file per chunk, ``chunks/<2 hex>/<name>``. Chunks are 4 MiB by default, so
even a 10 TB cache holds a few million files, which any modern filesystem
handles; in exchange deletion is an unlink (no slab compaction), a chunk's bytes
are served with a plain ``pread``/``sendfile`` on its own fd, and several worker
processes can share the directory without a shared allocator.

Publication is atomic: bytes go to ``tmp/``, are fsynced, then renamed into
place. A crash at any moment leaves either no file or a complete, verified one;
leftover temp files are removed at start-up. All methods block: call them from
an executor.

Chunk bytes are written with ``O_DIRECT`` where the filesystem allows it, then
read back into the page cache by the disk (``POSIX_FADV_WILLNEED``), so warm
reads still find them there. A buffered write makes the CPU copy every byte into
newly allocated page-cache pages, and on a VM whose free memory goes back to the
host each new page also costs a host fault: that copy was most of the spoke's
CPU in cold reads. Without the read-back, a training job's first epoch would read
the just-stored chunks from disk on the event loop. (Side-by-side figures:
docs/bench-history.md, runs 1-2.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import mmap
import os
import secrets
import shutil
import threading

from service.buffers import address_of

_TMP = "tmp"
_CHUNKS = "chunks"
# O_DIRECT wants the buffer's address, the file offset and the length aligned to
# the device's logical block; a page covers every block size in use.
DIRECT_ALIGN = mmap.PAGESIZE
# Buffered writes (when O_DIRECT is refused) go this much per system call. Large
# writes make the kernel (6.x, ext4 with large folios) fill the page cache with
# large folios, each costing host faults on such a VM. 1 GiB of new chunks into
# fresh memory (separate processes, 8 s apart, three runs each): 4 MiB writes
# 2.6 s of CPU, 1 MiB 0.87-0.90 s, 512/256/128/64 KiB 0.23-0.31 s.
WRITE_PIECE_BYTES = 256 << 10


class _AlignedBuffers:
    """Page-aligned buffers for O_DIRECT writes, kept for reuse up to ``keep``.

    ``mmap`` memory is page-aligned, as O_DIRECT needs; a chunk whose bytes are not
    (not from a fill, or an odd-sized last chunk) is copied
    in (a memcpy, far cheaper than the page-cache copy it replaces). Writes run on
    executor threads, so buffers are taken and given back under a lock; beyond
    ``keep`` idle ones they are unmapped, which bounds the memory whatever the
    number of threads.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, length: int) -> mmap.mmap:
        with self._lock:
            while self._idle:
                buffer = self._idle.pop()
                if len(buffer) >= length:
                    return buffer
                buffer.close()
        return mmap.mmap(-1, length)

    def give(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(buffer)
                return
        buffer.close()


# Why a chunk file was refused (spoke.cache.integrity), as /metrics counts them.
CORRUPT_CAUSES = ("digest", "not-regular", "size", "owner")


class BadChunkFile(FileNotFoundError):
    """A chunk's file that is not its bytes (:mod:`spoke.cache.integrity`): not a regular
    file, not ours, of another size, or failing its digest (``cause``). A
    ``FileNotFoundError``, so that whatever copes with a vanished chunk (fetching it
    again) copes with a bad one."""

    def __init__(self, name: str, cause: str) -> None:
        super().__init__(f"chunk {name} is corrupt on disk ({cause})")
        self.name, self.cause = name, cause


class ChunkStore:
    def __init__(self, cache_dir: str, *, direct: bool = True) -> None:
        self.root = os.path.abspath(cache_dir)
        self._tmp = os.path.join(self.root, _TMP)
        self._chunks = os.path.join(self.root, _CHUNKS)
        os.makedirs(self._tmp, exist_ok=True)
        os.makedirs(self._chunks, exist_ok=True)
        # Cleared for good the first time the filesystem refuses O_DIRECT (tmpfs
        # before Linux 6.6, some FUSE and network filesystems).
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._aligned = _AlignedBuffers(keep=4)
        # Temp names: unique to this store object (O_EXCL refuses a clash anyway), with
        # no random draw, a system call each, per chunk; the pid says whose they are.
        self._writer_tag = f"{os.getpid()}.{secrets.token_hex(4)}"
        self._serials = itertools.count()

    def path_of(self, name: str) -> str:
        return os.path.join(self._chunks, name[:2], name)

    def write(self, name: str, data: bytes | bytearray | memoryview) -> os.stat_result:
        """Store ``data`` as chunk ``name``, atomically (temp file, fsync, rename); the
        published file's ``stat`` (its identity: :func:`spoke.cache.integrity.identity_of`)."""
        tmp = os.path.join(self._tmp, f"{name}.{self._writer_tag}.{next(self._serials)}")
        fd = self._create(tmp)
        try:
            if self.direct:
                self._write_direct(fd, memoryview(data))
            else:
                _write_buffered(fd, memoryview(data))
            # Without fsync a power cut could publish the name before the bytes.
            os.fsync(fd)
            if self.direct:  # the disk reads it back into the page cache, no CPU copy
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        final = self.path_of(name)
        try:
            try:
                os.rename(tmp, final)
            except FileNotFoundError:
                # Its bucket directory is not there yet (or was removed): made on the
                # first chunk that needs it, not asked after on every one. A new one
                # takes a block of its own: a full disk can refuse it.
                os.makedirs(os.path.dirname(final), exist_ok=True)
                _rename_over_stray_dir(tmp, final)
            except IsADirectoryError:
                _rename_over_stray_dir(tmp, final)
        except BaseException:
            os.unlink(tmp)
            raise
        return os.stat(final, follow_symlinks=False)  # after the rename: it sets the ctime

    def _create(self, tmp: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        if self.direct:
            try:
                return os.open(tmp, flags | os.O_DIRECT, 0o600)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False
                # Linux creates the file before it checks O_DIRECT: gone, or O_EXCL fails.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return os.open(tmp, flags, 0o600)

    def _write_direct(self, fd: int, data: memoryview) -> None:
        """All of ``data``, padded to the block, then cut: as it is when it starts on a
        page and fills whole blocks (a fill's bytes, :func:`spoke.cache.flight.page_aligned`),
        else through an aligned copy.

        A filesystem that took ``O_DIRECT`` at open but refuses the write (a block
        larger than a page) gets this write, and every later one, buffered.
        """
        length = len(data)
        padded = -(-length // DIRECT_ALIGN) * DIRECT_ALIGN
        try:
            if padded == length and _page_aligned(data):
                _write_all(fd, data)
            else:
                self._write_aligned_copy(fd, data, padded)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.direct = False
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            _write_buffered(fd, data)
            return
        if padded != length:
            os.ftruncate(fd, length)

    def _write_aligned_copy(self, fd: int, data: memoryview, padded: int) -> None:
        buffer = self._aligned.take(max(padded, DIRECT_ALIGN))
        try:
            buffer[: len(data)] = data
            buffer[len(data) : padded] = bytes(padded - len(data))
            with memoryview(buffer) as whole:
                _write_all(fd, whole[:padded])
        finally:
            self._aligned.give(buffer)

    def open(self, name: str) -> int:
        """An fd reading chunk ``name``; ``FileNotFoundError`` when it is not stored,
        :class:`BadChunkFile` when a symlink stands in its place (never followed).
        Non-blocking, so that a FIFO there cannot hang the caller; a regular file
        reads the same. What the fd is, is :mod:`spoke.cache.integrity`'s to check."""
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            return os.open(self.path_of(name), flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BadChunkFile(name, "not-regular") from None
            raise

    def read(self, name: str, start: int = 0, stop: int | None = None) -> bytes:
        fd = self.open(name)
        try:
            if stop is None:
                stop = os.fstat(fd).st_size
            return os.pread(fd, stop - start, start)
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        # A directory put in a chunk's place is left (it is never read as a chunk).
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(self.path_of(name))

    def scan(self) -> tuple[set[str], list[str]]:
        """The stored chunk names, and the paths of stray files that are not chunks.

        Names only, no stat per file: a published chunk is complete by construction
        (atomic rename), so start-up only needs to know which exist. Anything not
        where :meth:`path_of` would put it is stray.
        """
        found: set[str] = set()
        stray: list[str] = []
        with os.scandir(self._chunks) as buckets:
            for bucket in buckets:
                if not bucket.is_dir(follow_symlinks=False):
                    stray.append(bucket.path)
                    continue
                for name in os.listdir(bucket.path):
                    if name[:2] == bucket.name:
                        found.add(name)
                    else:
                        stray.append(os.path.join(bucket.path, name))
        return found, stray

    def delete_stray(self, path: str) -> None:
        """Remove a stray file found by :meth:`scan` (only below the chunk directory)."""
        if os.path.commonpath([self._chunks, os.path.abspath(path)]) != self._chunks:
            raise ValueError(f"{path} is not inside {self._chunks}")
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)

    def remove_temp_files(self) -> int:
        """Delete half-written chunks left by a crash; returns how many."""
        removed = 0
        with os.scandir(self._tmp) as entries:
            for e in entries:
                os.unlink(e.path)
                removed += 1
        return removed

    def temp_files(self) -> int:
        return sum(1 for _ in os.scandir(self._tmp))


def _rename_over_stray_dir(tmp: str, final: str) -> None:
    try:
        os.rename(tmp, final)
    except IsADirectoryError:
        # Something not ours took the chunk's name (the cache directory is the
        # spoke's alone): cleared, or the chunk could never be stored again.
        shutil.rmtree(final)
        os.rename(tmp, final)


def _write_buffered(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data[:WRITE_PIECE_BYTES]):]


def _write_all(fd: int, data: memoryview) -> None:
    done, length = 0, len(data)
    while done < length:
        done += os.write(fd, data[done:])


def _page_aligned(data: memoryview) -> bool:
    """Whether ``data`` starts on a page boundary (only a writable buffer can tell)."""
    try:
        return address_of(data) % DIRECT_ALIGN == 0
    except (TypeError, ValueError):  # read-only, or empty
        return False
