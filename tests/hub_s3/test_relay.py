"""hub.relay on real sockets: a range goes whole from a store's body to the client, or
cut at the store's fault, never padded and never with bytes the store did not give.

The store's side is a stand-in object over a socket pair (a fake store in a unit test);
the hub's servers relay through it in tests/hub_s3/test_s3_serving.py.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from hub.relay import RELAY_BLOCK_BYTES, StoreCut, relay_blocking

DATA = os.urandom(RELAY_BLOCK_BYTES * 2 + 12345)  # more than one relay buffer


class Received:
    """Everything the client end of a socket pair gets, read in a thread to its EOF."""

    def __init__(self, sock: socket.socket) -> None:
        self.data = bytearray()
        self._sock = sock
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while block := self._sock.recv(1 << 16):
            self.data += block

    def result(self) -> bytes:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()
        return bytes(self.data)


class FakeBody:
    """A store's GET of ``DATA``: by readinto, or (``splice``) on a socket pair."""

    def __init__(self, splice: bool, fail_at: int | None = None) -> None:
        self.splice = splice
        self.fail_at = fail_at  # readinto fails there; a splice's body ends there
        self.moved_called = False
        self._writer: threading.Thread | None = None
        self.hub_end: socket.socket | None = None

    def readinto(self, offset: int, view: memoryview) -> None:
        if self.fail_at is not None and offset + len(view) > self.fail_at:
            raise ConnectionResetError("the store cut its body")
        view[:] = DATA[offset:offset + len(view)]

    def socket_body(self, offset: int, count: int) -> tuple[bytes, int, float | None] | None:
        if not self.splice:
            return None
        hub_end, store_end = socket.socketpair()
        hub_end.setblocking(False)
        stop = offset + count if self.fail_at is None else self.fail_at
        ahead = DATA[offset:offset + 1000]  # what reading the headers took in

        def send() -> None:
            with store_end:
                store_end.sendall(DATA[offset + len(ahead):stop])

        self._writer = threading.Thread(target=send, daemon=True)
        self._writer.start()
        self.hub_end = hub_end
        return ahead, os.dup(hub_end.fileno()), 30.0

    def moved(self) -> None:
        self.moved_called = True


def relay(body: FakeBody, offset: int, count: int) -> tuple[int | BaseException, bytes]:
    hub_side, client_side = socket.socketpair()
    hub_side.setblocking(False)
    received = Received(client_side)
    try:
        outcome: int | BaseException = relay_blocking(
            os.dup(hub_side.fileno()), body, offset, count, threading.Event())
    except (StoreCut, ConnectionResetError) as exc:
        outcome = exc
    finally:
        hub_side.close()
    try:
        return outcome, received.result()
    finally:
        client_side.close()
        if body.hub_end is not None:
            body.hub_end.close()


@pytest.mark.parametrize("splice", [False, True], ids=["readinto", "splice"])
def test_a_range_arrives_whole_and_exact(splice: bool) -> None:
    body = FakeBody(splice)
    sent, got = relay(body, 7, len(DATA) - 7)
    assert sent == len(DATA) - 7 and got == DATA[7:]
    assert body.moved_called == splice


def test_a_block_the_store_cannot_fill_is_not_sent_at_all() -> None:
    outcome, got = relay(FakeBody(False, fail_at=RELAY_BLOCK_BYTES + 10), 0, len(DATA))
    assert isinstance(outcome, ConnectionResetError)
    assert got == DATA[:RELAY_BLOCK_BYTES]  # the whole first block, nothing of the next


def test_a_spliced_body_that_ends_short_cuts_the_answer() -> None:
    body = FakeBody(True, fail_at=RELAY_BLOCK_BYTES + 10)
    outcome, got = relay(body, 0, len(DATA))
    assert isinstance(outcome, StoreCut)
    assert got == DATA[:RELAY_BLOCK_BYTES + 10] and not body.moved_called
