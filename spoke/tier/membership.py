"""Who is in the tier, who of them answers, and which of them owns a chunk.

Members come from ``--peers``: base URLs as given, and for a ``dns+http://NAME:PORT``
entry one member per address the name resolves to (a Kubernetes headless Service answers
one per ready pod), looked up again every ``refresh_s``. This spoke is always a member,
under its ``--advertise`` URL. Each other member has a circuit breaker
(:class:`spoke.upstream.resilience.CircuitBreaker`): one that failed repeatedly is down,
and the keys it owns go to each key's next choice (:mod:`protocol.placement`) until a
probe through the half-open breaker succeeds; then it gets its share back. A member's
weight is its capacity, as its ``/peer/info`` says.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from protocol.placement import chunk_key, rank, sample_keys, shares
from spoke.tier.peers_arg import PeerSource
from spoke.upstream.resilience import CLOSED, HALF_OPEN, OPEN, CircuitBreaker

logger = logging.getLogger(__name__)

# Keys a /stats snapshot estimates the members' shares with (exact enough to a percent).
_SHARE_SAMPLE = sample_keys(4096)
# Peers are on the LAN: a few failures in a row mean it is gone, not that the link is sick.
PEER_FAILURE_THRESHOLD = 3
PEER_RESET_S = 1.0
PEER_MAX_RESET_S = 10.0

Resolver = Callable[[str, int], Awaitable[list[str]]]
Probe = Callable[[str], Awaitable[int | None]]


@dataclass
class Member:
    """Another spoke of the tier, as this one sees it."""

    url: str
    breaker: CircuitBreaker
    # Its capacity in bytes as last told; until then this spoke's own (equal shares).
    weight: float
    fetches: int = 0  # chunk fetches it answered
    bytes: int = 0
    errors: int = 0  # fetches that failed (status, timeout, connection, bad digest)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Whether keys go to it now: not down, or down long enough for one probe."""
        return self.breaker.would_admit()

    @property
    def state(self) -> str:
        return {CLOSED: "up", OPEN: "down", HALF_OPEN: "probing"}[self.breaker.state]


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (getaddrinfo runs in the loop's executor)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class Membership:
    def __init__(
        self, sources: Sequence[PeerSource], self_url: str, self_weight: float, *,
        refresh_s: float, resolver: Resolver = resolve,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sources = tuple(sources)
        self.self_url = self_url
        self.self_weight = self_weight
        self.refresh_s = refresh_s
        self._resolver = resolver
        self._clock = clock
        self.members: dict[str, Member] = {}
        self.resolve_errors = 0
        self._shares_of: tuple[tuple[tuple[str, float], ...], dict[str, float]] | None = None
        self._set({s.url for s in self.sources if not s.dns})

    def _set(self, urls: set[str]) -> None:
        urls.discard(self.self_url)
        for url in list(self.members):
            if url not in urls:
                logger.info("peer %s left the tier", url)
                del self.members[url]
        for url in sorted(urls - self.members.keys()):
            logger.info("peer %s joined the tier", url)
            self.members[url] = Member(url, CircuitBreaker(
                failure_threshold=PEER_FAILURE_THRESHOLD, reset_timeout_s=PEER_RESET_S,
                max_reset_timeout_s=PEER_MAX_RESET_S, clock=self._clock), self.self_weight)

    async def refresh(self) -> None:
        """Look the DNS entries up again; a failed look-up keeps the members it had."""
        urls = {s.url for s in self.sources if not s.dns}
        for source in self.sources:
            if not source.dns:
                continue
            try:
                addresses = await self._resolver(source.host, source.port)
            except OSError as exc:
                self.resolve_errors += 1
                logger.warning("cannot resolve peers %s: %s", source.host, exc)
                urls |= {u for u in self.members if urlsplit(u).port == source.port}
                continue
            urls |= {_url(source.scheme, a, source.port) for a in addresses}
        self._set(urls)

    def weights(self, live_only: bool = True) -> dict[str, float]:
        """Every member's weight, this spoke's included; only the live ones by default."""
        weights = {self.self_url: self.self_weight}
        for url, m in self.members.items():
            if m.live or not live_only:
                weights[url] = m.weight
        return weights

    def candidates(self, path: str, version: str, index: int) -> list[str]:
        """The live members best first for the chunk: its owner, then its next choices."""
        if not self.members:
            return [self.self_url]
        return rank(self.weights(), chunk_key(path, version, index))

    def owns(self, path: str, version: str, index: int) -> bool:
        """Whether this spoke owns the chunk among the live members."""
        return self.candidates(path, version, index)[0] == self.self_url

    def _owned(self) -> dict[str, float]:
        """The live members' shares, estimated once per set of live members and weights
        (a few thousand hashes: not on every scrape)."""
        weights = self.weights()
        key = tuple(sorted(weights.items()))
        if self._shares_of is None or self._shares_of[0] != key:
            self._shares_of = (key, shares(weights, _SHARE_SAMPLE))
        return self._shares_of[1]

    def shares(self) -> dict[str, float]:
        """Each member's share of the keys among the live members (0 for a down one)."""
        owned = self._owned()
        return {url: owned.get(url, 0.0) for url in self.weights(live_only=False)}

    def down(self) -> dict[str, int]:
        """1 for each other member whose breaker keeps keys off it now, else 0."""
        return {url: int(not m.live) for url, m in self.members.items()}

    def snapshot(self) -> list[dict[str, object]]:
        """The ``peers`` of ``/stats``: each member's URL, state and share of the keys."""
        owned = self._owned()
        rows: list[dict[str, object]] = [{
            "url": self.self_url, "state": "self", "share": owned.get(self.self_url, 0.0),
            "weight": self.self_weight,
        }]
        for url, m in sorted(self.members.items()):
            rows.append({"url": url, "state": m.state, "share": owned.get(url, 0.0),
                         "weight": m.weight, "fetches": m.fetches, "bytes": m.bytes,
                         "errors": m.errors})
        return rows

    async def run(self, probe: Probe) -> None:
        """Forever: refresh the members, then ask each its capacity (``probe``; None: it
        did not answer, which counts as a failure of its breaker; an answer closes it)."""
        while True:
            try:
                await self.refresh()
                await asyncio.gather(*(self._probe(m, probe) for m in list(self.members.values())))
            except Exception:  # a probe round must never end the loop
                logger.exception("peer membership refresh failed")
            await asyncio.sleep(self.refresh_s)

    async def _probe(self, member: Member, probe: Probe) -> None:
        if member.breaker.state == OPEN and not member.live:
            return  # cooling down: the half-open probe is the next real request or round
        capacity = await probe(member.url)
        if capacity is None:
            member.breaker.on_failure()
            return
        member.weight = float(capacity)
        if member.breaker.state != CLOSED:
            logger.info("peer %s is back", member.url)
        member.breaker.on_success()
