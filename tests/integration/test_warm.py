"""Pre-warm jobs: POST /warm, progress, cancel, and the CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import CHUNK, FILES
from tests.support.http import stats
from tests.support.servers import GatedBackend, RunningServer
from tests.support.waits import wait_warm


async def test_prewarm_prefix_then_every_read_is_a_hit(
    spoke: RunningServer, dataset: tuple[Path, dict[str, bytes]], http: aiohttp.ClientSession
) -> None:
    _, files = dataset
    async with http.post(f"{spoke.url}/warm", json={"prefix": "ds/"}) as resp:
        assert resp.status == 202
        started = await resp.json()
        assert resp.headers["Location"] == f"/warm/{started['id']}"
    job = await wait_warm(http, spoke.url, started["id"])
    ds = {p: size for p, size in FILES.items() if p.startswith("ds/")}
    chunks = sum(-(-size // CHUNK) for size in ds.values())
    assert job["state"] == "done"
    assert (job["chunks_done"], job["chunks_total"], job["chunks_fetched"]) == (chunks,) * 3
    assert (job["bytes_done"], job["bytes_total"]) == (sum(ds.values()),) * 2
    assert job["eta_s"] == 0.0 and job["errors"] == []
    before = await stats(http, spoke.url)
    assert before["hub_fetches"] == chunks and before["prefetched_chunks"] == chunks
    for path in ds:
        async with http.get(f"{spoke.url}/objects/{path}") as resp:
            assert await resp.read() == files[path]
            assert resp.headers["X-Cache"] == "HIT"
    after = await stats(http, spoke.url)
    assert after["hub_fetches"] == before["hub_fetches"]
    assert after["misses"] == 0
    # Every prefetched chunk was read afterwards: accuracy 1.0.
    assert after["prefetch_used"] == chunks


async def test_prewarm_paths_counts_cached_chunks_as_done(
    spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{spoke.url}/objects/ds/exact.bin") as resp:
        await resp.read()
    async with http.post(f"{spoke.url}/warm",
                         json={"paths": ["ds/exact.bin", "ds/small.bin"]}) as resp:
        job = await wait_warm(http, spoke.url, (await resp.json())["id"])
    assert job["state"] == "done"
    assert (job["chunks_done"], job["chunks_fetched"]) == (5, 1)


async def test_cancel_a_running_warm_job(
    spoke: RunningServer, gated: GatedBackend, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{spoke.url}/objects/ds/big.bin", headers={"Range": "bytes=0-0"}):
        pass  # manifest cached, so the job blocks on chunk reads only
    gated.gate.clear()
    try:
        async with http.post(f"{spoke.url}/warm", json={"paths": ["ds/big.bin"]}) as resp:
            job_id = (await resp.json())["id"]
        await asyncio.to_thread(gated.waiting.acquire, timeout=10)
        async with http.delete(f"{spoke.url}/warm/{job_id}") as resp:
            assert resp.status == 200
            assert (await resp.json())["state"] == "cancelled"
    finally:
        gated.gate.set()
    job = await wait_warm(http, spoke.url, job_id)
    assert job["state"] == "cancelled"
    assert job["chunks_done"] < job["chunks_total"] == 41


async def test_warm_of_a_missing_object_fails_with_its_error(
    spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{spoke.url}/warm", json={"paths": ["ds/nope.bin"]}) as resp:
        job = await wait_warm(http, spoke.url, (await resp.json())["id"])
    assert job["state"] == "failed"
    assert job["error_count"] == 1 and "ds/nope.bin" in str(job["errors"])


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"[]", b'{"paths": "ds/big.bin"}', b'{"paths": [1]}', b'{"prefix": 3}',
     b'{"paths": ["../etc/passwd"]}', b'{"paths": [], "prefix": ""}', b"{}", b"\xff\xfe"],
)
async def test_bad_warm_requests_are_400_problem_json(
    spoke: RunningServer, http: aiohttp.ClientSession, body: bytes
) -> None:
    async with http.post(f"{spoke.url}/warm", data=body) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/problem+json"
        assert (await resp.json())["status"] == 400


async def test_unknown_warm_job_is_404(spoke: RunningServer, http: aiohttp.ClientSession) -> None:
    for method in ("GET", "DELETE"):
        async with http.request(method, f"{spoke.url}/warm/0123") as resp:
            assert resp.status == 404
            assert resp.content_type == "application/problem+json"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spoke", "warm", *args],
                          capture_output=True, text=True, timeout=60)


async def test_warm_cli_shows_progress_and_exit_codes(
    spoke: RunningServer, http: aiohttp.ClientSession
) -> None:
    # Three runs that share nothing the others touch, side by side: each is a process start.
    ok, failed, unreachable = await asyncio.gather(
        asyncio.to_thread(run_cli, "--spoke", spoke.url, "--prefix", "other/"),
        asyncio.to_thread(run_cli, "--spoke", spoke.url, "--path", "ds/nope.bin"),
        asyncio.to_thread(run_cli, "--spoke", "http://127.0.0.1:9", "--prefix", "", "--quiet"),
    )
    assert ok.returncode == 0, ok.stderr
    assert "done: 1/1 chunks" in ok.stderr and "3000" in ok.stderr
    assert failed.returncode == 1
    assert "failed" in failed.stderr and "ds/nope.bin" in failed.stderr
    assert unreachable.returncode == 2
