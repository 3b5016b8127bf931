"""A tier of real spokes on 127.0.0.1 in front of one real hub (tests/conftest.py's)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from service.runner import start_site
from spoke.app import make_app
from spoke.config import SpokeConfig
from spoke.tier.peers_arg import PeerSource
from tests.support.http import stats
from tests.support.servers import RunningServer

SECRET = "tier-secret-for-tests-0123456789"
PEER_HEADERS = {"Authorization": f"Bearer {SECRET}"}


def free_ports(n: int) -> list[int]:
    """``n`` ports free now on 127.0.0.1 (the tier must know its members' URLs before
    they listen: each spoke's --peers names all of them)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Tier:
    spokes: list[RunningServer]
    urls: list[str]
    secret_file: Path

    async def stop(self, i: int) -> None:
        await self.spokes[i].stop()


TierFactory = Callable[..., Awaitable[Tier]]


async def wait_all_up(http: aiohttp.ClientSession, urls: list[str], timeout_s: float = 20.0,
                      among: list[str] | None = None) -> None:
    """Until every spoke at ``urls`` sees every member of ``among`` (default: ``urls``) up."""
    wanted = set(among if among is not None else urls)
    last: Any = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                docs = [await stats(http, url) for url in urls]
                last = [d["peers"] for d in docs]
                if all({p["url"] for p in d["peers"] if p["state"] in ("up", "self")} >= wanted
                       for d in docs):
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"the tier never came up: {last}") from None


@pytest.fixture
async def make_tier(
    hub: RunningServer, tmp_path: Path, http: aiohttp.ClientSession,
) -> AsyncIterator[TierFactory]:
    started: list[RunningServer] = []
    secret_file = tmp_path / "tier-secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)

    async def make(n: int = 3, wait: bool = True, **overrides: Any) -> Tier:
        ports = free_ports(n)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        peers = tuple(PeerSource(u) for u in urls)
        spokes = []
        for i, (port, url) in enumerate(zip(ports, urls, strict=True)):
            config = SpokeConfig(
                hub_url=hub.url, cache_dir=str(tmp_path / f"cache-{i}"),
                capacity_bytes=64 << 20, meta_ttl_s=5.0, port=port, peers=peers,
                advertise=url, peer_secret_file=str(secret_file), peer_refresh_s=0.2,
            )
            app = make_app(replace(config, **overrides))
            runner, bound = await start_site(app, "127.0.0.1", port)
            assert bound == port
            server = RunningServer(url, runner, app)
            started.append(server)
            spokes.append(server)
        if wait:
            await wait_all_up(http, urls)
        return Tier(spokes, urls, secret_file)

    yield make
    for server in reversed(started):
        await server.stop()
