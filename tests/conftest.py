"""Shared fixtures: a generated dataset, a real hub and a real spoke on 127.0.0.1."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from hub.config import HubConfig
from spoke.cache.clock import SYSTEM_CLOCK, Clock
from spoke.config import SpokeConfig
from tests.support.hangups import AccessLines, capture_access_log
from tests.support.servers import GatedBackend, RunningServer, start_hub, start_spoke, write_dataset

# A spoke started as a process defaults to --workers auto (two per CPU); here, where
# the tests share a few cores, each is one process unless its test asks for more.
# The flag wins over the variable; tests of the default take it out of their env.
os.environ.setdefault("HUBSPOKE_WORKERS", "1")

CHUNK = 64 * 1024
# Sizes chosen to hit the edge cases: empty, tiny, exact multiples, a partial
# last chunk, and an object of many chunks.
FILES = {
    "ds/empty.bin": 0,
    "ds/one-byte.bin": 1,
    "ds/small.bin": 1000,
    "ds/exact.bin": CHUNK * 4,
    "ds/partial.bin": CHUNK * 5 + 123,
    "ds/big.bin": CHUNK * 40 + 7,
    "other/notes.csv": 3000,
}


@pytest.fixture
def access_log(monkeypatch: pytest.MonkeyPatch) -> AccessLines:
    """The buffered access log, into memory: a call flushes it and gives every line so far."""
    return capture_access_log(monkeypatch)


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "hub-root"
    root.mkdir()
    contents = write_dataset(str(root), FILES)
    # Written a day ago, as a dataset being read is: a version read within its first
    # second gets a Last-Modified a second before the Date (protocol.conditional.
    # last_modified), so tests comparing two answers' dates would race the clock.
    day_ago = time.time() - 86400
    for path in contents:
        os.utime(root / path, (day_ago, day_ago))
    return root, contents


@pytest.fixture
def gated(dataset: tuple[Path, dict[str, bytes]]) -> GatedBackend:
    return GatedBackend(str(dataset[0]))


@pytest.fixture
async def hub(
    dataset: tuple[Path, dict[str, bytes]], gated: GatedBackend
) -> AsyncIterator[RunningServer]:
    server = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK), gated)
    yield server
    await server.stop()


SpokeFactory = Callable[..., Awaitable[RunningServer]]


@pytest.fixture
async def make_spoke(hub: RunningServer, tmp_path: Path) -> AsyncIterator[SpokeFactory]:
    started: list[RunningServer] = []

    async def make(clock: Clock = SYSTEM_CLOCK, **overrides: object) -> RunningServer:
        config = SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
            meta_ttl_s=5.0,
        )
        server = await start_spoke(replace(config, **overrides), clock)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        await server.stop()


@pytest.fixture
async def spoke(make_spoke: SpokeFactory) -> RunningServer:
    return await make_spoke()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
