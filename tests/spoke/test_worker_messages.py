"""The owner↔reader-worker messages: every kind survives the wire as the same record,
and anything that is not one of them is one error, BadMessage, which a channel drops
(logged, its descriptors closed) without stopping."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, get_args

import msgpack
import pytest

from spoke.cache.integrity import Expected
from spoke.workers.channel import Channel, channel_pair, receiving
from spoke.workers.messages import (
    BadMessage,
    ChunksAdded,
    ChunksGone,
    ChunksSuspect,
    ChunksVerified,
    HandedOver,
    HangUps,
    HitsCounted,
    ManifestFresh,
    ManifestGone,
    ManifestUnknown,
    ManifestWanted,
    Message,
    Ready,
    S3Counted,
    S3HandedOver,
    Sync,
    Synced,
    ToldChunk,
    decode,
    encode,
)

DIGEST = bytes(range(16))
EVERY_KIND: list[Message] = [
    ManifestFresh("d/obj", b'{"size": 3}', 12.5),
    ManifestGone("d/obj"),
    ManifestUnknown("d/obj"),
    ChunksAdded([ToldChunk("v1-0", Expected(65536, "xxh3-128", DIGEST)),
                 ToldChunk("v1-1", Expected(7, "sha256", b""))]),
    ChunksAdded([]),
    ChunksGone(["v1-0", "v1-1"]),
    Sync(7),
    Ready(),
    HandedOver(b"GET /objects/d/obj HTTP/1.1\r\n"),
    S3HandedOver(b"GET /d/obj HTTP/1.1\r\n"),
    HitsCounted({"v1-0": 3, "v1-1": 1}, 65543, [0, 2, 1], 0.25, ["d/obj"]),
    S3Counted({"GetObject": 3}, [0, 2, 1], 0.25),
    HangUps(2),
    ChunksVerified(1, 65536),
    ChunksSuspect(["v1-1"]),
    Synced(7),
    ManifestWanted("d/obj", 65536),
    ManifestWanted("d/obj", None),
]


def _wire(raw: Any) -> Any:
    """What the receiving end unpacks of ``raw``."""
    return msgpack.unpackb(msgpack.packb(raw, use_bin_type=True), raw=False)


def test_the_table_holds_every_kind() -> None:
    assert {type(m) for m in EVERY_KIND} == set(get_args(Message))


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_kind_comes_back_as_the_same_record(message: Message) -> None:
    back = decode(_wire(encode(message)))
    assert type(back) is type(message)
    assert back == message
    if isinstance(back, ChunksAdded):
        assert all(type(c) is ToldChunk and type(c.expected) is Expected for c in back.chunks)


def test_a_whole_number_where_a_number_belongs_comes_back_a_float() -> None:
    back = decode(_wire(["manifest", "d/obj", b"{}", 12]))
    assert back == ManifestFresh("d/obj", b"{}", 12.0)
    assert isinstance(back, ManifestFresh) and type(back.expires_at) is float


MALFORMED: list[tuple[str, Any]] = [
    ("not a list", {"kind": "ready"}),
    ("a string", "ready"),
    ("nothing", None),
    ("a tuple", ("ready",)),
    ("empty", []),
    ("unknown kind", ["explode", 1]),
    ("kind not a string", [3, "x"]),
    ("kind unhashable", [["ready"]]),
    ("too few fields", ["manifest", "d/obj", b"{}"]),
    ("too many fields", ["ready", 1]),
    ("no fields", ["gone"]),
    ("bytes for a string", ["gone", b"d/obj"]),
    ("string for bytes", ["conn", "GET /"]),
    ("bool for an integer", ["sync", True]),
    ("float for an integer", ["synced", 1.0]),
    ("string for a number", ["manifest", "d/obj", b"{}", "soon"]),
    ("names not a list", ["drop", "v1-0"]),
    ("a name not a string", ["drop", ["v1-0", 1]]),
    ("counts not integers", ["hits", {}, 0, [1, 0.5], 0.0, []]),
    ("a hit count not an integer", ["hits", {"v1-0": "3"}, 0, [], 0.0, []]),
    ("a hit key not a string", ["hits", {1: 3}, 0, [], 0.0, []]),
    ("hits not a map", ["hits", [["v1-0", 3]], 0, [], 0.0, []]),
    ("string for bytes, S3", ["s3conn", "GET /"]),
    ("S3 requests not a map", ["s3hits", [["GetObject", 1]], [], 0.0]),
    ("an S3 count not an integer", ["s3hits", {"GetObject": 1.0}, [], 0.0]),
    ("offset a string", ["want", "d/obj", "0"]),
    ("a chunk flat", ["add", [["v1-0", 7, "sha256", b""]]]),
    ("a chunk short", ["add", [["v1-0", [7, "sha256"]]]]),
    ("a chunk not a list", ["add", ["v1-0"]]),
    ("a chunk's size a string", ["add", [["v1-0", ["7", "sha256", b""]]]]),
    ("a chunk's digest a string", ["add", [["v1-0", [7, "sha256", "ab"]]]]),
    ("a chunk's name bytes", ["add", [[b"v1-0", [7, "sha256", b""]]]]),
]


@pytest.mark.parametrize("raw", [raw for _, raw in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_anything_else_is_a_bad_message(raw: Any) -> None:
    with pytest.raises(BadMessage):
        decode(raw)


async def test_a_channel_drops_a_bad_message_closes_its_descriptors_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    left, right = channel_pair()
    got: list[Message] = []
    arrived = asyncio.Event()

    def on_record(message: Message, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        got.append(message)
        arrived.set()

    sender = Channel(left, lambda m, fds: None, lambda: None)
    receiver = Channel(right, receiving(on_record), lambda: None)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # a descriptor left open fails the read, not hangs it
    try:
        with caplog.at_level(logging.ERROR, logger="spoke.workers.channel"):
            sender.send(["conn", "not bytes"], [os.dup(write_end)])
            sender.send(encode(Ready()))
            await asyncio.wait_for(arrived.wait(), 5)
        assert got == [Ready()]
        assert "dropping a bad channel message" in caplog.text
        os.close(write_end)
        write_end = -1
        assert os.read(read_end, 1) == b""  # the bad message's descriptor was closed
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        sender.close()
        receiver.close()
