"""What the zero-copy paths need to know about a Python buffer, and cannot ask directly.

A chunk's bytes, or a proxied read, go to sockets and disks as views of a buffer
that is used again afterwards. Reusing it is safe only once no view of it is alive,
and an ``O_DIRECT`` write from it needs its address aligned.
"""

from __future__ import annotations

import ctypes


def address_of(buffer: bytearray | memoryview) -> int:
    """Where a writable buffer's first byte is in memory; TypeError for a read-only
    one, ValueError for an empty one."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def has_views(buffer: bytearray) -> bool:
    """Whether a memoryview of ``buffer`` is alive: a bytearray cannot change size
    then, so a pop refuses. Without views the pop and append cost nothing (no
    reallocation for one byte)."""
    if not buffer:
        return False
    try:
        last = buffer.pop()
    except BufferError:
        return True
    buffer.append(last)
    return False
