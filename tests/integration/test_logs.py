"""Structured logs: one JSON line per request, the request id forwarded to the hub."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from tests.support.servers import start_process


def json_lines(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_request_id_ties_spoke_and_hub_logs(
    dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    root, files = dataset
    hub = await asyncio.to_thread(
        start_process, "hub", ["--root", str(root), "--chunk-size", "64KiB", "--log-format",
                               "json"], log_dir=str(tmp_path))
    spoke = None
    try:
        spoke = await asyncio.to_thread(
            start_process, "spoke", ["--hub", hub.url, "--cache-dir", str(tmp_path / "c"),
                                     "--capacity", "16MiB", "--log-format", "json"],
            log_dir=str(tmp_path))
        async with aiohttp.ClientSession() as http:
            headers = {"X-Request-Id": "loader-42", "Range": "bytes=0-99"}
            async with http.get(f"{spoke.url}/objects/ds/big.bin", headers=headers) as resp:
                assert await resp.read() == files["ds/big.bin"][:100]
                assert resp.headers["X-Request-Id"] == "loader-42"
            async with http.get(f"{spoke.url}/healthz") as resp:
                generated = resp.headers["X-Request-Id"]
                assert generated and generated != "loader-42"
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()
    spoke_access = [e for e in json_lines(spoke.log) if e["logger"] == "hubspoke.access"]
    read = next(e for e in spoke_access if e["request_id"] == "loader-42")
    assert (read["method"], read["path"], read["status"], read["x_cache"]) == (
        "GET", "/objects/ds/big.bin", 206, "MISS")
    assert isinstance(read["duration_ms"], float)
    hub_access = [e for e in json_lines(hub.log) if e["logger"] == "hubspoke.access"]
    forwarded = {(e["path"], e["request_id"]) for e in hub_access}
    # The manifest and the chunk fetch the loader's read caused carry its id.
    assert ("/manifest/ds/big.bin", "loader-42") in forwarded
    assert ("/objects/ds/big.bin", "loader-42") in forwarded
    assert all(line.startswith("{") for line in spoke.log if line.strip()
               and not line.startswith("listening on"))
