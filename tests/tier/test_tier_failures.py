"""A tier losing a spoke: loaders' reads never fail, the dead spoke's chunks go to their next
choice, and a spoke that comes back gets its share back. Spokes run as real processes here,
so that one can be SIGKILLed."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from loadtest.procs import Process, start_process
from tests.support.http import fetch, stats
from tests.support.servers import RunningServer
from tests.tier.conftest import SECRET, free_ports, wait_all_up

Dataset = tuple[Path, dict[str, bytes]]
WAIT_S = 60


def start_tier_spoke(hub: RunningServer, tmp_path: Path, i: int, ports: list[int]) -> Process:
    secret = tmp_path / "tier-secret"
    if not secret.exists():
        secret.write_text(SECRET)
        secret.chmod(0o600)
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    return start_process("spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / f"cache-{i}"), "--capacity", "64MiB",
        "--peers", peers, "--advertise", f"http://127.0.0.1:{ports[i]}",
        "--peer-secret-file", str(secret), "--peer-refresh", "0.2", "--peer-timeout", "5",
        "--log-level", "warning",
    ], log_dir=str(tmp_path), port=ports[i])


async def read_all(http: aiohttp.ClientSession, url: str, contents: dict[str, bytes]) -> int:
    """Read every object through the spoke at ``url``; the number of reads that failed."""
    failed = 0
    for path, data in contents.items():
        status, _, body = await fetch(http, f"{url}/objects/{path}")
        if status != 200 or body != data:
            failed += 1
    return failed


async def test_a_spoke_killed_mid_run_fails_no_read_and_its_share_returns_when_it_does(
    hub: RunningServer, tmp_path: Path, dataset: Dataset, http: aiohttp.ClientSession,
) -> None:
    contents = {p: d for p, d in dataset[1].items() if d}
    ports = free_ports(3)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [await asyncio.to_thread(start_tier_spoke, hub, tmp_path, i, ports)
             for i in range(3)]
    try:
        await wait_all_up(http, urls, WAIT_S)
        assert await read_all(http, urls[0], contents) == 0  # the tier is warm

        # Loaders on the two survivors read on while the third dies under them.
        stop = asyncio.Event()

        async def loader(url: str) -> tuple[int, int]:
            reads = failed = 0
            while not stop.is_set() or reads < 2 * len(contents):
                failed += await read_all(http, url, contents)
                reads += len(contents)
            return reads, failed

        loaders = [asyncio.create_task(loader(u)) for u in urls[:2]]
        await asyncio.sleep(0)
        await asyncio.to_thread(procs[2].stop, signal.SIGKILL)
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*loaders), WAIT_S)
        assert all(failed == 0 for _, failed in results), results
        assert all(reads > 0 for reads, _ in results)
        # After the kill every chunk the dead spoke owned went elsewhere: read again, all
        # of it, through both survivors, with the dead one marked down.
        for url in urls[:2]:
            assert await read_all(http, url, contents) == 0
        doc = await stats(http, urls[0])
        dead = next(p for p in doc["peers"] if p["url"] == urls[2])
        assert dead["state"] in ("down", "probing")
        assert dead["share"] < 0.05
        assert sum(p["share"] for p in doc["peers"]) > 0.99

        # It comes back (same port, same cache): the others see it up and send it its keys.
        procs[2] = await asyncio.to_thread(start_tier_spoke, hub, tmp_path, 2, ports)
        await wait_all_up(http, urls, WAIT_S)
        before = await stats(http, urls[2])
        for url in urls[:2]:
            assert await read_all(http, url, contents) == 0
        after = await stats(http, urls[2])
        assert after["peer_requests_served"] > before["peer_requests_served"]
        back = next(p for p in (await stats(http, urls[0]))["peers"] if p["url"] == urls[2])
        assert back["state"] == "up" and back["share"] > 0.2
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.stop)
