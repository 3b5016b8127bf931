"""Membership (spoke.tier.membership): static and DNS members, a breaker each, and where
keys go while a member is down and once it is back. A fake clock and a fake resolver here;
the tests with real spokes are in test_tier_*."""

from __future__ import annotations

import argparse
import socket

import pytest

from protocol.placement import chunk_key, rank
from spoke.tier.membership import PEER_FAILURE_THRESHOLD, PEER_RESET_S, Membership, resolve
from spoke.tier.peers_arg import PeerSource, parse_advertise, parse_peers

SELF = "http://10.0.0.1:8701"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_peers_parse_as_urls_and_dns_names_and_bad_ones_are_refused() -> None:
    assert parse_peers("") == ()
    assert parse_peers("http://a:1, https://b:2/") == (PeerSource("http://a:1"),
                                                       PeerSource("https://b:2"))
    assert parse_peers("dns+http://spokes.ns.svc:8701") == (
        PeerSource("http://spokes.ns.svc:8701", dns=True),)
    for bad in ("ftp://a:1", "http://", "http://a:1/path", "http://a:1?x=1", "dns+http://n",
                "http://a:1,http://a:1", "http://a:99999", "a:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_peers(bad)
    assert parse_advertise("http://10.1.2.3:8701") == "http://10.1.2.3:8701"


async def test_a_dns_name_becomes_one_member_per_address_and_follows_its_answers() -> None:
    answers: list[list[str] | OSError] = [["10.0.0.2", "10.0.0.1"],
                                          ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                                          OSError("no such name"), ["10.0.0.3"]]

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("spokes.ns.svc", 8701)
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    m = Membership(parse_peers("dns+http://spokes.ns.svc:8701"), SELF, 1.0, refresh_s=5,
                   resolver=resolver)
    await m.refresh()
    assert set(m.members) == {"http://10.0.0.2:8701"}  # itself is not its own peer
    await m.refresh()
    assert set(m.members) == {"http://10.0.0.2:8701", "http://10.0.0.3:8701"}
    await m.refresh()  # a failed look-up keeps what it had
    assert set(m.members) == {"http://10.0.0.2:8701", "http://10.0.0.3:8701"}
    assert m.resolve_errors == 1
    await m.refresh()  # a pod gone from the answer leaves the tier
    assert set(m.members) == {"http://10.0.0.3:8701"}


async def test_names_are_resolved_by_getaddrinfo() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "127.0.0.1" in await resolve("localhost", port)


def test_a_down_member_gives_its_keys_to_their_next_choice_and_gets_them_back() -> None:
    clock = Clock()
    peers = parse_peers("http://10.0.0.1:8701,http://10.0.0.2:8701,http://10.0.0.3:8701")
    m = Membership(peers, SELF, 1.0, refresh_s=5, clock=clock)
    keys = [("ds/x", "v", i) for i in range(300)]
    full = {u: 1.0 for u in [SELF, "http://10.0.0.2:8701", "http://10.0.0.3:8701"]}
    before = {k: m.candidates(*k) for k in keys}
    assert all(before[k] == rank(full, chunk_key(*k)) for k in keys)
    gone = m.members["http://10.0.0.3:8701"]
    for _ in range(PEER_FAILURE_THRESHOLD):
        gone.breaker.on_failure()
    assert not gone.live and m.down() == {"http://10.0.0.2:8701": 0, "http://10.0.0.3:8701": 1}
    for k in keys:
        ranked = before[k]
        assert m.candidates(*k) == [u for u in ranked if u != gone.url]
    assert m.shares()[gone.url] == 0.0
    clock.now += PEER_RESET_S  # cooled down: a probe may go, and its keys are offered again
    assert gone.live
    assert all(m.candidates(*k) == before[k] for k in keys)
    gone.breaker.before_call()  # the probe is under way: until it answers, keys go on
    assert not gone.live and m.candidates(*keys[0]) == [u for u in before[keys[0]]
                                                        if u != gone.url]
    gone.breaker.on_success()
    assert all(m.candidates(*k) == before[k] for k in keys)
    assert abs(m.shares()[gone.url] - 1 / 3) < 0.05


def test_weights_come_from_capacity() -> None:
    m = Membership(parse_peers("http://10.0.0.2:8701"), SELF, 100.0, refresh_s=5)
    assert m.weights() == {SELF: 100.0, "http://10.0.0.2:8701": 100.0}  # until told
    m.members["http://10.0.0.2:8701"].weight = 300.0
    assert abs(m.shares()["http://10.0.0.2:8701"] - 0.75) < 0.03
