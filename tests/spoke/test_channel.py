"""The channel between a spoke's processes: whole messages in order, descriptors passed,
the peer's exit noticed; and ``--workers`` as the spoke's command line reads it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from service.workers import machine_cpus
from spoke.config import (
    AUTO_WORKERS,
    choose_workers,
    config_from_args,
    parse_args,
    with_workers_chosen,
)
from spoke.workers.channel import MAX_MESSAGE_BYTES, Channel, channel_pair

Received = list[tuple[list[Any], list[int]]]


async def test_messages_arrive_whole_in_order_with_their_descriptors() -> None:
    left, right = channel_pair()
    got: Received = []
    closed = asyncio.Event()
    sender = Channel(left, lambda m, fds: None, lambda: None)
    receiver = Channel(right, lambda m, fds: got.append((m, fds)), closed.set)
    read_end, write_end = os.pipe()
    try:
        big = ["add", ["x" * 40] * 1000]  # ~43 KiB: one packet, never split
        for i in range(200):  # more than the socket buffer holds: sends queue, in order
            sender.send(big if i % 50 == 0 else ["n", i])
        sender.send(["fd"], [os.dup(write_end)])
        for _ in range(500):
            if got and got[-1][0] == ["fd"]:
                break
            await asyncio.sleep(0.01)
        assert [m for m, _ in got[:-1]] == [big if i % 50 == 0 else ["n", i] for i in range(200)]
        [(_, [fd])] = got[-1:]
        os.write(fd, b"through the passed descriptor")
        os.close(fd)
        assert os.read(read_end, 100) == b"through the passed descriptor"
        sender.close()
        await asyncio.wait_for(closed.wait(), 5)  # the peer's end is noticed
        assert receiver.closed
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        sender.close()
        receiver.close()


async def test_an_oversized_message_is_refused_before_sending() -> None:
    left, right = channel_pair()
    sender = Channel(left, lambda m, fds: None, lambda: None)
    receiver = Channel(right, lambda m, fds: None, lambda: None)
    try:
        with pytest.raises(ValueError, match="too large"):
            sender.send(["blob", b"x" * MAX_MESSAGE_BYTES])
    finally:
        sender.close()
        receiver.close()


BASE = ["serve", "--hub", "http://hub", "--cache-dir", "/tmp/c", "--capacity", "1GiB"]


def test_workers_default_to_auto_and_an_explicit_count_wins() -> None:
    default = config_from_args(parse_args(BASE, {}))
    auto = config_from_args(parse_args([*BASE, "--workers", "auto"], {}))
    assert default.workers == auto.workers == AUTO_WORKERS  # chosen once every flag is known
    assert with_workers_chosen(default)[0].workers == choose_workers(machine_cpus())[0]
    assert config_from_args(parse_args(BASE, {"HUBSPOKE_WORKERS": "3"})).workers == 3
    assert config_from_args(parse_args([*BASE, "--workers", "1"], {})).workers == 1


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_bad_worker_count_is_a_usage_error(value: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([*BASE, "--workers", value], {})
    assert exit_.value.code == 2


def test_workers_need_plain_http(tmp_path: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([*BASE, "--workers", "2", "--tls-cert", "c.pem", "--tls-key", "k.pem"], {})
    assert exit_.value.code == 2
