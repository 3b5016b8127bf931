"""send_file_range's fallback (no sendfile, or bytes still queued): blocks read and
written in order, and a file that ends before its range raises instead of leaving
the answer short on a kept-alive connection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spoke.serve.plain import WRITE_BLOCK_BYTES, send_file_range


class _QueuedConnection:
    """Stands in for a connection whose sendfile declines (TLS, bytes queued)."""

    def __init__(self) -> None:
        self.sent = bytearray()

    async def sendfile(self, fd: int, offset: int, count: int) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.sent += data

    async def drain(self) -> None:
        return None


async def test_the_range_is_written_whole_in_blocks(tmp_path: Path) -> None:
    data = bytes(range(256)) * (3 * WRITE_BLOCK_BYTES // 256 + 7)
    (tmp_path / "chunk").write_bytes(data)
    conn = _QueuedConnection()
    fd = os.open(tmp_path / "chunk", os.O_RDONLY)
    try:
        await send_file_range(conn, fd, 100, len(data) - 5)  # type: ignore[arg-type]
    finally:
        os.close(fd)
    assert bytes(conn.sent) == data[100:-5]


async def test_a_file_shorter_than_its_range_raises(tmp_path: Path) -> None:
    (tmp_path / "chunk").write_bytes(b"x" * 1000)
    conn = _QueuedConnection()
    fd = os.open(tmp_path / "chunk", os.O_RDONLY)
    try:
        with pytest.raises(EOFError):
            await send_file_range(conn, fd, 0, 5000)  # type: ignore[arg-type]
    finally:
        os.close(fd)
