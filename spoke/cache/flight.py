"""SingleFlight: one in-flight call per key; everyone else waits on its result.

After groupcache's ``singleflight``. The call runs in its own task, so a waiter
that goes away (a loader hanging up) cancels nothing the others wait on. The
key is released as soon as the call finishes, so a failure reaches every waiter
of that flight and the next caller starts afresh: no poisoned entry.

:class:`Filling` is what a chunk flight fills while it runs: the chunk's bytes
land in it in order as they arrive from the hub, so waiters can send the part
they need before the rest has arrived, and learn the chunk's verdict at the end.
"""

from __future__ import annotations

import asyncio
import mmap
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from protocol.digests import Hasher, hasher
from service.buffers import address_of, has_views

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A chunk's bytes start on a page boundary inside their buffer (a bytearray's own
# data does not), so the store can write them with O_DIRECT as they are, no copy.
PAGE = mmap.PAGESIZE


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._flights: dict[K, asyncio.Task[V]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    def begin(self, key: K, call: Callable[[], Awaitable[V]]) -> tuple[asyncio.Task[V], bool]:
        """Start ``call`` unless a call for ``key`` runs; returns (its task, joined one)."""
        task = self._flights.get(key)
        if task is not None:
            return task, True
        task = asyncio.ensure_future(call())
        self._flights[key] = task
        task.add_done_callback(lambda t: self._release(key, t))
        return task, False

    async def do(self, key: K, call: Callable[[], Awaitable[V]]) -> tuple[V, bool]:
        """Run ``call`` once per key at a time; returns (result, joined an existing flight)."""
        task, joined = self.begin(key, call)
        return await asyncio.shield(task), joined

    def _release(self, key: K, task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is task:
            del self._flights[key]
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters may all have gone away


class BufferPool:
    """Chunk buffers to use again, up to ``limit_bytes`` of them.

    A new 4 MiB ``bytearray`` costs a zero-fill and a page fault per page (on some
    VMs far more than the copy it is for); a fill takes one from here instead, and
    its buffer comes back when the fill is gone. Readers send views of a fill's
    buffer without copying them, and a transport may still hold such a view after
    the fill is gone (bytes it has not sent yet): a buffer still viewed is not handed
    out again until the view is released.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.pooled_bytes = 0
        self.lent_bytes = 0  # held by fills now (taken and not given back)
        self._free: dict[int, list[bytearray]] = {}

    def take(self, length: int) -> bytearray:
        """A buffer with room for ``length`` bytes from a page boundary (see
        :func:`page_aligned`)."""
        self.lent_bytes += length
        free = self._free.get(length, [])
        for i in range(len(free) - 1, -1, -1):
            if not has_views(free[i]):
                self.pooled_bytes -= length
                return free.pop(i)
        return bytearray(length + PAGE)

    def give(self, buffer: bytearray) -> None:
        length = len(buffer) - PAGE  # counted, and kept, by the length it holds
        self.lent_bytes -= length
        if self.pooled_bytes + length <= self.limit_bytes:
            self._free.setdefault(length, []).append(buffer)
            self.pooled_bytes += length


def page_aligned(buffer: bytearray, length: int) -> memoryview:
    """``length`` bytes of ``buffer`` (at least ``length + PAGE`` long) from its first
    page boundary."""
    start = -address_of(buffer) % PAGE
    return memoryview(buffer)[start : start + length]


class Filling:
    """A chunk on its way from the hub: its bytes, in order, as far as they arrived.

    ``received`` bytes at the start of :attr:`buffer` belong to the current attempt.
    Readers :meth:`wait` for the bytes they need and :meth:`take` them; the first
    take marks the fill *handed out*, after which the attempt may no longer start
    over (a reader has bytes of it) and a failure must reach that reader as a cut
    connection. An attempt that fails before that is taken back at once
    (:meth:`discard_attempt`), not when the next one starts: no reader may take its
    bytes meanwhile. The fill ends :meth:`verified` (the bytes matched the manifest
    digest) or :meth:`fail`\\ ed; a reader must see the verdict before it sends the
    last bytes of its part, so an unverified chunk is never served as complete.
    Once verified, the fill serves readers from memory while the chunk is stored.
    Bytes below ``received`` are never rewritten once handed out, and a view from
    :meth:`take` stays valid as long as it is alive: the fill's buffer goes back to
    its pool when the fill is gone, but is not reused while anything views it.

    The buffer is taken when the first bytes need a place (:attr:`view`), and given
    back when an attempt is taken back: a fill waiting for a fetch slot or a retry's
    backoff holds no memory, so the chunk memory in use is bounded by the fetches
    running, not by the misses waiting (under faults those can be hundreds).

    A fill told :meth:`digesting` takes the chunk's digest as its bytes arrive, so its
    verdict is ready with its last byte: no hash of the whole chunk between that byte
    and the readers' last bytes (nor a pause of everything else on the loop meanwhile).
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_give_back",
        "_hashed_alg",
        "_hasher",
        "_pool",
        "_view",
        "_waiters",
        "buffer",
        "error",
        "handed_out",
        "length",
        "received",
        "verified",
    )

    def __init__(self, length: int, pool: BufferPool | None = None) -> None:
        self.length = length
        self._capacity = length  # what the buffer holds, even once the fill is shortened
        self._pool = pool
        self.buffer: bytearray | None = None
        self._view: memoryview | None = None
        self._give_back: Callable[[], object] | None = None
        self.received = 0
        self.handed_out = False
        self.verified = False
        self.error: Exception | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._hasher: Hasher | None = None
        self._hashed_alg = ""

    @property
    def done(self) -> bool:
        return self.verified or self.error is not None

    @property
    def view(self) -> memoryview:
        """The chunk's bytes, from a page boundary; the buffer is taken on first use."""
        if self._view is None:
            pool = self._pool
            buffer = pool.take(self._capacity) if pool else bytearray(self._capacity + PAGE)
            if pool is not None:
                self._give_back = weakref.finalize(self, pool.give, buffer)
            self.buffer = buffer
            self._view = page_aligned(buffer, self._capacity)[: self.length]
        return self._view

    def _drop_buffer(self) -> None:
        """Give the buffer back now (nothing of it was handed out)."""
        self._view = self.buffer = None
        if self._give_back is not None:
            self._give_back()  # at most once: the finalizer is dead after this
            self._give_back = None

    # -- the fetch's side ---------------------------------------------------

    def discard_attempt(self) -> bool:
        """The current attempt failed: take its bytes back, so that nobody is handed
        them while the next attempt waits its turn (a reader joining in between waits
        for that one's bytes). False when a reader has bytes of it already: then the
        attempt's failure is the fill's, and nothing is taken back."""
        if self.handed_out:
            return False
        self.received = 0
        self._hasher = None  # the next attempt's bytes are digested afresh
        self._drop_buffer()  # the backoff may be long; the next attempt takes one again
        return True

    def shorten(self, length: int) -> None:
        """Make the chunk ``length`` bytes, before any arrived: a chunk fetched before
        its object's size was known, which turned out to end inside it."""
        if self.received or self.handed_out or not 0 < length <= self.length:
            raise ValueError(f"cannot make a {self.length}-byte fill {length} bytes now")
        self.length = length
        if self._view is not None:
            self._view = self._view[:length]

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        end = self.received + len(data)
        if end > self.length:
            raise ValueError(f"{end} bytes for a {self.length}-byte chunk")
        self.view[self.received : end] = data
        self.advance(len(data))

    def space(self) -> memoryview:
        """Where the next bytes go (received in place, then :meth:`advance`)."""
        return self.view[self.received :]

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more arrived at the start of :meth:`space`."""
        if self._hasher is not None:
            self._hasher.update(self.view[self.received : self.received + nbytes])
        self.received += nbytes
        if self._waiters:
            self._wake()

    def digesting(self, alg: str) -> None:
        """Take the ``alg`` digest of this attempt's bytes as they arrive (of those
        here already at once), for :meth:`digest`."""
        running = hasher(alg)
        if self.received:
            running.update(self.view[: self.received])
        self._hasher, self._hashed_alg = running, alg

    def digest(self, alg: str) -> bytes | None:
        """The ``alg`` digest of the whole chunk if it was taken as the bytes arrived
        (see :meth:`digesting`) and they all did; else None."""
        if self._hasher is None or self._hashed_alg != alg or self.received != self.length:
            return None
        return self._hasher.digest()

    def finish(self) -> None:
        """All bytes arrived and passed verification."""
        self.verified = True
        self._wake()

    def fail(self, error: Exception) -> None:
        if not self.done:
            self.error = error
        self._wake()

    # -- the readers' side --------------------------------------------------

    async def wait(self, target: int) -> None:
        """Until ``target`` bytes arrived (or the chunk is verified); raises its error."""
        while True:
            if self.error is not None:
                raise self.error
            if self.received >= target or self.verified:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append((target, waiter))
            await waiter

    async def wait_verified(self) -> None:
        """Until the verdict; raises the fill's error if it failed."""
        await self.wait(self.length + 1)

    def take(self, start: int, stop: int) -> memoryview | None:
        """Bytes ``[start, stop)`` as far as they arrived, or None if none of them did."""
        stop = min(stop, self.received)
        if stop <= start:
            return None
        self.handed_out = True
        return self.view[start:stop]

    def data(self) -> bytes:
        """A copy of the whole (verified) chunk."""
        return bytes(self.view)

    def _wake(self) -> None:
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for target, waiter in self._waiters:
            if waiter.done():
                continue
            if self.received >= target or self.done:
                waiter.set_result(None)
            else:
                keep.append((target, waiter))
        self._waiters = keep
