"""ChunkStore writes: O_DIRECT where the filesystem takes it, buffered where not,
always atomic (no published name without all its bytes, nothing left in tmp/)."""

from __future__ import annotations

import errno
import fcntl
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from spoke.cache.flight import Filling
from spoke.cache.store import ChunkStore

SIZES = [0, 1, 4095, 4096, 4097, (4 << 20) + 123]


def _payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _filesystem_takes_o_direct(directory: Path) -> bool:
    probe = directory / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    probe.unlink()
    return True


def _check_stored(store: ChunkStore, name: str, data: bytes) -> None:
    assert store.read(name) == data
    assert os.path.getsize(store.path_of(name)) == len(data)
    assert store.temp_files() == 0


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("direct", [True, False])
def test_a_chunk_reads_back_whole_and_exact(tmp_path: Path, size: int, direct: bool) -> None:
    store = ChunkStore(str(tmp_path / "cache"), direct=direct)
    data = _payload(size, seed=size)
    store.write(f"ab{size:06d}", memoryview(bytearray(data)))
    _check_stored(store, f"ab{size:06d}", data)


def test_direct_io_is_used_where_the_filesystem_takes_it(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "cache"))
    store.write("cd0001", _payload(5000))
    assert store.direct == _filesystem_takes_o_direct(tmp_path)
    _check_stored(store, "cd0001", _payload(5000))


def test_a_filesystem_refusing_o_direct_at_open_gets_buffered_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            # As Linux does (tmpfs before 6.6): the file is created, then refused.
            os.close(real_open(path, flags & ~os.O_DIRECT, *args))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    store = ChunkStore(str(tmp_path / "cache"))
    for i, size in enumerate(SIZES):
        store.write(f"ef{i:04d}", _payload(size, seed=i))
        assert not store.direct
    for i, size in enumerate(SIZES):
        _check_stored(store, f"ef{i:04d}", _payload(size, seed=i))


def test_a_filesystem_refusing_direct_writes_gets_them_again_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _filesystem_takes_o_direct(tmp_path):
        pytest.fail(f"{tmp_path} refuses O_DIRECT: this test needs a filesystem that takes it")
    real_write = os.write
    refused = []

    def refuse_direct(fd: int, data: Any) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", refuse_direct)
    store = ChunkStore(str(tmp_path / "cache"))
    data = _payload((1 << 20) + 7)
    store.write("gh0001", data)
    assert refused and not store.direct
    _check_stored(store, "gh0001", data)


def test_a_failed_write_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    store = ChunkStore(str(tmp_path / "cache"))
    with pytest.raises(OSError, match="Input/output"):
        store.write("ij0001", _payload(10_000))
    assert not os.path.exists(store.path_of("ij0001"))
    assert store.temp_files() == 0


@pytest.mark.parametrize("refusing", ["makedirs", "rename"])
def test_a_full_disk_refusing_the_chunks_directory_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusing: str
) -> None:
    """The bytes are written, but the disk has no block for a new bucket directory
    (or the rename): the temp file goes too, as when the bytes themselves fail."""

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    store = ChunkStore(str(tmp_path / "cache"))
    monkeypatch.setattr(os, refusing, full)
    with pytest.raises(OSError, match="No space"):
        store.write("kl0001", _payload(10_000))
    monkeypatch.undo()
    assert not os.path.exists(store.path_of("kl0001"))
    assert store.temp_files() == 0


def test_concurrent_writes_keep_their_bytes_apart_and_few_buffers(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "cache"))
    sizes = [(1 << 20) + i * 4099 for i in range(24)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: store.write(f"kl{i:04d}", _payload(sizes[i], seed=i)),
                      range(len(sizes))))
    for i, size in enumerate(sizes):
        _check_stored(store, f"kl{i:04d}", _payload(size, seed=i))
    assert len(store._aligned._idle) <= 4


@pytest.mark.parametrize("size", [4096, 4 << 20])
def test_a_fills_page_aligned_bytes_are_written_without_a_copy(
    tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ChunkStore(str(tmp_path / "cache"))  # buffered where O_DIRECT is refused: no copy
    fill = Filling(size)
    data = _payload(size, seed=3)
    fill.feed(data)

    def no_copy(length: int) -> Any:
        raise AssertionError("copied into an aligned buffer")

    monkeypatch.setattr(store._aligned, "take", no_copy)
    store.write("ef0001", fill.view)
    _check_stored(store, "ef0001", data)


def test_unaligned_or_odd_sized_bytes_still_go_through_an_aligned_copy(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "cache"))
    fill = Filling(4097)
    fill.feed(_payload(4097, seed=4))
    unaligned = memoryview(bytearray(8192 + 1))[1:]
    for name, data in (("ef0002", fill.view), ("ef0003", unaligned)):
        store.write(name, data)
        _check_stored(store, name, bytes(data))


def test_a_directory_in_a_chunks_place_is_cleared_so_the_chunk_can_be_stored(
    tmp_path: Path,
) -> None:
    store = ChunkStore(str(tmp_path / "cache"))
    obstacle = store.path_of("c0")
    os.makedirs(os.path.join(obstacle, "inner"))
    store.write("c0", b"chunk bytes")
    with open(obstacle, "rb") as f:
        assert f.read() == b"chunk bytes"


def test_a_bucket_directory_is_made_once_and_again_if_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk of a bucket makes its directory; later ones ask nothing of it
    (no mkdir or stat per chunk); a bucket removed from under the store is made again."""
    store = ChunkStore(str(tmp_path / "cache"))
    made: list[str] = []
    real_makedirs = os.makedirs

    def counting_makedirs(path: str, *args: Any, **kwargs: Any) -> None:
        made.append(path)
        real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", counting_makedirs)
    for i in range(3):
        store.write(f"ab{i:04d}", _payload(5000, seed=i))
    assert made == [os.path.dirname(store.path_of("ab0000"))]
    for entry in os.scandir(made[0]):
        os.unlink(entry.path)
    os.rmdir(made[0])
    store.write("ab0009", _payload(5000, seed=9))
    assert len(made) == 2
    _check_stored(store, "ab0009", _payload(5000, seed=9))
    assert store.temp_files() == 0


def test_temp_names_never_clash_across_threads_and_stores(tmp_path: Path) -> None:
    """Two stores on one directory (a restarted owner, a second process) and many
    threads each: every write lands, none refused by another's temp file."""
    stores = [ChunkStore(str(tmp_path / "cache")) for _ in range(2)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: stores[i % 2].write(f"cd{i:04d}", _payload(3000, seed=i)),
                      range(64)))
    for i in range(64):
        _check_stored(stores[0], f"cd{i:04d}", _payload(3000, seed=i))
    assert stores[0].temp_files() == 0
