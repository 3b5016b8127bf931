"""A tier of real spokes on 127.0.0.1 in front of one real hub (tests/conftest.py's)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
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





async def wait_all_up(http: aiohttp.ClientSession, urls: list[str], timeout_s: float = 20.0,
                      among: list[str] | None = None,
                      headers: dict[str, str] | None = None) -> None:
    """Until every spoke at ``urls`` sees every member of ``among`` (default: ``urls``) up."""
    wanted = set(among if among is not None else urls)
    last: Any = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                docs = [await stats(http, url, headers) for url in urls]
                last = [d["peers"] for d in docs]
                if all({p["url"] for p in d["peers"] if p["state"] in ("up", "self")} >= wanted
                       for d in docs):
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"the tier never came up: {last}") from None


class TierMaker:
    """Starts spokes of a tier in this process; each ``--peers`` names the others."""

    def __init__(self, hub: RunningServer, tmp_path: Path, http: aiohttp.ClientSession) -> None:
        self.hub, self.tmp_path, self.http = hub, tmp_path, http
        self.started: list[RunningServer] = []
        self.secret_file = tmp_path / "tier-secret"
        self.secret_file.write_text(SECRET + "\n")
        self.secret_file.chmod(0o600)

    async def member(self, port: int, peers: list[str], **overrides: Any) -> RunningServer:
        """A spoke on ``port`` whose --peers are ``peers``."""
        url = f"http://127.0.0.1:{port}"
        config = SpokeConfig(
            hub_url=self.hub.url, cache_dir=str(self.tmp_path / f"cache-{port}"),
            capacity_bytes=64 << 20, meta_ttl_s=5.0, port=port,
            peers=tuple(PeerSource(u) for u in peers), advertise=url,
            peer_secret_file=str(self.secret_file), peer_refresh_s=0.2,
        )
        app = make_app(replace(config, **overrides))
        runner, bound = await start_site(app, "127.0.0.1", port)
        assert bound == port
        server = RunningServer(url, runner, app)
        self.started.append(server)
        return server

    async def __call__(self, n: int = 3, wait: bool = True, **overrides: Any) -> Tier:
        ports = free_ports(n)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        spokes = [await self.member(port, urls, **overrides) for port in ports]
        if wait:
            await wait_all_up(self.http, urls)
        return Tier(spokes, urls, self.secret_file)


@pytest.fixture
async def make_tier(
    hub: RunningServer, tmp_path: Path, http: aiohttp.ClientSession,
) -> AsyncIterator[TierMaker]:
    maker = TierMaker(hub, tmp_path, http)
    yield maker
    for server in reversed(maker.started):
        await server.stop()
