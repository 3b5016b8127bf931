"""A stand-in for Shopify's Toxiproxy server, in asyncio.

No ``toxiproxy-server`` binary can be installed everywhere we run (no docker,
not on PyPI), so this module serves the part of Toxiproxy's HTTP API that the
``toxiproxy-python`` client and our code use, with Toxiproxy's semantics:

* ``GET|POST /proxies``, ``GET|POST|PATCH|DELETE /proxies/{name}``,
  ``GET|POST /proxies/{name}/toxics``,
  ``GET|POST|PATCH|DELETE /proxies/{name}/toxics/{toxic}``,
  ``POST /reset``, ``POST /populate``, ``GET /version``;
* errors as ``{"error": "...", "status": N}`` (400 bad input, 404 not found,
  409 exists, 500 e.g. listen address in use);
* toxics ``latency``, ``bandwidth``, ``slow_close``, ``timeout``,
  ``reset_peer``, ``limit_data``, ``slicer`` and ``noop``, per stream
  (``upstream`` = client→server, ``downstream`` = server→client), with
  ``toxicity`` rolled per connection, applied to live connections too.

Data plane: each proxied connection has two links (one per direction). A link
has a reader task that reads the source as fast as it can, stamping every chunk
with its read time into a byte-bounded buffer, and a pump task that runs each
chunk through that direction's toxics in order and writes it out. Because the
stamp is taken at read time, a latency toxic works as a delay line (a chunk is
released at read time + latency), so delays do not add up across chunks.

Run ``python -m loadtest.toxiproxy_server --host 127.0.0.1 --port 0``; once it
accepts it prints ``listening on http://HOST:PORT`` on stderr. In-process use:
:class:`ToxiproxyServer`; from synchronous code (pytest): :func:`run_in_subprocess`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import ipaddress
import itertools
import json
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from aiohttp import web

from loadtest import gojson
from service.buffers import has_views

# Under `python -m` __name__ is "__main__"; log under the module's real name either way.
logger = logging.getLogger("loadtest.toxiproxy_server" if __name__ == "__main__" else __name__)

VERSION = "2.12.0-hubspoke-standin"
UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
STREAMS = (UPSTREAM, DOWNSTREAM)
LISTENING_PREFIX = "listening on "

# Toxiproxy's io.Copy moves 32 KiB at a time; here a chunk is whatever one read of
# the socket returned (up to uvloop's 256 KiB), because Python pays per chunk. Data
# a link passes on is gathered and written with one system call once it has this
# much, or before the link waits for anything.
FLUSH_BYTES = 1 << 20
# Sockets are read into buffers of this size (the most uvloop reads at once). A view
# holds its whole buffer, so reads smaller than COPY_BELOW_BYTES are copied out (the
# buffer serves again at once): memory held is at most 4x the bytes in flight.
RECEIVE_BYTES = 256 << 10
COPY_BELOW_BYTES = 64 << 10
# Buffers lent and still viewed beyond this many are left to the garbage collector.
MAX_LENT_BUFFERS = 1024
# A destination socket's transport buffers this much before the link waits for it.
WRITE_HIGH_WATER = 1 << 20
# A link stops reading its source once this many bytes wait in its buffer. It must
# cover the bandwidth-delay product of a latency toxic (e.g. 60 ms at 500 MB/s =
# 30 MB); bounding by bytes rather than by chunk count keeps small-packet traffic
# from being throttled by the buffer instead of by the toxic.
BUFFER_LIMIT = 32 * 1024 * 1024
# A toxic holding a stream with no deadline wakes this often (and on every change).
HOLD_RECHECK_S = 3600.0

# Attribute names and defaults per toxic type, in the order the real server reports them.
TOXIC_ATTRIBUTES: dict[str, dict[str, int]] = {
    "noop": {},
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "limit_data": {"bytes": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
}
# The Go struct behind each type, for decode error messages.
TOXIC_STRUCTS = {
    "noop": "NoopToxic", "latency": "LatencyToxic", "bandwidth": "BandwidthToxic",
    "slow_close": "SlowCloseToxic", "timeout": "TimeoutToxic", "reset_peer": "ResetToxic",
    "limit_data": "LimitDataToxic", "slicer": "SlicerToxic",
}  # fmt: skip


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error the HTTP API reports as ``{"error": message, "status": status}``.

    As in Toxiproxy, where any error that is not one of its own API errors
    (a listen failure, say) is a 500 with the error's text.
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _bad_request(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _internal(detail: str) -> ApiError:
    return ApiError(detail, 500)


def _missing_field(detail: str) -> ApiError:
    return ApiError(f"missing required field: {detail}", 400)


PROXY_NOT_FOUND = ("proxy not found", 404)
PROXY_EXISTS = ("proxy already exists", 409)
TOXIC_NOT_FOUND = ("toxic not found", 404)
TOXIC_EXISTS = ("toxic already exists", 409)
INVALID_STREAM = ("stream was invalid, can be either upstream or downstream", 400)
INVALID_TOXIC_TYPE = ("invalid toxic type", 400)


def _fail(error: tuple[str, int]) -> NoReturn:
    raise ApiError(*error)


# --------------------------------------------------------------------------- addresses


def split_hostport(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port``; an empty host means all interfaces."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise _bad_request(f"invalid address {address!r}, want host:port")
    return host.strip("[]"), int(port_text)


def _format_hostport(sockname: Any) -> str:
    host, port = str(sockname[0]), int(sockname[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _go_split_hostport(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``ValueError`` with Go's message if it would fail."""
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket:
            raise ValueError(f"address {address}: missing ']' in address")
        if not rest.startswith(":"):
            problem = "missing port in address" if not rest else "unexpected ']' in address"
            raise ValueError(f"address {address}: {problem}")
        return host, rest[1:]
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError(f"address {address}: missing port in address")
    if ":" in host:
        raise ValueError(f"address {address}: too many colons in address")
    return host, port


def _go_port(port: str) -> int:
    """A port as Go's ``net.Listen`` reads it: empty means any, names are services."""
    if not port:
        return 0
    if port.isdigit():
        if int(port) > 65535:
            raise ValueError(f"address {port}: invalid port")
        return int(port)
    try:
        return socket.getservbyname(port, "tcp")
    except OSError as exc:
        raise ValueError(f"lookup tcp/{port}: unknown port") from exc


async def _resolve_listen_host(host: str) -> tuple[socket.AddressFamily, str]:
    """The one address Go's ``net.Listen`` binds for ``host``.

    No host, ``0.0.0.0`` or ``::`` is every interface, on one dual-stack socket
    (Go reports it as ``[::]:PORT``); a name is resolved to one address, IPv4 first.
    """
    try:
        literal = ipaddress.ip_address(host.partition("%")[0]) if host else None
    except ValueError:
        literal = None
    if not host or (literal is not None and literal.is_unspecified):
        return (socket.AF_INET6, "::") if socket.has_dualstack_ipv6() else (socket.AF_INET, "")
    if literal is not None:
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        return family, host
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"lookup {host}: no such host") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return infos[0][0], str(infos[0][4][0])


async def listen_like_go(listen: str) -> socket.socket:
    """A listening socket for ``listen``, as Toxiproxy's ``net.Listen("tcp", listen)``.

    Raises :class:`ApiError` 500 with Go's error text when it cannot listen.
    """
    try:
        host, port_text = _go_split_hostport(listen)
        port = _go_port(port_text)
        family, address = await _resolve_listen_host(host)
    except ValueError as exc:
        raise _internal(f"listen tcp: {exc}") from exc
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and address == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        shown = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        reason = (exc.strerror or str(exc)).lower()
        raise _internal(f"listen tcp {shown}: bind: {reason}") from exc
    sock.setblocking(False)
    return sock


# --------------------------------------------------------------------------- toxics


@dataclass
class Toxic:
    """A toxic's configuration; runtimes read it live, so updates apply at once."""

    name: str
    type: str
    stream: str  # as the client wrote it ("UpStream" too): Toxiproxy reports it so
    toxicity: float  # a float32, as Toxiproxy keeps it
    attributes: dict[str, int]

    @property
    def direction(self) -> str:
        return self.stream.lower()

    def to_json(self) -> dict[str, Any]:
        # The field order of Toxiproxy's ToxicWrapper: attributes come first.
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": gojson.number(self.toxicity),
        }


def _decode_attributes(
    toxic_type: str, body: gojson.Fields | None, base: dict[str, int]
) -> dict[str, int]:
    """Decode ``body``'s ``attributes`` over ``base`` into the toxic's Go struct."""
    where = f"{TOXIC_STRUCTS[toxic_type]}"
    raw = gojson.object_field(body, "attributes", "ToxicWrapper", f"toxics.{where}")
    return {
        key: gojson.int64_field(raw, key, f"{where}.attributes", value)
        for key, value in base.items()
    }


def _decoded(decode: Callable[[], Any]) -> Any:
    """Run a decode step; Go's decode errors are 400 "bad request body"."""
    try:
        return decode()
    except gojson.DecodeError as exc:
        raise _bad_request(str(exc)) from exc


def parse_new_toxic(raw: bytes, exists: Callable[[str], bool]) -> Toxic:
    """Decode a toxic-create body as Toxiproxy's AddToxicJson, checking in its order.

    Defaults are stream ``downstream``, toxicity 1 and name ``<type>_<stream>``;
    the name clash (409) is found before the attributes are decoded.
    """

    def wrapper() -> tuple[gojson.Fields | None, str, str, str, float]:
        body = gojson.struct_fields(gojson.decode(raw), "toxics.ToxicWrapper")
        # Here the attributes decode into a no-op toxic: only their shape is checked.
        gojson.object_field(body, "attributes", "ToxicWrapper", "toxics.NoopToxic")
        name = gojson.string_field(body, "name", "ToxicWrapper", "")
        toxic_type = gojson.string_field(body, "type", "ToxicWrapper", "")
        stream = gojson.string_field(body, "stream", "ToxicWrapper", DOWNSTREAM)
        toxicity = gojson.float32_field(body, "toxicity", "ToxicWrapper", 1.0)
        return body, name, toxic_type, stream, toxicity

    body, name, toxic_type, stream, toxicity = _decoded(wrapper)
    if stream.lower() not in STREAMS:
        _fail(INVALID_STREAM)
    name = name or f"{toxic_type}_{stream}"
    if toxic_type not in TOXIC_ATTRIBUTES:
        _fail(INVALID_TOXIC_TYPE)
    if exists(name):
        _fail(TOXIC_EXISTS)
    attributes = _decoded(
        lambda: _decode_attributes(toxic_type, body, TOXIC_ATTRIBUTES[toxic_type])
    )
    return Toxic(name, toxic_type, stream, toxicity, attributes)


def apply_toxic_update(toxic: Toxic, raw: bytes) -> None:
    """Decode a toxic-update body as Toxiproxy's UpdateToxicJson: attributes and
    toxicity only (name, type and stream are fixed); nothing changes on an error."""

    def decode() -> tuple[dict[str, int], float]:
        body = gojson.struct_fields(gojson.decode(raw), "struct")
        attributes = _decode_attributes(toxic.type, body, toxic.attributes)
        toxicity = gojson.float32_field(body, "toxicity", "struct", toxic.toxicity)
        return attributes, toxicity

    toxic.attributes, toxic.toxicity = _decoded(decode)


@dataclass(slots=True)
class Chunk:
    data: bytes | memoryview  # a view of a receive buffer (see _ReceiveBuffers)
    stamp: float  # loop time the data was read (latency toxics push it forward)


class _Outlet:
    """Where a toxic sends its output: the rest of the link's chain after it."""

    __slots__ = ("_chain", "_index", "_link")

    def __init__(self, link: _Link, chain: tuple[_Runtime, ...], index: int) -> None:
        self._link = link
        self._chain = chain
        self._index = index

    async def emit(self, chunk: Chunk) -> None:
        await self._link.through(self._chain, self._index, chunk)

    async def close(self) -> None:
        """End the stream here: later toxics see EOF, then the destination is closed."""
        await self._link.finish_through(self._chain[self._index :])


class _Runtime:
    """One toxic on one link (one connection, one direction): per-connection state."""

    def __init__(self, toxic: Toxic, link: _Link) -> None:
        self.toxic = toxic
        self.link = link
        self.removed = False
        self.generation = 0  # bumped on update so sleeping toxics recompute
        self.active = self._roll()

    def _roll(self) -> bool:
        # Toxiproxy decides per connection (and again on update) whether a toxic acts.
        return random.random() < self.toxic.toxicity

    @property
    def engaged(self) -> bool:
        return self.active and not self.removed

    def attr(self, key: str) -> int:
        return self.toxic.attributes.get(key, 0)

    def attached(self) -> None:
        """Called when the toxic starts acting on this link."""

    def updated(self) -> None:
        """Toxiproxy interrupts the toxic and runs it again (on an update, or when the
        toxic after it comes or goes): toxicity is rolled again, and what the toxic
        was holding goes out at once (a latency's chunk, a bandwidth's rest) or
        starts over (a timeout's countdown, a slow close's delay)."""
        self.active = self._roll()
        self.generation += 1

    def detached(self, rest_index: int) -> None:
        """Called after removal; ``rest_index`` is where the chain after it now starts."""
        self.removed = True

    def stopped(self) -> None:
        """Called when the link ends: drop timers."""

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        await out.emit(chunk)

    async def eof(self) -> None:
        """Called when the stream ends, before later toxics see the end."""

    async def hold_until(self, due: Callable[[], float | None]) -> None:
        """Sleep until ``due()`` (re-evaluated after every toxic change) has passed.

        Returns early when the toxic is removed or disengaged, like Toxiproxy's
        interrupt, which releases held data at once rather than dropping it.
        """
        loop = asyncio.get_running_loop()
        while self.engaged:
            deadline = due()
            if deadline is None:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            await self.link.pause(remaining)


class _Latency(_Runtime):
    def _sample(self) -> float:
        delay = self.attr("latency")
        jitter = self.attr("jitter")
        if jitter > 0:
            # Go's rand.Int63n(2 * jitter) - jitter: from -jitter up to jitter - 1.
            delay += random.randrange(-jitter, jitter)
        return delay / 1000.0

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        delay, generation = self._sample(), self.generation

        def due() -> float | None:
            if self.generation != generation:
                return None  # run again: what it holds goes out now (see _Runtime.updated)
            return chunk.stamp + delay

        # Release at read time + delay: a delay line, so queued chunks don't add up.
        await self.hold_until(due)
        if self.engaged and self.generation == generation:
            # Pushing the stamp forward makes chained latency toxics add up.
            chunk = Chunk(chunk.data, chunk.stamp + delay)
        await out.emit(chunk)


class _Bandwidth(_Runtime):
    def __init__(self, toxic: Toxic, link: _Link) -> None:
        super().__init__(toxic, link)
        self._free_at = 0.0  # when the emulated wire finishes the previous bytes

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        data, generation = chunk.data, self.generation
        while data:
            rate = self.attr("rate")  # KB/s, 1 KB = 1000 bytes
            if not self.engaged or rate <= 0:
                await out.emit(Chunk(data, chunk.stamp))
                return
            # Like Toxiproxy, release big chunks in slices of 100 ms worth of bytes.
            size = min(len(data), rate * 100)
            if not await self._transmit(size, generation):
                # Run again: the rest of the chunk goes out now, on a fresh wire.
                self._free_at = asyncio.get_running_loop().time()
                await out.emit(Chunk(data, chunk.stamp))
                return
            piece, data = data[:size], data[size:]
            await out.emit(Chunk(piece, chunk.stamp))

    async def _transmit(self, nbytes: int, generation: int) -> bool:
        """Wait while ``nbytes`` cross the wire; False if the toxic was run again meanwhile."""
        loop = asyncio.get_running_loop()
        # A virtual clock: sleep overshoot is paid back on the next chunk, so the
        # average rate holds; an idle wire earns no burst credit.
        start = max(loop.time(), self._free_at)

        def due() -> float | None:
            rate = self.attr("rate")
            if rate <= 0 or self.generation != generation:
                return None
            self._free_at = start + nbytes / (rate * 1000.0)
            return self._free_at

        await self.hold_until(due)
        if not self.engaged:
            self._free_at = loop.time()
        return self.generation == generation


class _SlowClose(_Runtime):
    async def eof(self) -> None:
        loop = asyncio.get_running_loop()
        start, generation = loop.time(), self.generation

        def due() -> float:
            nonlocal start, generation
            if generation != self.generation:  # run again: the delay starts over
                start, generation = loop.time(), self.generation
            return start + self.attr("delay") / 1000.0

        await self.hold_until(due)


class _Timeout(_Runtime):
    """Drops all data; closes the stream once ``timeout`` ms pass with no data (0 = never).

    As Toxiproxy's, whose loop waits on a fresh ``time.After(timeout)`` next to its
    input: the countdown starts when the toxic starts acting (connection start,
    being added, updated, or a neighbour changing) and starts over with every
    chunk that reaches it. Once its input has ended that loop never waits again,
    so the countdown stops and the stream stays open until the toxic goes.
    Removing the toxic closes the connections it was holding (its Cleanup).
    """

    def __init__(self, toxic: Toxic, link: _Link) -> None:
        super().__init__(toxic, link)
        self._timer: asyncio.TimerHandle | None = None
        self._ended = False  # the input has ended: the countdown never runs again

    def _arm(self) -> None:
        self.stopped()
        timeout = self.attr("timeout")
        if self.engaged and timeout > 0 and not self._ended:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(timeout / 1000.0, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self.link.close_after(self)

    def attached(self) -> None:
        self._arm()

    def updated(self) -> None:
        super().updated()
        self._arm()

    def detached(self, rest_index: int) -> None:
        was_engaged = self.engaged
        super().detached(rest_index)
        self.stopped()
        # After the end of input the pump waits in eof(); removal ends that wait
        # and the pump closes the stream itself.
        if was_engaged and not self._ended:
            self.link.close_from(rest_index)

    def stopped(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        # Data is dropped on the floor while the toxic is active, and restarts the countdown.
        self._arm()

    async def eof(self) -> None:
        self._ended = True
        self.stopped()
        loop = asyncio.get_running_loop()
        # Held until the toxic is removed or rolls inactive (hold_until returns then).
        await self.hold_until(lambda: loop.time() + HOLD_RECHECK_S)


class _ResetPeer(_Runtime):
    """On the first data in its stream, drops it, waits ``timeout`` ms, then resets (TCP RST).

    Toxiproxy waits on a bare ``time.After`` there, which nothing interrupts: once
    the data has come, removing or changing the toxic no longer stops the reset.
    """

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.attr("timeout") / 1000.0
        while (remaining := deadline - loop.time()) > 0:
            await self.link.pause(remaining)  # a toxic change wakes it: sleep on
        self.link.connection.reset()


class _LimitData(_Runtime):
    def __init__(self, toxic: Toxic, link: _Link) -> None:
        super().__init__(toxic, link)
        self._passed = 0  # per connection, kept across updates like Toxiproxy's state

    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        remaining = max(0, self.attr("bytes") - self._passed)
        data = chunk.data[:remaining]
        if data:
            self._passed += len(data)
            await out.emit(Chunk(data, chunk.stamp))
        if self.attr("bytes") - self._passed <= 0:
            await out.close()


def slice_bounds(size: int, average: int, variation: int) -> list[int]:
    """Where Toxiproxy's slicer cuts ``size`` bytes: ``[0, cut, ..., size]``.

    As its ``SlicerToxic.chunk``: a piece within ``variation`` of ``average`` (or
    smaller) stays whole, a bigger one is halved, give or take up to ``variation``,
    and each half sliced again. Cuts are kept inside the piece, where Go's would
    make a slice out of range and panic.
    """
    bounds = [0]
    pending = [(0, size)]  # a stack, left half on top: the bounds come out in order
    while pending:
        start, end = pending.pop()
        if (end - start) - average <= variation:
            bounds.append(end)
            continue
        mid = start + (end - start) // 2
        if variation > 0:
            mid += random.randrange(-variation, variation)  # Go: Intn(2v) - v
        mid = min(max(mid, start + 1), end - 1)
        pending += [(mid, end), (start, mid)]
    return bounds


class _Slicer(_Runtime):
    async def pipe(self, chunk: Chunk, out: _Outlet) -> None:
        average = self.attr("average_size")
        if average <= 0:  # Toxiproxy recurses without end here; pass the data on instead
            await out.emit(chunk)
            return
        bounds = slice_bounds(len(chunk.data), average, self.attr("size_variation"))
        for start, end in itertools.pairwise(bounds):
            await out.emit(Chunk(chunk.data[start:end], chunk.stamp))
            delay_us = self.attr("delay")
            if delay_us > 0:  # after every slice, the last one too, as Toxiproxy
                await self.link.pause(delay_us / 1e6)


RUNTIMES: dict[str, type[_Runtime]] = {
    "noop": _Runtime,
    "latency": _Latency,
    "bandwidth": _Bandwidth,
    "slow_close": _SlowClose,
    "timeout": _Timeout,
    "reset_peer": _ResetPeer,
    "limit_data": _LimitData,
    "slicer": _Slicer,
}


# --------------------------------------------------------------------------- data plane


class _ChunkBuffer:
    """A FIFO of chunks bounded by bytes; ``None`` marks the end of the stream.

    Filled by a protocol's ``data_received`` (which cannot wait): above the limit
    it pauses its source, and resumes it once the pump has taken the buffer below.
    """

    def __init__(
        self, limit: int, pause_source: Callable[[], None], resume_source: Callable[[], None]
    ) -> None:
        self._items: collections.deque[Chunk | None] = collections.deque()
        self._bytes = 0
        self._limit = limit
        self._discarding = False
        self._source_paused = False
        self._pause_source = pause_source
        self._resume_source = resume_source
        self._ready: asyncio.Future[None] | None = None

    def put(self, chunk: Chunk) -> None:
        if self._discarding:
            return
        self._items.append(chunk)
        self._bytes += len(chunk.data)
        if self._bytes >= self._limit and not self._source_paused:
            self._source_paused = True
            self._pause_source()
        self._wake()

    def put_eof(self) -> None:
        self._items.append(None)
        self._wake()

    def get_nowait(self) -> Chunk | bool | None:
        """The next item, or False when there is none yet."""
        if not self._items:
            return False
        item = self._items.popleft()
        if item is not None:
            self._bytes -= len(item.data)
            if self._source_paused and self._bytes < self._limit:
                self._source_paused = False
                self._resume_source()
        return item

    async def get(self) -> Chunk | None:
        while True:
            item = self.get_nowait()
            if item is not False:
                assert not isinstance(item, bool)
                return item
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready

    def discard(self) -> None:
        """Nobody will read any more: drop what is queued, never block the reader."""
        self._discarding = True
        self._items.clear()
        self._bytes = 0
        if self._source_paused:
            self._source_paused = False
            self._resume_source()

    def _wake(self) -> None:
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_result(None)


class _ReceiveBuffers:
    """Buffers sockets read into, each used again once nothing views its bytes.

    The loop reads straight into one (a buffered protocol), and the bytes travel
    the link as a view of it: no copy out of the loop's own read buffer, which for
    a plain protocol is a copy of every byte proxied. A buffer is lent for one read
    and taken again, oldest first, once no view of it is alive (its bytes were
    written, or dropped; :func:`service.buffers.has_views`).
    """

    def __init__(self) -> None:
        self._lent: collections.deque[bytearray] = collections.deque()

    def take(self) -> bytearray:
        if self._lent and not has_views(self._lent[0]):
            buffer = self._lent.popleft()
        else:
            buffer = bytearray(RECEIVE_BYTES)
            if len(self._lent) >= MAX_LENT_BUFFERS:
                self._lent.popleft()  # still viewed: freed when its views are
        self._lent.append(buffer)
        return buffer


class _End(asyncio.BufferedProtocol):
    """One socket of a proxied connection: the source of one link, the destination of
    the other. A buffered protocol rather than asyncio streams: what the loop reads
    goes to the link as it is (no copies through a StreamReader's buffer, nor out of
    the loop's read buffer)."""

    buffers = _ReceiveBuffers()

    def __init__(self, on_made: Callable[[_End], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self._on_made = on_made
        self._sink: _ChunkBuffer | None = None
        self._early: list[Chunk | None] = []  # what arrived before the link existed
        self._loop = asyncio.get_running_loop()
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._lost = False
        self._receiving = bytearray()

    # ---- asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> bytearray:
        self._receiving = self.buffers.take()
        return self._receiving

    def buffer_updated(self, nbytes: int) -> None:
        received = memoryview(self._receiving)[:nbytes]
        # Small reads (API calls, requests) are copied: a view would hold a whole buffer.
        self._received(received if nbytes >= COPY_BELOW_BYTES else bytes(received))

    def _received(self, data: bytes | memoryview) -> None:
        chunk = Chunk(data, self._loop.time())
        if self._sink is not None:
            self._sink.put(chunk)
            return
        self._early.append(chunk)
        if sum(len(c.data) for c in self._early if c is not None) >= BUFFER_LIMIT:
            self.pause_reading()

    def eof_received(self) -> bool:
        self._end_of_stream()
        return True  # keep the socket open for the other direction

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:  # e.g. the peer reset: an end of stream like any other
            logger.debug("connection lost: %s", exc)
        self._lost = True
        self._end_of_stream()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()

    # ---- as a source

    def feed(self, sink: _ChunkBuffer) -> None:
        """Send what is read from now on (and what came before) to ``sink``."""
        self._sink = sink
        early, self._early = self._early, []
        for chunk in early:
            if chunk is None:
                sink.put_eof()
            else:
                sink.put(chunk)
        self.resume_reading()

    def _end_of_stream(self) -> None:
        if self._sink is not None:
            self._sink.put_eof()
        else:
            self._early.append(None)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # ---- as a destination

    def is_closing(self) -> bool:
        return self._lost or self.transport is None or self.transport.is_closing()

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        if self.is_closing():
            raise ConnectionResetError("destination closed")
        assert self.transport is not None
        if len(parts) == 1:
            self.transport.write(parts[0])
        else:
            self.transport.writelines(parts)

    async def drain(self) -> None:
        while self._writing_paused and not self._lost:
            self._drained = self._loop.create_future()
            await self._drained
        if self._lost:
            raise ConnectionResetError("destination closed")

    def _wake_writer(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self, *, rst: bool = False) -> None:
        if self.transport is None:
            return
        if rst:
            # SO_LINGER {on, 0 s} makes close() send a TCP RST instead of a FIN.
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


class _Link:
    """One direction of a proxied connection: source → toxics → destination."""

    def __init__(
        self,
        connection: _Connection,
        stream: str,
        source: _End,
        dest: _End,
        toxics: Sequence[Toxic],
    ) -> None:
        self.connection = connection
        self.stream = stream
        self._source = source
        self._dest = dest
        self._loop = asyncio.get_running_loop()
        self._buffer = _ChunkBuffer(BUFFER_LIMIT, source.pause_reading, source.resume_reading)
        self._runtimes: list[_Runtime] = []
        self._waiters: set[asyncio.Future[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump_task: asyncio.Task[None] | None = None
        self._closing = False
        self._done = asyncio.Event()
        # Written data not yet handed to the socket: writes are gathered while the
        # pump has more at hand, and go out in one system call before it waits.
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        for toxic in toxics:
            self.attach(toxic, live=False)

    # ---- toxic management (called by the proxy on API changes)

    def attach(self, toxic: Toxic, *, live: bool = True) -> None:
        """Add ``toxic`` at the end of the chain; ``live`` when the link already runs."""
        if self._closing:
            return
        runtime = RUNTIMES[toxic.type](toxic, self)
        # Toxiproxy interrupts the toxic before the new one and runs it again: it
        # rolls its toxicity again and starts over (a timeout's countdown too).
        if live and self._runtimes:
            self._runtimes[-1].updated()
        self._runtimes.append(runtime)
        runtime.attached()
        self.notify()

    def update(self, name: str) -> None:
        for runtime in self._runtimes:
            if runtime.toxic.name == name:
                runtime.updated()
        self.notify()

    def detach(self, name: str) -> None:
        for index, runtime in enumerate(self._runtimes):
            if runtime.toxic.name == name:
                del self._runtimes[index]
                runtime.detached(index)
                if index > 0 and not self._closing:  # its predecessor runs again, as on attach
                    self._runtimes[index - 1].updated()
                break
        self.notify()

    def notify(self) -> None:
        """Wake a sleeping toxic so it re-reads its (possibly changed) settings."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a toxic change (``notify``) ends it early."""
        self._flush()
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.add(waiter)
        timer = self._loop.call_later(seconds, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)

    # ---- lifecycle

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("link %s task failed", self.stream, exc_info=task.exception())
            self.connection.kill()

    async def run(self) -> None:
        self._pump_task = self._spawn(self._pump())
        self._source.feed(self._buffer)
        try:
            await self._done.wait()
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop at once: no flushing (the connection is being killed or is done)."""
        self._closing = True
        self._out.clear()
        self._buffer.discard()
        for runtime in self._runtimes:
            runtime.stopped()
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self._done.set()

    async def _pump(self) -> None:
        try:
            while not self._closing:
                item = self._buffer.get_nowait()
                if item is False:
                    self._flush()  # nothing more at hand: send what was gathered
                    item = await self._buffer.get()
                assert not isinstance(item, bool)
                chain = tuple(self._runtimes)
                if item is None:
                    await self.finish_through(chain)
                    return
                await self.through(chain, 0, item)
        except OSError as exc:
            # The destination broke: nothing more can be delivered on this link.
            logger.debug("link %s destination failed: %s", self.stream, exc)
            self._dest.abort()
            self._closing = True
            self._out.clear()
            self._buffer.discard()
            self._done.set()

    async def through(self, chain: tuple[_Runtime, ...], index: int, chunk: Chunk) -> None:
        """Run ``chunk`` through ``chain[index:]`` and write what comes out."""
        while index < len(chain) and not chain[index].engaged:
            index += 1
        if self._closing:
            return
        if index == len(chain):
            await self._write(chunk.data)
            return
        await chain[index].pipe(chunk, _Outlet(self, chain, index + 1))

    async def _write(self, data: bytes | memoryview) -> None:
        if self._dest.is_closing():
            raise ConnectionResetError("destination closed")
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
            await self._dest.drain()

    def _flush(self) -> None:
        if not self._out or self._closing:
            return
        parts, self._out, self._out_bytes = self._out, [], 0
        self._dest.writelines(parts)

    async def finish_through(self, chain: Sequence[_Runtime]) -> None:
        """End of stream: let ``chain`` see it (slow_close waits), then close."""
        if self._closing:
            return
        self._flush()
        self._closing = True
        self._buffer.discard()
        for runtime in chain:
            if runtime.engaged:
                await runtime.eof()
        # Toxiproxy closes the destination fully (no half-close); the other link
        # then sees EOF on the same socket and closes its own destination.
        self._dest.close()
        self._done.set()

    def close_from(self, index: int) -> None:
        """End the stream at chain position ``index`` from outside the pump (timers, API)."""
        if self._closing:
            return
        rest = tuple(self._runtimes[index:])
        if self._pump_task is not None:
            self._pump_task.cancel()
        self._spawn(self.finish_through(rest))

    def close_after(self, runtime: _Runtime) -> None:
        if runtime in self._runtimes:
            self.close_from(self._runtimes.index(runtime) + 1)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Connection:
    """A client connection and its upstream connection, joined by two links."""

    def __init__(self, proxy: _Proxy, client: _End, upstream: _End) -> None:
        self._ends = (client, upstream)
        self.links = {
            UPSTREAM: _Link(self, UPSTREAM, client, upstream, proxy.toxics_for(UPSTREAM)),
            DOWNSTREAM: _Link(self, DOWNSTREAM, upstream, client, proxy.toxics_for(DOWNSTREAM)),
        }

    async def run(self) -> None:
        try:
            await asyncio.gather(*(link.run() for link in self.links.values()))
        finally:
            for end in self._ends:
                end.close()

    def kill(self, *, rst: bool = False) -> None:
        """Drop both sockets now (RST if ``rst``, else close) and stop both links."""
        for link in self.links.values():
            link.cancel()
        for end in self._ends:
            end.abort(rst=rst)

    def reset(self) -> None:
        logger.debug("resetting connection (reset_peer)")
        self.kill(rst=True)


# --------------------------------------------------------------------------- proxies


@dataclass(eq=False)  # identity semantics: a proxy is a live object, not a value
class _Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool = False
    toxics: list[Toxic] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _connections: set[_Connection] = field(default_factory=set)
    _accepting: set[asyncio.Task[None]] = field(default_factory=set)
    _epoch: int = 0  # bumped on stop so in-flight accepts know they are stale

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            # Toxiproxy's Proxy has an exported zerolog.Logger with no JSON tag, which
            # marshals as an empty object; clients see it, so it is here too.
            "Logger": {},
            "toxics": [toxic.to_json() for toxic in self.ordered_toxics()],
        }

    def ordered_toxics(self) -> list[Toxic]:
        # Toxiproxy lists the upstream chain first, then the downstream one.
        return [t for t in self.toxics if t.direction == UPSTREAM] + [
            t for t in self.toxics if t.direction == DOWNSTREAM
        ]

    def toxics_for(self, stream: str) -> list[Toxic]:
        return [t for t in self.toxics if t.direction == stream]

    def has_toxic(self, name: str) -> bool:
        return any(t.name == name for t in self.toxics)

    def find_toxic(self, name: str) -> Toxic:
        for toxic in self.toxics:
            if toxic.name == name:
                return toxic
        _fail(TOXIC_NOT_FOUND)

    # ---- listening

    async def start(self) -> None:
        if self.enabled:
            return
        # As Toxiproxy: no host (an omitted listen is "") means every interface.
        sock = await listen_like_go(self.listen)
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: _End(on_made=self._accepted), sock=sock)
        except OSError as exc:
            sock.close()
            raise _internal(f"listen tcp {self.listen}: {exc.strerror or exc}") from exc
        self._server = server
        self.listen = _format_hostport(server.sockets[0].getsockname())
        self.enabled = True
        logger.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    async def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._epoch += 1
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # Toxiproxy drops live connections when a proxy is disabled.
        for connection in list(self._connections):
            connection.kill()
        for task in list(self._accepting):
            task.cancel()
        if server is not None:
            await server.wait_closed()
        logger.info("proxy %s stopped", self.name)

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Toxiproxy's Proxy.Update: a new address restarts the listener (dropping
        connections), then the enabled flag is applied."""
        if listen != self.listen or upstream != self.upstream:
            await self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled and not self.enabled:
            await self.start()
        elif not enabled:
            await self.stop()

    def _accepted(self, client: _End) -> None:
        task = asyncio.ensure_future(self._accept(client))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _accept(self, client: _End) -> None:
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        try:
            # Toxiproxy takes any upstream text and finds out here, when it dials.
            host, port_text = _go_split_hostport(self.upstream)
            target = host or "localhost"  # Go dials the local system for ":port"
            _, upstream = await loop.create_connection(_End, target, _go_port(port_text))
        except (OSError, ValueError) as exc:
            logger.warning("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            client.close()
            return
        except asyncio.CancelledError:
            client.abort()
            raise
        if epoch != self._epoch:  # disabled while we were dialling
            upstream.abort()
            client.abort()
            return
        connection = _Connection(self, client, upstream)
        self._connections.add(connection)
        assert client.transport is not None
        logger.debug("proxy %s: client %s", self.name, client.transport.get_extra_info("peername"))
        try:
            await connection.run()
        except Exception:
            logger.exception("proxy %s: connection failed", self.name)
            connection.kill()
        finally:
            self._connections.discard(connection)

    # ---- toxics on live connections

    def add_toxic(self, toxic: Toxic) -> None:
        if any(t.name == toxic.name for t in self.toxics):
            _fail(TOXIC_EXISTS)
        self.toxics.append(toxic)
        for connection in list(self._connections):
            connection.links[toxic.direction].attach(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        for connection in list(self._connections):
            connection.links[toxic.direction].update(toxic.name)

    def remove_toxic(self, name: str) -> None:
        toxic = self.find_toxic(name)
        self.toxics.remove(toxic)
        for connection in list(self._connections):
            connection.links[toxic.direction].detach(name)

    def remove_all_toxics(self) -> None:
        for toxic in list(self.toxics):
            self.remove_toxic(toxic.name)


# --------------------------------------------------------------------------- HTTP API

JSON_TYPE = "application/json"
# Go's http.Error answers in plain text, whatever the handler set before.
TEXT_TYPE = "text/plain; charset=utf-8"
VERSION_TYPE = "application/json;charset=utf-8"
REQUEST_ID_HEADER = "X-Toxiproxy-Request-Id"
# Toxiproxy refuses browsers, so a web page cannot drive the API (a CSRF guard).
BROWSER_PREFIX = "Mozilla/"


def _json_reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=gojson.encode(data), status=status,
                        headers={"Content-Type": JSON_TYPE})  # fmt: skip


def _text_reply(text: str, status: int) -> web.Response:
    """Go's ``http.Error``: the text and a newline, as text/plain with nosniff."""
    headers = {"Content-Type": TEXT_TYPE, "X-Content-Type-Options": "nosniff"}
    return web.Response(body=f"{text}\n".encode(), status=status, headers=headers)


def _error_reply(exc: ApiError) -> web.Response:
    # Toxiproxy's apiError writes its JSON through http.Error: a JSON body, text/plain.
    body = gojson.encode({"error": exc.message, "status": exc.status}).decode()
    return _text_reply(body, exc.status)


def _request_id() -> str:
    # zerolog's hlog.RequestIDHandler stamps an xid: 12 bytes, base32hex, 20 characters.
    return base64.b32hexencode(os.urandom(12)).decode().rstrip("=").lower()


@web.middleware
async def _as_toxiproxy(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Toxiproxy's router and its middlewares, in their order.

    gorilla/mux runs route middlewares only on a match: an unknown path gets
    ``http.NotFound``'s text and a method not allowed an empty 405, with no request
    id. A match gets a request id, then browsers are refused, then the handler runs.
    """
    unmatched = request.match_info.http_exception
    if unmatched is not None:
        if unmatched.status == 405:
            return web.Response(status=405)
        return _text_reply("404 page not found", 404)
    request_id = _request_id()
    response: web.StreamResponse
    if request.headers.get("User-Agent", "").startswith(BROWSER_PREFIX):
        response = _text_reply("User agent not allowed", 403)
    else:
        try:
            response = await handler(request)
        except ApiError as exc:
            if exc.status >= 500:
                logger.warning("%s %s: %s", request.method, request.path, exc.message)
            response = _error_reply(exc)
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


@dataclass
class _ProxySpec:
    name: str
    listen: str
    upstream: str
    enabled: bool | None  # None: not given (populate's nullable field)


def _decode_proxy(body: gojson.Fields | None, current: _ProxySpec) -> _ProxySpec:
    """Decode a Proxy over ``current``, as Go decodes into a prefilled struct."""
    # The exported Logger field decodes too: only an object (or null) fits it.
    gojson.object_field(body, "Logger", "Proxy", "zerolog.Logger")
    return _ProxySpec(
        name=gojson.string_field(body, "name", "Proxy", current.name),
        listen=gojson.string_field(body, "listen", "Proxy", current.listen),
        upstream=gojson.string_field(body, "upstream", "Proxy", current.upstream),
        enabled=gojson.bool_field(body, "enabled", "Proxy", current.enabled),
    )


def _decode_proxy_body(raw: bytes, current: _ProxySpec) -> _ProxySpec:
    def decode() -> _ProxySpec:
        return _decode_proxy(gojson.struct_fields(gojson.decode(raw), "toxiproxy.Proxy"), current)

    spec: _ProxySpec = _decoded(decode)
    return spec


def _decode_populate(raw: bytes) -> list[_ProxySpec]:
    def decode() -> list[_ProxySpec]:
        items = gojson.decode(raw)
        if items is None:
            return []
        if not isinstance(items, list) or isinstance(items, gojson.Fields):
            raise gojson.DecodeError(f"json: cannot unmarshal {gojson.kind(items).split()[0]} "
                                     "into Go value of type []struct")  # fmt: skip
        blank = _ProxySpec("", "", "", None)
        return [_decode_proxy(gojson.struct_fields(item, "struct"), blank) for item in items]

    specs: list[_ProxySpec] = _decoded(decode)
    return specs


def _check_required(spec: _ProxySpec, where: str = "") -> None:
    if not spec.name:
        raise _missing_field(f"name{where}")
    if not spec.upstream:
        raise _missing_field(f"upstream{where}")


def _check_populate(specs: list[_ProxySpec]) -> None:
    """Toxiproxy's first populate phase: the whole request is checked before any change."""
    names: set[str] = set()
    for number, spec in enumerate(specs, start=1):
        _check_required(spec, f" at proxy {number}")
        if spec.name in names:
            # A plain Go error, not one of its API errors: a 500.
            raise _internal(f"duplicate proxy name {json.dumps(spec.name)}")
        names.add(spec.name)


class ToxiproxyServer:
    """The stand-in, in-process: ``port = await server.start(host, port)``; ``await stop()``."""

    def __init__(self) -> None:
        self._proxies: dict[str, _Proxy] = {}
        self._lock = asyncio.Lock()  # API changes that await (listen/stop) don't interleave
        self._runner: web.AppRunner | None = None
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> int:
        app = web.Application(middlewares=[_as_toxiproxy])
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        self._runner = runner
        sockname = runner.addresses[0]
        self.host, self.port = str(sockname[0]), int(sockname[1])
        logger.info("toxiproxy stand-in API on %s", self.url)
        return self.port

    async def stop(self) -> None:
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.stop()
            self._proxies.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _add_routes(self, app: web.Application) -> None:
        # gorilla/mux routes GET alone: HEAD is a 405 there, so no HEAD here either.
        def get(path: str, handler: Callable[[web.Request], Awaitable[web.Response]]) -> None:
            app.router.add_get(path, handler, allow_head=False)

        get("/version", self._version)
        app.router.add_post("/reset", self._reset)
        app.router.add_post("/populate", self._populate)
        get("/proxies", self._proxy_index)
        app.router.add_post("/proxies", self._proxy_create)
        get("/proxies/{proxy}", self._proxy_show)
        app.router.add_post("/proxies/{proxy}", self._proxy_update)
        app.router.add_patch("/proxies/{proxy}", self._proxy_update)
        app.router.add_delete("/proxies/{proxy}", self._proxy_delete)
        get("/proxies/{proxy}/toxics", self._toxic_index)
        app.router.add_post("/proxies/{proxy}/toxics", self._toxic_create)
        get("/proxies/{proxy}/toxics/{toxic}", self._toxic_show)
        app.router.add_post("/proxies/{proxy}/toxics/{toxic}", self._toxic_update)
        app.router.add_patch("/proxies/{proxy}/toxics/{toxic}", self._toxic_update)
        app.router.add_delete("/proxies/{proxy}/toxics/{toxic}", self._toxic_delete)

    def _proxy(self, request: web.Request) -> _Proxy:
        proxy = self._proxies.get(request.match_info["proxy"])
        if proxy is None:
            _fail(PROXY_NOT_FOUND)
        return proxy

    # ---- handlers

    async def _version(self, request: web.Request) -> web.Response:
        # Written by hand in Toxiproxy, with a space after the colon and a newline.
        body = f'{{"version": "{VERSION}"}}\n'.encode()
        return web.Response(body=body, headers={"Content-Type": VERSION_TYPE})

    async def _reset(self, request: web.Request) -> web.Response:
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.start()
                proxy.remove_all_toxics()
        return web.Response(status=204)

    async def _populate(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            specs = _decode_populate(raw)
            _check_populate(specs)
            async with self._lock:
                proxies = [await self._add_or_replace(spec) for spec in specs]
        except ApiError as exc:
            # Toxiproxy's populate reply: its error fields, then the (null) proxy list.
            payload = {"error": exc.message, "status": exc.status, "proxies": None}
            return _json_reply(payload, exc.status)
        # Go marshals an empty result list as null.
        return _json_reply({"proxies": [p.to_json() for p in proxies] or None}, 201)

    async def _add_or_replace(self, spec: _ProxySpec) -> _Proxy:
        existing = self._proxies.get(spec.name)
        if existing is not None:
            if existing.listen == spec.listen and existing.upstream == spec.upstream:
                return existing
            # Stopped first; it stays listed (stopped) if the new one cannot start.
            await existing.stop()
        proxy = await self._start_new(spec)
        self._proxies[spec.name] = proxy
        return proxy

    async def _start_new(self, spec: _ProxySpec) -> _Proxy:
        proxy = _Proxy(spec.name, spec.listen, spec.upstream)
        if spec.enabled is not False:
            await proxy.start()
        return proxy

    async def _proxy_index(self, request: web.Request) -> web.Response:
        # A Go map marshals with its keys sorted.
        return _json_reply({name: self._proxies[name].to_json() for name in sorted(self._proxies)})

    async def _proxy_create(self, request: web.Request) -> web.Response:
        spec = _decode_proxy_body(await request.read(), _ProxySpec("", "", "", True))
        _check_required(spec)
        async with self._lock:
            if spec.name in self._proxies:
                _fail(PROXY_EXISTS)
            proxy = await self._start_new(spec)
            self._proxies[spec.name] = proxy
        return _json_reply(proxy.to_json(), 201)

    async def _proxy_show(self, request: web.Request) -> web.Response:
        return _json_reply(self._proxy(request).to_json())

    async def _proxy_update(self, request: web.Request) -> web.Response:
        raw = await request.read()
        async with self._lock:
            proxy = self._proxy(request)
            current = _ProxySpec(proxy.name, proxy.listen, proxy.upstream, proxy.enabled)
            spec = _decode_proxy_body(raw, current)
            await proxy.update(spec.listen, spec.upstream, bool(spec.enabled))
        return _json_reply(proxy.to_json())

    async def _proxy_delete(self, request: web.Request) -> web.Response:
        async with self._lock:
            proxy = self._proxy(request)
            await proxy.stop()
            del self._proxies[proxy.name]
        return web.Response(status=204)

    async def _toxic_index(self, request: web.Request) -> web.Response:
        return _json_reply([t.to_json() for t in self._proxy(request).ordered_toxics()])

    async def _toxic_create(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = parse_new_toxic(await request.read(), proxy.has_toxic)
        proxy.add_toxic(toxic)
        return _json_reply(toxic.to_json())

    async def _toxic_show(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        return _json_reply(proxy.find_toxic(request.match_info["toxic"]).to_json())

    async def _toxic_update(self, request: web.Request) -> web.Response:
        proxy = self._proxy(request)
        toxic = proxy.find_toxic(request.match_info["toxic"])
        apply_toxic_update(toxic, await request.read())
        proxy.update_toxic(toxic)
        return _json_reply(toxic.to_json())

    async def _toxic_delete(self, request: web.Request) -> web.Response:
        self._proxy(request).remove_toxic(request.match_info["toxic"])
        return web.Response(status=204)


# --------------------------------------------------------------------------- running it


async def serve(host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM, printing the ``listening on`` line once accepting."""
    server = ToxiproxyServer()
    await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Parents (run_in_subprocess, loadtest/wan.py) wait for exactly this line.
    print(f"{LISTENING_PREFIX}{server.url}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        logger.info("shutting down")
        await server.stop()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Toxiproxy stand-in (HTTP API + TCP proxies)")
    parser.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8474, help="API port; 0 picks a free one")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stock asyncio loop")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    factory = None if args.no_uvloop else _loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.host, args.port))
    return 0


@contextlib.contextmanager
def run_in_subprocess(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout: float = 15.0,
    log_level: str = "INFO",
) -> Iterator[str]:
    """Run the stand-in as ``python -m loadtest.toxiproxy_server``; yield its API URL.

    For synchronous callers (pytest fixtures, the demo). The child's stderr is
    forwarded to this process's logging; the child is stopped by PID at exit
    (SIGTERM, then SIGKILL if it does not exit within 5 s).
    """
    cmd = [sys.executable, "-m", "loadtest.toxiproxy_server", "--host", host]
    cmd += ["--port", str(port), "--log-level", log_level]
    env = dict(os.environ)
    # The child must import `loadtest` even when the project is not installed.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    ) as proc:  # fmt: skip
        watcher = _StderrWatcher(proc)
        try:
            yield watcher.wait_for_url(startup_timeout)
        finally:
            _stop_process(proc)
            watcher.join()


class _StderrWatcher:
    """Reads a child's stderr on a thread: finds ``listening on URL``, forwards the rest."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc
        self._url: str | None = None
        self._ready = threading.Event()
        self._log = logging.getLogger(f"{__name__}.child")
        self._thread = threading.Thread(target=self._drain, name="toxiproxy-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        # Keep reading after startup too: a full pipe would block the child.
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            if self._url is None and line.startswith(LISTENING_PREFIX):
                self._url = line[len(LISTENING_PREFIX) :].strip()
                self._ready.set()
            else:
                self._log.info("[pid %s] %s", self._proc.pid, line)
        self._ready.set()  # EOF: the child is gone; unblock the waiter

    def wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if time.monotonic() > deadline:
                raise TimeoutError(f"toxiproxy stand-in did not start within {timeout} s")
        if self._url is None:
            raise RuntimeError(f"toxiproxy stand-in exited with code {self._proc.wait()}")
        return self._url

    def join(self) -> None:
        self._thread.join(timeout=5)


def _stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("pid %s ignored SIGTERM; killing it", proc.pid)
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
