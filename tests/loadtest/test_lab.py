"""The lab fixture: a real hub, a Toxiproxy link and a spoke, and everything undone on exit."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
import requests
from toxiproxy.exceptions import NotFound

from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.procs import Process


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as reply:
        body: bytes = reply.read()
        return body


def _gone(process: Process) -> bool:
    return process.proc.poll() is not None


@pytest.mark.timeout(90)
def test_reads_go_hub_link_spoke_and_everything_is_undone(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(tmp_path, "data")
    [shard] = generate(root, 1, 1 << 20)
    with open(os.path.join(root, shard.path), "rb") as f:
        want = f.read()
    with Lab(log_dir=str(tmp_path)) as lab:
        cache_dir = lab.temp_dir("hubspoke-lab-test-")
        hub = lab.hub(root, "--chunk-size", "256KiB", "--access-log", "off")
        link = lab.link(hub.url, latency_ms=40, bandwidth_kb_s=100_000)
        spoke = lab.spoke(link.url, cache_dir, "--capacity", str(4 << 20), "--access-log", "off")
        assert link.url != hub.url and link.url.endswith(f":{link.port}")
        assert lab.pids == [hub.pid, spoke.pid]
        toxics = {t.type: t.attributes for t in link.proxy.toxics().values()}
        assert toxics["latency"]["latency"] == 40
        assert toxics["bandwidth"]["rate"] == 100_000
        assert _read(f"{spoke.url}/objects/{shard.path}") == want
        stats = json.loads(_read(f"{spoke.url}/stats"))
        assert stats["hub_bytes"] >= len(want), "the spoke fetched it (through the link)"
        proxy = link.proxy
    assert _gone(hub) and _gone(spoke)
    assert not os.path.exists(cache_dir)
    # Destroyed, or gone with the Toxiproxy server it lived on.
    with pytest.raises((NotFound, requests.RequestException)):
        proxy.toxics()


@pytest.mark.timeout(60)
def test_an_error_inside_still_stops_every_process(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(tmp_path, "data")
    generate(root, 1, 64 << 10)
    started: list[Process] = []
    with pytest.raises(RuntimeError, match="boom"), Lab(log_dir=str(tmp_path)) as lab:
        started.append(lab.hub(root, "--access-log", "off"))
        started.append(lab.spoke(started[0].url, os.path.join(tmp_path, "cache"),
                                 "--capacity", "1MiB", "--access-log", "off"))
        raise RuntimeError("boom")
    assert len(started) == 2 and all(_gone(p) for p in started)


@pytest.mark.timeout(60)
def test_stop_restarts_a_server_and_forgets_it(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(tmp_path, "data")
    generate(root, 1, 64 << 10)
    with Lab(log_dir=str(tmp_path)) as lab:
        hub = lab.hub(root, "--access-log", "off")
        first = lab.spoke(hub.url, os.path.join(tmp_path, "c1"), "--capacity", "1MiB",
                           "--access-log", "off")
        lab.stop(first)
        assert _gone(first) and lab.pids == [hub.pid]
        second = lab.spoke(hub.url, os.path.join(tmp_path, "c2"), "--capacity", "1MiB",
                            "--access-log", "off")
        assert lab.pids == [hub.pid, second.pid]
    assert _gone(hub) and _gone(second)
