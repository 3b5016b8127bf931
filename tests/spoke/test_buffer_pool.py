"""BufferPool: a fill's buffer is reused only once nothing views it any more.

Readers hand views of a fill's buffer to the transport without copying; a
transport may still hold one (bytes not yet sent) after the fill is gone.
"""

from __future__ import annotations

import ctypes
import gc

from spoke.cache.flight import PAGE, BufferPool, Filling

LENGTH = 1 << 20


def _filled(pool: BufferPool, byte: int) -> Filling:
    fill = Filling(LENGTH, pool)
    fill.feed(bytes([byte]) * LENGTH)
    fill.finish()
    return fill


def _buffer_of(fill: Filling) -> bytearray | None:
    """The buffer a fill takes once bytes need a place."""
    assert len(fill.view) == fill.length
    return fill.buffer


def test_a_gone_fills_buffer_is_used_again() -> None:
    pool = BufferPool(4 * LENGTH)
    first = _filled(pool, 1)
    buffer_id = id(first.buffer)
    del first
    gc.collect()
    assert id(_buffer_of(Filling(LENGTH, pool))) == buffer_id


def test_a_buffer_still_viewed_is_not_handed_out_until_the_view_is_released() -> None:
    pool = BufferPool(4 * LENGTH)
    first = _filled(pool, 1)
    pending = first.take(0, 64 << 10)  # what a transport still holds, unsent
    assert pending is not None
    buffer_id = id(first.buffer)
    del first
    gc.collect()
    second = _filled(pool, 2)  # must not overwrite the bytes still to be sent
    assert id(second.buffer) != buffer_id
    assert bytes(pending) == bytes([1]) * (64 << 10)
    pending.release()  # sent: the buffer is free again
    assert id(_buffer_of(Filling(LENGTH, pool))) == buffer_id
    assert second.take(0, 1) is not None


def test_the_pool_keeps_no_more_than_its_limit() -> None:
    pool = BufferPool(2 * LENGTH)
    fills = [_filled(pool, i) for i in range(4)]
    del fills
    gc.collect()
    assert pool.pooled_bytes == 2 * LENGTH


def test_a_fills_bytes_start_on_a_page_and_stay_there_when_reused() -> None:
    pool = BufferPool(4 * LENGTH)
    for length in (LENGTH, 123):
        first = Filling(length, pool)
        view = first.view
        assert len(view) == length
        assert ctypes.addressof(ctypes.c_char.from_buffer(view)) % PAGE == 0
        del first, view
        gc.collect()
        again = Filling(length, pool)
        assert ctypes.addressof(ctypes.c_char.from_buffer(again.view)) % PAGE == 0
        assert len(again.view) == length


def test_a_fill_takes_its_buffer_only_when_bytes_need_a_place() -> None:
    pool = BufferPool(4 * LENGTH)
    fill = Filling(LENGTH, pool)  # a miss waiting for a fetch slot
    assert fill.buffer is None and pool.lent_bytes == 0
    fill.feed(b"x")
    assert fill.buffer is not None and pool.lent_bytes == LENGTH


def test_a_failed_attempt_gives_its_buffer_back_for_the_backoff() -> None:
    pool = BufferPool(4 * LENGTH)
    fill = Filling(LENGTH, pool)
    fill.feed(b"partial")
    assert fill.discard_attempt()
    assert fill.buffer is None and pool.lent_bytes == 0 and pool.pooled_bytes == LENGTH
    fill.feed(bytes([3]) * LENGTH)  # the retry takes one again, from the pool
    fill.finish()
    assert pool.pooled_bytes == 0 and fill.data() == bytes([3]) * LENGTH


def test_a_shortened_fill_keeps_its_buffer_size_for_the_pool() -> None:
    pool = BufferPool(4 * LENGTH)
    fill = Filling(LENGTH, pool)
    fill.shorten(123)
    assert len(fill.view) == 123 and pool.lent_bytes == LENGTH
    del fill
    gc.collect()
    assert pool.pooled_bytes == LENGTH and pool.lent_bytes == 0
