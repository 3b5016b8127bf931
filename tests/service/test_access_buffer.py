"""The buffered access log's lines are those ``logging`` writes for the same request."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time

import pytest

from service import access_buffer
from service.access_buffer import AccessBuffer, OrderedStreamHandler
from service.logs import JsonFormatter, access_logger

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REQUESTS = [
    ("a1", "GET", "/objects/ds/x.bin?versionId=3", 206, "127.0.0.1", 4096, "HIT"),
    ("b2", "HEAD", "/healthz", 200, None, 0, None),
    ("c3", "GET", "/objects/d\u00e9j\u00e0/\"q\".bin", 404, "::1", 120, "MISS"),
]


def record_of(entry: access_buffer.Entry) -> logging.LogRecord:
    """The record ``service.logs.log_access`` would have made for ``entry``."""
    created, duration_ms, rid, method, path, status, remote, body_bytes, x_cache = entry
    record = access_logger.makeRecord(
        access_logger.name, logging.INFO, __file__, 1, "%s %s %d", (method, path, status),
        None, extra={"request_id": rid, "method": method, "path": path, "status": status,
                     "remote": remote, "duration_ms": duration_ms, "bytes": body_bytes,
                     "x_cache": x_cache})
    record.created = created
    record.msecs = int((created - int(created)) * 1000)
    return record


@pytest.mark.parametrize(("fmt", "formatter"), [
    ("text", logging.Formatter(TEXT_FORMAT)), ("json", JsonFormatter()),
])
def test_each_line_reads_as_the_formatter_writes_the_record(
    fmt: str, formatter: logging.Formatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One reading of the clocks for the batch and for the expected records alike.
    offset = access_buffer._wall_offset()
    monkeypatch.setattr(access_buffer, "_wall_offset", lambda: offset)
    stream = io.StringIO()
    buffer = AccessBuffer(OrderedStreamHandler(stream), fmt)

    async def serve() -> list[access_buffer.Entry]:  # on a loop: the lines wait
        for rid, method, path, status, remote, body_bytes, x_cache in REQUESTS:
            buffer.add(rid, method, path, status, remote, time.perf_counter(), body_bytes,
                       x_cache)
        return access_buffer._entries(list(buffer._waiting))

    entries = asyncio.run(serve())
    assert len(entries) == len(REQUESTS) and stream.getvalue() == ""
    buffer.flush()
    expected = "".join(formatter.format(record_of(e)) + "\n" for e in entries)
    assert stream.getvalue() == expected
    assert buffer.written == len(REQUESTS)


def test_a_full_batch_is_written_at_once_and_the_rest_before_another_line() -> None:
    stream = io.StringIO()
    handler = OrderedStreamHandler(stream)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    buffer = access_buffer.start_buffer(handler, "text")

    async def serve() -> None:  # on a loop: lines wait for their batch or the timer
        for i in range(access_buffer.MAX_BATCH + 3):
            buffer.add(f"r{i}", "GET", "/x", 200, None, time.perf_counter(), 1, None)
        assert buffer.written == access_buffer.MAX_BATCH
        handler.handle(logging.makeLogRecord({"msg": "stopping", "levelno": logging.INFO,
                                              "levelname": "INFO", "name": "hub"}))

    asyncio.run(serve())
    lines = stream.getvalue().splitlines()
    assert len(lines) == access_buffer.MAX_BATCH + 4
    assert lines[-1].endswith("hub: stopping")
    assert [line.rsplit(": ", 1)[1] for line in lines[:-1]] == ["GET /x 200"] * (
        access_buffer.MAX_BATCH + 3)


def test_off_a_loop_each_line_is_written_at_once() -> None:
    stream = io.StringIO()
    buffer = AccessBuffer(OrderedStreamHandler(stream), "text")
    buffer.add("r", "GET", "/x", 200, None, time.perf_counter(), 1, None)
    assert stream.getvalue().endswith("INFO hubspoke.access: GET /x 200\n")


def test_on_a_loop_the_timer_writes_a_lone_line() -> None:
    stream = io.StringIO()
    buffer = AccessBuffer(OrderedStreamHandler(stream), "text")

    async def serve() -> None:
        buffer.add("r", "GET", "/x", 200, None, time.perf_counter(), 1, None)
        assert buffer.written == 0
        for _ in range(3000):
            if buffer.written:
                break
            await asyncio.sleep(0.01)

    asyncio.run(serve())
    assert buffer.written == 1 and stream.getvalue().endswith("GET /x 200\n")


def test_a_timer_on_a_loop_gone_does_not_hold_later_lines() -> None:
    stream = io.StringIO()
    buffer = AccessBuffer(OrderedStreamHandler(stream), "text")

    async def one() -> None:
        buffer.add("r", "GET", "/x", 200, None, time.perf_counter(), 1, None)

    asyncio.run(one())  # its timer never fires: the loop closed first
    asyncio.run(one())
    buffer.add("r", "GET", "/y", 200, None, time.perf_counter(), 1, None)  # off a loop: now
    assert buffer.written == 3


class _Recorded(io.BytesIO):
    """A binary layer that keeps each write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes.append(bytes(data))
        return super().write(data)


def test_a_batch_goes_out_in_whole_lines_no_longer_than_an_atomic_pipe_write() -> None:
    binary = _Recorded()
    stream = io.TextIOWrapper(binary, encoding="utf-8", write_through=True)
    buffer = AccessBuffer(OrderedStreamHandler(stream), "json")
    long_path = "/objects/" + "\u00e9" * (access_buffer.PIPE_BUF)  # one line longer than it

    async def serve() -> None:
        for i in range(300):
            buffer.add(f"r{i}", "GET", long_path if i == 150 else f"/x/{i}", 200, None,
                       time.perf_counter(), 1, None)
        buffer.flush()

    asyncio.run(serve())
    lines = binary.getvalue().decode().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [f"r{i}" for i in range(300)]
    assert len(binary.writes) > 2
    for data in binary.writes:
        assert data.endswith(b"\n")
        assert len(data) <= access_buffer.PIPE_BUF or data.count(b"\n") == 1
