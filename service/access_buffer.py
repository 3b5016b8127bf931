"""The buffered access log (``--access-log buffered``, the default): every request's line,
written in batches.

One ``logging`` record per request (``--access-log on``) costs small reads much of their rate
(docs/operations.md): the record, its formatting, a lock and a ``write`` system call, each
request. Here a
request only appends a tuple; the lines are formatted together and written in one call
once the batch is full, a moment after its first line (a timer on the loop), before any
other log line (so the log stays in order) and when the process exits (``atexit``: a
server stops on SIGTERM by returning from its loop). A line is late by at most
:data:`FLUSH_AFTER_S`, never lost at a clean stop.

The lines are those the ``logging`` formatters of :func:`service.logs.setup_logging` would
write for the same request, text or JSON, field for field.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import select
import time
from collections.abc import Callable
from typing import TextIO

# How long a line may wait for its batch, and the most lines a batch holds.
FLUSH_AFTER_S = 0.25
MAX_BATCH = 512
LOGGER_NAME = "hubspoke.access"
# POSIX's bound on a write to a pipe that is never interleaved with others' (Linux: 4 KiB).
PIPE_BUF = getattr(select, "PIPE_BUF", 512)

# (time.time(), duration_ms, request id, method, path, status, remote, bytes, x_cache)
Entry = tuple[float, float, str, str, str, int, str | None, int, str | None]
# As a request leaves it: (perf_counter at the end, at the start, request id, method,
# target, status, remote, bytes, x_cache); the rest is worked out in the batch.
Raw = tuple[float, float, str, str, str, int, str | None, int, str | None]


def _wall_offset() -> float:
    """What to add to a perf_counter reading to make it a time.time() one."""
    return time.time() - time.perf_counter()


def _entries(raw: list[Raw]) -> list[Entry]:
    """The lines' fields: a wall-clock time for each end (from one reading of each clock
    for the batch), the duration in ms, the path without its query."""
    offset = _wall_offset()
    return [(ended + offset, round(1000 * (ended - started), 3), rid, method,
             target.partition("?")[0], status, remote, body_bytes, x_cache)
            for ended, started, rid, method, target, status, remote, body_bytes, x_cache
            in raw]


def _text_lines(entries: list[Entry]) -> str:
    """``%(asctime)s %(levelname)s %(name)s: %(message)s``, as ``logging.Formatter``."""
    out = []
    second, stamp = -1, ""
    for created, _, _, method, path, status, _, _, _ in entries:
        whole = int(created)
        if whole != second:
            second, stamp = whole, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
        msecs = int((created - whole) * 1000)
        out.append(f"{stamp},{msecs:03d} INFO {LOGGER_NAME}: {method} {path} {status}\n")
    return "".join(out)


# json.dumps(..., default=str), as JsonFormatter calls it, without a new encoder a line.
_ENCODER = json.JSONEncoder(default=str)


def _json_lines(entries: list[Entry]) -> str:
    """One JSON object a line, as :class:`service.logs.JsonFormatter` writes a record."""
    encode = _ENCODER.encode
    return "".join(
        encode({
            "ts": round(created, 6), "level": "info", "logger": LOGGER_NAME,
            "msg": f"{method} {path} {status}", "request_id": rid, "method": method,
            "path": path, "status": status, "remote": remote, "duration_ms": duration_ms,
            "bytes": body_bytes, "x_cache": x_cache,
        }) + "\n"
        for created, duration_ms, rid, method, path, status, remote, body_bytes, x_cache
        in entries
    )


def _write(stream: TextIO, text: str) -> None:
    """Write ``text`` (whole lines) to ``stream``, in writes of at most :data:`PIPE_BUF`
    bytes that each end a line: on a pipe (a container's stderr) such a write is atomic,
    so reader workers sharing it never split each other's lines."""
    binary = getattr(stream, "buffer", None)
    if binary is None:  # a text-only stream (a test's): no descriptor to share
        stream.write(text)
        stream.flush()
        return
    data = text.encode(stream.encoding or "utf-8", stream.errors or "strict")
    stream.flush()  # whatever its text layer holds goes first
    start = 0
    while start < len(data):
        end = start + PIPE_BUF
        if end < len(data):
            cut = data.rfind(b"\n", start, end)
            # A line longer than PIPE_BUF goes whole, in one write of its own.
            end = cut + 1 if cut >= start else (data.find(b"\n", end) + 1 or len(data))
        binary.write(data[start:end])
        binary.flush()
        start = end


class OrderedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the access lines waiting before each of its own, so
    the log reads in the order things happened."""

    buffer: AccessBuffer | None = None  # set by start_buffer

    def emit(self, record: logging.LogRecord) -> None:
        if self.buffer is not None:
            self.buffer.flush()
        super().emit(record)


class AccessBuffer:
    """Access lines waiting to be written to ``handler``'s stream, in ``fmt``."""

    def __init__(self, handler: OrderedStreamHandler, fmt: str) -> None:
        self.handler = handler
        self._format: Callable[[list[Entry]], str] = _json_lines if fmt == "json" else _text_lines
        # deque: append and popleft are atomic, so a flush from another thread (a log
        # line from a thread, atexit) never loses a line appended meanwhile.
        self._waiting: collections.deque[Raw] = collections.deque()
        self._armed_on: asyncio.AbstractEventLoop | None = None  # the loop a flush waits on
        self.written = 0  # lines written so far

    def add(
        self, rid: str, method: str, path: str, status: int, remote: str | None,
        started: float, body_bytes: int, x_cache: str | None,
    ) -> None:
        """One answered request (``started``: a perf_counter reading)."""
        waiting = self._waiting
        waiting.append((time.perf_counter(), started, rid, method, path, status, remote,
                        body_bytes, x_cache))
        if len(waiting) >= MAX_BATCH:
            self.flush()
        elif self._armed_on is None or self._armed_on.is_closed():
            self._arm()

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread to flush later on: now, then
            self.flush()
            return
        self._armed_on = loop
        loop.call_later(FLUSH_AFTER_S, self._timed_flush)

    def _timed_flush(self) -> None:
        self._armed_on = None
        self.flush()

    def flush(self) -> None:
        """Write every line waiting, in one call."""
        waiting = self._waiting
        if not waiting:
            return
        entries: list[Raw] = []
        while True:
            try:
                entries.append(waiting.popleft())
            except IndexError:
                break
        handler = self.handler
        handler.acquire()
        try:
            _write(handler.stream, self._format(_entries(entries)))
            self.written += len(entries)
        except (OSError, ValueError):  # stderr gone or closed: nowhere left to say it
            return
        finally:
            handler.release()


_flush_at_exit: list[AccessBuffer] = []


def _flush_all() -> None:
    for buffer in _flush_at_exit:
        buffer.flush()


atexit.register(_flush_all)


def start_buffer(handler: OrderedStreamHandler, fmt: str) -> AccessBuffer:
    """A buffer writing through ``handler``, flushed before its other lines and at exit."""
    buffer = AccessBuffer(handler, fmt)
    handler.buffer = buffer
    _flush_at_exit[:] = [buffer]
    return buffer
