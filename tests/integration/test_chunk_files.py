"""Chunk files changed on the spoke's disk are never served: the bad one is dropped and
the read fetches it again, with ``--workers 1`` and with a reader worker.

Each case reads an object as hits first (so every serving process has the chunk
files open, and mapped for batches), changes a chunk file under it, then reads it
again: single ranges and batches (multipart/byteranges) must give the object's
bytes. Then a restarted spoke, whose processes open every file afresh, must too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from loadtest.procs import Process, start_process
from protocol.digests import digest
from tests.conftest import CHUNK
from tests.integration.test_http_ranges import parse_byteranges
from tests.support.http import blocking_stats
from tests.support.raw_http import exchange, request
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]
OBJECT = "ds/big.bin"  # 40 chunks + 7 bytes
CONNECTIONS = 24  # over two processes, all on one by chance: 2 ** -23
# Reads of chunk 2 past where a shrunk file ends (CUT), and of chunk 3.
CUT = CHUNK // 4
BATCH = [(10, 99), (2 * CHUNK - 5, 2 * CHUNK + 4), (2 * CHUNK + 3 * CUT, 2 * CHUNK + 3 * CUT + 999),
         (3 * CHUNK + 7, 3 * CHUNK + 700)]
SINGLE = (2 * CHUNK + 2 * CUT, 2 * CHUNK + 2 * CUT + 99)
WAIT_S = 20.0


class Spoke:
    """A spoke process (``--workers N``) on one cache directory, restartable."""

    def __init__(self, hub_url: str, cache_dir: Path, workers: int) -> None:
        self.args = ["--hub", hub_url, "--cache-dir", str(cache_dir), "--capacity", "64MiB",
                     "--workers", str(workers), "--scrub-rate", "0", "--access-log", "off",
                     "--log-level", "error"]
        self.cache_dir = cache_dir
        self.process: Process | None = None

    async def start(self) -> Process:
        self.process = await asyncio.to_thread(start_process, "spoke", self.args)
        return self.process

    async def stop(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)
            self.process = None


@pytest.fixture(params=[1, 2], ids=["workers1", "workers2"])
async def spoke(request: pytest.FixtureRequest, hub: RunningServer,
                tmp_path: Path) -> AsyncIterator[Spoke]:
    spoke = Spoke(hub.url, tmp_path / "spoke-cache", request.param)
    await spoke.start()
    yield spoke
    await spoke.stop()


def get(range_header: str | None = None) -> bytes:
    fields = [] if range_header is None else [f"Range: {range_header}"]
    return request(f"/objects/{OBJECT}", *fields)


async def read_batch(process: Process, data: bytes) -> list[str]:
    """A batch read of BATCH, checked byte for byte; its X-Cache."""
    [(status, fields, body)] = await exchange(
        process.url, get("bytes=" + ",".join(f"{a}-{b}" for a, b in BATCH)))
    assert status == 206
    parts = parse_byteranges(fields["content-type"], body)
    assert [part for _, _, part in parts] == [data[a:b + 1] for a, b in BATCH]
    return [fields["x-cache"]]


async def read_single(process: Process, data: bytes) -> list[str]:
    a, b = SINGLE
    [(status, fields, body)] = await exchange(process.url, get(f"bytes={a}-{b}"))
    assert (status, body) == (206, data[a:b + 1])
    return [fields["x-cache"]]


async def read_everywhere(process: Process, data: bytes) -> list[str]:
    """Batches and single ranges on CONNECTIONS connections each (so on every process
    of the spoke), all checked; their X-Cache values."""
    answers = await asyncio.gather(
        *(read_batch(process, data) for _ in range(CONNECTIONS)),
        *(read_single(process, data) for _ in range(CONNECTIONS)))
    return [x for answer in answers for x in answer]


async def settled(process: Process, done: Callable[[dict[str, object]], bool]) -> dict[str, object]:
    """/stats once ``done`` holds of it (reader workers report every 50 ms)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        found = await asyncio.to_thread(blocking_stats, process.url)
        if done(found) or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.05)


def corrupt_count(found: dict[str, object], cause: str) -> int:
    counts = found["corrupt_chunks"]
    assert isinstance(counts, dict)
    return int(counts[cause])


def chunk_path(cache_dir: Path, index: int) -> Path:
    [path] = [p for p in (cache_dir / "chunks").glob(f"*/*-{index}")]
    return path


def changed(path: Path, change: Callable[[], None]) -> None:
    """Run ``change`` of chunk file ``path`` so that its identity differs (a rewrite
    within one tick of the filesystem's clock keeps inode, size, mtime and ctime; the
    reads' check needs one of them to change, the background scrub does not)."""
    before = identity(os.stat(path, follow_symlinks=False))
    change()
    after = os.stat(path, follow_symlinks=False)
    if identity(after) == before:
        os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns + 1), follow_symlinks=False)


def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def flip_byte(cache_dir: Path, _: Path) -> list[Path]:
    path = chunk_path(cache_dir, 2)

    def flip() -> None:
        with path.open("r+b") as f:
            f.seek(2 * CUT + 50)
            old = f.read(1)
            f.seek(2 * CUT + 50)
            f.write(bytes([old[0] ^ 0x01]))

    changed(path, flip)
    return [path]


def copy_other_chunk(cache_dir: Path, _: Path) -> list[Path]:
    path = chunk_path(cache_dir, 2)
    changed(path, lambda: shutil.copyfile(chunk_path(cache_dir, 7), path))
    return [path]


def swap_two_chunks(cache_dir: Path, _: Path) -> list[Path]:
    first, second = chunk_path(cache_dir, 2), chunk_path(cache_dir, 3)
    aside = first.with_name(first.name + ".aside")
    first.rename(aside)
    second.rename(first)
    aside.rename(second)
    return [first, second]


def symlink_outside(cache_dir: Path, outside: Path) -> list[Path]:
    path = chunk_path(cache_dir, 2)
    path.unlink()
    path.symlink_to(outside)
    return [path]


def foreign_owner(cache_dir: Path, _: Path) -> list[Path]:
    path = chunk_path(cache_dir, 2)
    changed(path, lambda: os.chown(path, 65534, 65534))
    return [path]


def shrink(cache_dir: Path, _: Path) -> list[Path]:
    path = chunk_path(cache_dir, 2)
    os.truncate(path, CUT)
    return [path]


# Change, cause counted, and whether the processes holding the file open see it: a
# change to the file itself, yes; a new file in its place (the open one keeps the
# verified bytes, and is served), only a process that opens it afresh.
CASES = {
    "flipped-byte": (flip_byte, "digest", True),
    "other-chunk-copied-over": (copy_other_chunk, "digest", True),
    "foreign-owner": (foreign_owner, "owner", True),
    "shrunk": (shrink, "size", True),
    "swapped": (swap_two_chunks, "digest", False),
    "symlink-outside": (symlink_outside, "not-regular", False),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_changed_chunk_file_is_dropped_and_fetched_again_never_served(
    spoke: Spoke, dataset: Dataset, tmp_path: Path, case: str,
) -> None:
    if case == "foreign-owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user takes root")
    change, cause, live = CASES[case]
    data = dataset[1][OBJECT]
    outside = tmp_path / "secret.txt"  # as long as a chunk: a size check alone passes it
    outside.write_bytes((b"secret\n" * CHUNK)[:CHUNK])
    process = spoke.process
    assert process is not None
    [(status, _, body)] = await exchange(process.url, get())
    assert (status, body) == (200, data)
    await settled(process, lambda s: s["used_bytes"] == len(data))
    # Every process serves them as hits, and holds the files open (mapped for batches).
    assert set(await read_everywhere(process, data)) == {"HIT"}

    bad = change(spoke.cache_dir, outside)
    caches = set(await read_everywhere(process, data))
    if live:
        assert caches != {"HIT"}  # the changed chunk came anew, from the hub
        await found_and_fetched_again(process, cause, len(bad), len(data))
    else:
        assert caches == {"HIT"}  # the verified files, still open
    await spoke.stop()

    # A new spoke opens every file afresh: the changed ones, if still there, are found.
    process = await spoke.start()
    await read_everywhere(process, data)
    if not live:
        await found_and_fetched_again(process, cause, len(bad), len(data))
    assert corrupt_count(await asyncio.to_thread(blocking_stats, process.url), cause) == \
        (0 if live else len(bad))
    assert set(await read_everywhere(process, data)) == {"HIT"}
    for path in bad:  # stored again, as the chunk itself
        st = os.stat(path, follow_symlinks=False)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
        index = int(path.name.rsplit("-", 1)[1])
        assert digest("xxh3-128", path.read_bytes()) == \
            digest("xxh3-128", data[index * CHUNK:(index + 1) * CHUNK])
    assert outside.read_bytes() == (b"secret\n" * CHUNK)[:CHUNK]  # followed by nobody


async def found_and_fetched_again(
    process: Process, cause: str, bad: int, size: int
) -> None:
    """Wait until ``bad`` chunk files were counted bad for ``cause`` and the object is
    all stored again; fail if it is not, or if more were counted."""
    found = await settled(process, lambda s: corrupt_count(s, cause) >= bad and
                          s["used_bytes"] == size)
    assert (corrupt_count(found, cause), found["used_bytes"]) == (bad, size)


async def test_a_mapped_chunk_that_shrank_is_fetched_again_for_every_batch(
    spoke: Spoke, dataset: Dataset,
) -> None:
    data = dataset[1][OBJECT]
    process = spoke.process
    assert process is not None
    assert (await exchange(process.url, get()))[0][2] == data
    await settled(process, lambda s: s["used_bytes"] == len(data))
    assert set(await read_everywhere(process, data)) == {"HIT"}  # mapped everywhere

    os.truncate(chunk_path(spoke.cache_dir, 2), CUT)
    for _ in range(10):  # batches only: a loader that never reads one range alone
        caches = await asyncio.gather(*(read_batch(process, data) for _ in range(CONNECTIONS)))
        assert {x for answer in caches for x in answer} <= {"HIT", "MISS", "PARTIAL"}
    await found_and_fetched_again(process, "size", 1, len(data))
    assert os.stat(chunk_path(spoke.cache_dir, 2)).st_size == CHUNK
