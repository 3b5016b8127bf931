"""hub.store.plain.QuickResponse on real sockets: the head of a store's answer read in one
pass, the body left to http.client, and anything but a plain HTTP/1.x head refused (the
fill then goes botocore's way, tests/hub_s3/test_s3_fills.py).

The store's side is bytes written to one end of a socket pair; the hub's GETs to a real
store go through it in every test of this directory.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.client import HTTPException, HTTPResponse, RemoteDisconnected

import pytest

from hub.store.plain import QuickResponse
from protocol.http1 import MAX_RESPONSE_HEAD_BYTES

BODY = b"0123456789" * 10
RANGE_HEAD = (
    b"HTTP/1.1 206 Partial Content\r\n"
    b"Accept-Ranges: bytes\r\n"
    b"Content-Length: 100\r\n"
    b"Content-Range: bytes 0-99/1000\r\n"
    b'Etag: "0123456789abcdef"\r\n'
    b"Last-Modified: Wed, 02 Dec 2026 08:00:00 GMT\r\n"
    b"x-amz-version-id: v1\r\n"
    b"\r\n"
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    store, hub = socket.socketpair()
    yield store, hub
    store.close()
    hub.close()


def answer_to(pair: tuple[socket.socket, socket.socket], raw: bytes,
              cls: type[HTTPResponse] = QuickResponse) -> HTTPResponse:
    store, hub = pair

    def send() -> None:  # in a thread: a head larger than the socket's buffer
        # OSError: the reader refused the head and shut its end.
        with contextlib.suppress(OSError):
            store.sendall(raw)
            store.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        response = cls(hub, method="GET")
        response.begin()
    except BaseException:
        hub.shutdown(socket.SHUT_RDWR)
        raise
    finally:
        sender.join(timeout=30)
    return response


def test_a_range_answer_reads_as_http_client_reads_it(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    quick = answer_to(pair, RANGE_HEAD + BODY)
    other = socket.socketpair()
    try:
        reference = answer_to(other, RANGE_HEAD + BODY, HTTPResponse)
    finally:
        for sock in other:
            sock.close()
    for name in ("Content-Range", "content-range", "ETag", "Content-Length", "Last-Modified",
                 "x-amz-version-id", "X-Amz-Version-Id", "x-missing"):
        assert quick.headers.get(name) == reference.headers.get(name), name
    assert (quick.status, quick.length, quick.chunked, quick.will_close) == \
        (reference.status, reference.length, reference.chunked, reference.will_close) == \
        (206, 100, False, False)
    assert quick.read() == BODY
    assert quick.isclosed()  # read to its end: the connection may serve another GET


@pytest.mark.parametrize(("fields", "will_close"), [
    (b"Content-Length: 100\r\nConnection: close\r\n", True),
    (b"Content-Length: 100\r\nConnection: keep-alive\r\n", False),
    (b"Transfer-Encoding: chunked\r\n", False),
    (b"", True),  # no length: the body ends with the connection
])
def test_the_connection_is_kept_only_when_the_body_is_framed_and_kept_alive(
    pair: tuple[socket.socket, socket.socket], fields: bytes, will_close: bool,
) -> None:
    response = answer_to(pair, b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n")
    assert response.will_close is will_close
    assert response.chunked is (b"chunked" in fields)
    assert response.length == (100 if b"Content-Length" in fields else None)


def test_an_http_1_0_answer_closes_its_connection(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    response = answer_to(pair, b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert response.will_close and response.version == 10


def test_an_answer_without_a_body_has_none_whatever_its_length_says(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    response = answer_to(pair, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n")
    assert response.length == 0 and not response.will_close
    assert response.read() == b""


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 206 Partial Content\nContent-Length: 1\n\n",  # bare LF
    b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\n\r\n",  # obs-fold
    b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",  # an interim answer to a GET
    b"HTTP/2 200\r\n\r\n",
    b"\r\n",
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * MAX_RESPONSE_HEAD_BYTES + b"\r\n\r\n",
])
def test_a_head_that_is_not_plain_http_1_is_an_http_exception(
    pair: tuple[socket.socket, socket.socket], raw: bytes,
) -> None:
    with pytest.raises(HTTPException):
        answer_to(pair, raw)


@pytest.mark.parametrize("raw", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"])
def test_a_store_that_closes_before_the_end_of_the_head_is_disconnected(
    pair: tuple[socket.socket, socket.socket], raw: bytes,
) -> None:
    with pytest.raises(RemoteDisconnected):
        answer_to(pair, raw)
