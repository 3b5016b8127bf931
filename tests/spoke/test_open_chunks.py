"""OpenChunks: descriptors and read-only maps of chunk files, and the batch body built
from them (spoke.serve.plain.read_cached_body), on a real ChunkStore."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from protocol.digests import digest
from protocol.manifest import Manifest
from protocol.response import plan_response
from spoke.cache.counters import SpokeStats
from spoke.cache.engine import ChunkGone
from spoke.cache.integrity import ChunkChecker, Expected
from spoke.cache.keys import chunk_name, manifest_version
from spoke.cache.open_chunks import OpenChunks
from spoke.cache.store import ChunkStore
from spoke.serve.objects import representation
from spoke.serve.plain import read_cached_body
from spoke.workers.worker import Mirror

CHUNK = 64 << 10
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> ChunkStore:
    return ChunkStore(str(tmp_path / "cache"), direct=False)


def expect(data: bytes) -> Expected:
    return Expected(len(data), "xxh3-128", digest("xxh3-128", data))


def open_chunks(
    store: ChunkStore, chunks: dict[str, Expected], max_open: int = 256
) -> OpenChunks:
    """OpenChunks on ``store`` whose files must hold ``chunks``."""
    return OpenChunks(ChunkChecker(store, chunks.get, SpokeStats()), max_open)


def test_a_view_is_the_chunk_bytes_of_a_map_not_a_copy(store: ChunkStore) -> None:
    data = os.urandom(CHUNK)
    store.write("c1", data)
    chunks = open_chunks(store, {"c1": expect(data)})
    view = chunks.view("c1", 100, 5000)
    assert isinstance(view.obj, mmap.mmap)
    assert bytes(view) == data[100:5000]
    assert chunks.view("c1", 0, CHUNK).obj is view.obj  # one map per open chunk
    assert chunks.pread("c1", 100, 5000) == data[100:5000]


def test_a_view_past_the_end_of_a_torn_file_is_refused_and_forgotten(
    store: ChunkStore,
) -> None:
    store.write("c1", os.urandom(CHUNK // 2))
    chunks = open_chunks(store, {"c1": expect(os.urandom(CHUNK))})
    with pytest.raises(FileNotFoundError):
        chunks.view("c1", 0, CHUNK)
    assert len(chunks) == 0


def test_a_view_outlives_the_discard_and_the_deletion_of_its_chunk(store: ChunkStore) -> None:
    data = os.urandom(CHUNK)
    store.write("c1", data)
    chunks = open_chunks(store, {"c1": expect(data)})
    view = chunks.view("c1", 0, CHUNK)
    chunks.discard("c1")  # purged: as a queued write still holds the view
    store.delete("c1")
    assert bytes(view) == data
    with pytest.raises(FileNotFoundError):
        chunks.view("c1", 0, CHUNK)


def test_an_evicted_chunk_closes_its_descriptor_and_keeps_its_views(
    store: ChunkStore,
) -> None:
    data = [os.urandom(CHUNK) for _ in range(3)]
    for i, chunk in enumerate(data):
        store.write(f"c{i}", chunk)
    chunks = open_chunks(store, {f"c{i}": expect(chunk) for i, chunk in enumerate(data)},
                         max_open=2)
    first_fd = chunks.fd("c0", CHUNK)
    first_file = os.readlink(f"/proc/self/fd/{first_fd}")
    views = [chunks.view(f"c{i}", 0, 10) for i in range(3)]
    assert len(chunks) == 2
    # c0 was the least recently used: its descriptor is closed (the number may have
    # been given to another file since, such as a map's own duplicate).
    assert _file_of(first_fd) != first_file
    assert [bytes(v) for v in views] == [chunk[:10] for chunk in data]


def _file_of(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def test_sending_a_view_of_a_file_that_shrank_fails_the_write_not_the_process(
    tmp_path: Path,
) -> None:
    # Why views only go to plain sockets: the kernel reading a page past the new end
    # of file fails the send (EFAULT); Python reading it would die of SIGBUS.
    script = textwrap.dedent(f"""
        import errno, os, socket, sys
        sys.path.insert(0, {str(REPO)!r})
        from protocol.digests import digest
        from spoke.cache.open_chunks import OpenChunks
        from spoke.cache.integrity import ChunkChecker, Expected
        from spoke.cache.counters import SpokeStats
        from spoke.cache.store import ChunkStore
        store = ChunkStore({str(tmp_path / "cache")!r}, direct=False)
        data = os.urandom(1 << 20)
        store.write("chunk", data)
        known = {{"chunk": Expected(len(data), "xxh3-128", digest("xxh3-128", data))}}
        chunks = OpenChunks(ChunkChecker(store, known.get, SpokeStats()))
        view = chunks.view("chunk", 512 << 10, (512 << 10) + 65536)
        os.truncate(store.path_of("chunk"), 4096)
        a, b = socket.socketpair()
        a.setblocking(False)
        try:
            a.send(view)
        except OSError as exc:
            print("send failed", errno.errorcode[exc.errno])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "send failed EFAULT"


def _manifest(size: int) -> Manifest:
    return Manifest(path="d/obj", size=size, etag='"v1"', chunk_size=CHUNK,
                    digest_alg="xxh3-128", digests=tuple(b"\0" * 16 for _ in range(
                        -(-size // CHUNK))), mtime=0.0)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_batch_body_is_views_of_the_chunk_files_only_when_zero_copy(
    store: ChunkStore, zero_copy: bool
) -> None:
    manifest = _manifest(3 * CHUNK)
    data = os.urandom(3 * CHUNK)
    mirror = Mirror(store)
    for index in range(3):
        name = chunk_name(manifest_version(manifest), index)
        store.write(name, data[index * CHUNK:(index + 1) * CHUNK])
        mirror.names[name] = expect(data[index * CHUNK:(index + 1) * CHUNK])
    ranges = [(10, 99), (CHUNK - 5, CHUNK + 4), (2 * CHUNK + 7, 2 * CHUNK + 7)]
    header = "bytes=" + ",".join(f"{a}-{b}" for a, b in ranges)
    plan = plan_response("GET", {"Range": header}, representation(manifest, "d/obj"), "B", 0)
    read = read_cached_body(mirror, manifest, plan, zero_copy=zero_copy)
    assert read is not None
    plan, body = read  # reframed if the data holds "--B"
    expected = b"".join(p if isinstance(p, bytes) else data[p.start:p.stop] for p in plan.body)
    assert b"".join(bytes(p) for p in body) == expected
    separators = [p for p in plan.body if isinstance(p, bytes)]
    pieces = [p for p in body if not any(p is s for s in separators)]
    assert len(pieces) == 4  # one per chunk slice: the middle range spans two chunks
    assert all(isinstance(p, memoryview) for p in pieces) is zero_copy
    assert sum(mirror.hits.values()) == 4


def test_a_batch_of_a_chunk_gone_from_disk_is_chunk_gone(store: ChunkStore) -> None:
    manifest = _manifest(CHUNK)
    mirror = Mirror(store)
    # Told, but no file.
    mirror.names[chunk_name(manifest_version(manifest), 0)] = expect(bytes(CHUNK))
    plan = plan_response("GET", {"Range": "bytes=0-9,20-29"},
                         representation(manifest, "d/obj"), "B", 0)
    with pytest.raises(ChunkGone):
        read_cached_body(mirror, manifest, plan, zero_copy=True)
    assert not mirror.names
