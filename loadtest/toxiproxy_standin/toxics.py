"""Toxics: their configuration, its JSON, and what each does to a stream (per link)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loadtest.toxiproxy_standin import gojson
from loadtest.toxiproxy_standin.errors import (
    INVALID_STREAM,
    INVALID_TOXIC_TYPE,
    TOXIC_EXISTS,
    bad_request,
    fail,
)

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
STREAMS = (UPSTREAM, DOWNSTREAM)

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


def decoded(decode: Callable[[], Any]) -> Any:
    """Run a decode step; Go's decode errors are 400 "bad request body"."""
    try:
        return decode()
    except gojson.DecodeError as exc:
        raise bad_request(str(exc)) from exc


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

    body, name, toxic_type, stream, toxicity = decoded(wrapper)
    if stream.lower() not in STREAMS:
        fail(INVALID_STREAM)
    name = name or f"{toxic_type}_{stream}"
    if toxic_type not in TOXIC_ATTRIBUTES:
        fail(INVALID_TOXIC_TYPE)
    if exists(name):
        fail(TOXIC_EXISTS)
    attributes = decoded(lambda: _decode_attributes(toxic_type, body, TOXIC_ATTRIBUTES[toxic_type]))
    return Toxic(name, toxic_type, stream, toxicity, attributes)


def apply_toxic_update(toxic: Toxic, raw: bytes) -> None:
    """Decode a toxic-update body as Toxiproxy's UpdateToxicJson: attributes and
    toxicity only (name, type and stream are fixed); nothing changes on an error."""

    def decode() -> tuple[dict[str, int], float]:
        body = gojson.struct_fields(gojson.decode(raw), "struct")
        attributes = _decode_attributes(toxic.type, body, toxic.attributes)
        toxicity = gojson.float32_field(body, "toxicity", "struct", toxic.toxicity)
        return attributes, toxicity

    toxic.attributes, toxic.toxicity = decoded(decode)


@dataclass(slots=True)
class Chunk:
    data: bytes | memoryview  # a view of a receive buffer (see ReceiveBuffers)
    stamp: float  # loop time the data was read (latency toxics push it forward)


class Resettable(Protocol):
    def reset(self) -> None: ...


class Link(Protocol):
    """What a toxic asks of the link it acts on (:class:`loadtest.toxiproxy_standin.link.Link`;
    a protocol here, so that this module needs nothing of the data plane)."""

    @property
    def connection(self) -> Resettable: ...

    async def through(self, chain: tuple[Runtime, ...], index: int, chunk: Chunk) -> None: ...

    async def finish_through(self, chain: Sequence[Runtime]) -> None: ...

    async def pause(self, seconds: float) -> None: ...

    def close_from(self, index: int) -> None: ...

    def close_after(self, runtime: Runtime) -> None: ...


class Outlet:
    """Where a toxic sends its output: the rest of the link's chain after it."""

    __slots__ = ("_chain", "_index", "_link")

    def __init__(self, link: Link, chain: tuple[Runtime, ...], index: int) -> None:
        self._link = link
        self._chain = chain
        self._index = index

    async def emit(self, chunk: Chunk) -> None:
        await self._link.through(self._chain, self._index, chunk)

    async def close(self) -> None:
        """End the stream here: later toxics see EOF, then the destination is closed."""
        await self._link.finish_through(self._chain[self._index :])


class Runtime:
    """One toxic on one link (one connection, one direction): per-connection state."""

    def __init__(self, toxic: Toxic, link: Link) -> None:
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

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
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


class _Latency(Runtime):
    def _sample(self) -> float:
        delay = self.attr("latency")
        jitter = self.attr("jitter")
        if jitter > 0:
            # Go's rand.Int63n(2 * jitter) - jitter: from -jitter up to jitter - 1.
            delay += random.randrange(-jitter, jitter)
        return delay / 1000.0

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
        delay, generation = self._sample(), self.generation

        def due() -> float | None:
            if self.generation != generation:
                return None  # run again: what it holds goes out now (see Runtime.updated)
            return chunk.stamp + delay

        # Release at read time + delay: a delay line, so queued chunks don't add up.
        await self.hold_until(due)
        if self.engaged and self.generation == generation:
            # Pushing the stamp forward makes chained latency toxics add up.
            chunk = Chunk(chunk.data, chunk.stamp + delay)
        await out.emit(chunk)


class _Bandwidth(Runtime):
    def __init__(self, toxic: Toxic, link: Link) -> None:
        super().__init__(toxic, link)
        self._free_at = 0.0  # when the emulated wire finishes the previous bytes

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
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


class _SlowClose(Runtime):
    async def eof(self) -> None:
        loop = asyncio.get_running_loop()
        start, generation = loop.time(), self.generation

        def due() -> float:
            nonlocal start, generation
            if generation != self.generation:  # run again: the delay starts over
                start, generation = loop.time(), self.generation
            return start + self.attr("delay") / 1000.0

        await self.hold_until(due)


class _Timeout(Runtime):
    """Drops all data; closes the stream once ``timeout`` ms pass with no data (0 = never).

    As Toxiproxy's, whose loop waits on a fresh ``time.After(timeout)`` next to its
    input: the countdown starts when the toxic starts acting (connection start,
    being added, updated, or a neighbour changing) and starts over with every
    chunk that reaches it. Once its input has ended that loop never waits again,
    so the countdown stops and the stream stays open until the toxic goes.
    Removing the toxic closes the connections it was holding (its Cleanup).
    """

    def __init__(self, toxic: Toxic, link: Link) -> None:
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

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
        # Data is dropped on the floor while the toxic is active, and restarts the countdown.
        self._arm()

    async def eof(self) -> None:
        self._ended = True
        self.stopped()
        loop = asyncio.get_running_loop()
        # Held until the toxic is removed or rolls inactive (hold_until returns then).
        await self.hold_until(lambda: loop.time() + HOLD_RECHECK_S)


class _ResetPeer(Runtime):
    """On the first data in its stream, drops it, waits ``timeout`` ms, then resets (TCP RST).

    Toxiproxy waits on a bare ``time.After`` there, which nothing interrupts: once
    the data has come, removing or changing the toxic no longer stops the reset.
    """

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.attr("timeout") / 1000.0
        while (remaining := deadline - loop.time()) > 0:
            await self.link.pause(remaining)  # a toxic change wakes it: sleep on
        self.link.connection.reset()


class _LimitData(Runtime):
    def __init__(self, toxic: Toxic, link: Link) -> None:
        super().__init__(toxic, link)
        self._passed = 0  # per connection, kept across updates like Toxiproxy's state

    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
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


class _Slicer(Runtime):
    async def pipe(self, chunk: Chunk, out: Outlet) -> None:
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


RUNTIMES: dict[str, type[Runtime]] = {
    "noop": Runtime,
    "latency": _Latency,
    "bandwidth": _Bandwidth,
    "slow_close": _SlowClose,
    "timeout": _Timeout,
    "reset_peer": _ResetPeer,
    "limit_data": _LimitData,
    "slicer": _Slicer,
}
