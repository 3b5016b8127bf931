"""Fixtures for the security tests: secrets, token minting, and servers with auth on."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
import yarl

from hub.config import HubConfig
from protocol.auth import issue
from spoke.config import SpokeConfig
from tests.conftest import CHUNK
from tests.support.http import Response, assert_problem
from tests.support.servers import RunningServer, start_hub, start_spoke

Dataset = tuple[Path, dict[str, bytes]]
Mint = Callable[..., str]
AuthSpokeFactory = Callable[..., Awaitable[RunningServer]]


def write_secret(path: Path) -> Path:
    """A fresh 32-byte secret, hex, readable by its owner only (as operators should keep it)."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "secret")


@pytest.fixture
def mint(secret_file: Path) -> Mint:
    """``mint("tenant", ["ds/"], admin=False, ttl_s=3600)``: a token signed with ``secret_file``
    (or ``key``), issued ``now`` (default: the real clock)."""
    secret = secret_file.read_bytes().strip()

    def make(
        tenant: str, prefixes: Sequence[str], *, admin: bool = False, ttl_s: int = 3600,
        key: bytes | None = None, now: float | None = None,
    ) -> str:
        issued = time.time() if now is None else now
        return issue(key or secret, tenant, prefixes, admin=admin, ttl_s=ttl_s, now=issued)

    return make


@pytest.fixture
async def auth_hub(dataset: Dataset, secret_file: Path) -> AsyncIterator[RunningServer]:
    """A hub over the shared dataset that requires tokens signed with ``secret_file``."""
    config = HubConfig(root=str(dataset[0]), chunk_size=CHUNK, auth_secret_file=str(secret_file))
    server = await start_hub(config)
    yield server
    await server.stop()


@pytest.fixture
async def make_auth_spoke(
    auth_hub: RunningServer, secret_file: Path, mint: Mint, tmp_path: Path
) -> AsyncIterator[AuthSpokeFactory]:
    """Spokes in front of ``auth_hub`` checking loaders' tokens, with their own hub token."""
    started: list[RunningServer] = []
    hub_token = tmp_path / "hub-token"
    hub_token.write_text(mint("spoke-1", [""]) + "\n")

    async def make(**overrides: object) -> RunningServer:
        config = SpokeConfig(
            hub_url=auth_hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
            auth_secret_file=str(secret_file), hub_token_file=str(hub_token),
        )
        server = await start_spoke(replace(config, **overrides))  # type: ignore[arg-type]
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        await server.stop()


async def call(
    http: aiohttp.ClientSession, url: str | yarl.URL, token: str | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None, **kwargs: object,
) -> Response:
    """One request, with ``Authorization: Bearer token`` when given."""
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    async with http.request(method, url, headers=all_headers, **kwargs) as resp:  # type: ignore[arg-type]
        return resp.status, resp.headers, await resp.read()


def problem(response: Response, status: int) -> dict[str, object]:
    """The problem+json body of ``response``, after checking its status and type
    (an empty dict for a HEAD answer, which has no body)."""
    code, headers, body = response
    if body:
        return assert_problem(response, status)
    assert code == status, body
    assert headers["Content-Type"].split(";")[0] == "application/problem+json"
    return {}


