"""``python -m hub serve --workers N``: N peer processes on one port, stopped together.

Every test starts real hub processes on 127.0.0.1 and speaks HTTP to them, each request
on a connection of its own, so that SO_REUSEPORT spreads them over the processes.
"""

from __future__ import annotations

import http.client
import os
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import trustme

from hub.config import HubConfig, parse_config
from loadtest.procs import Process, start_process
from loadtest.s3_stores import start_rclone_s3
from service.tls import client_context
from tests.security.test_tls import issue
from tests.support.servers import write_dataset

FILE = "ds/data.bin"
SIZE = 1 << 20
READ = 4096
WAIT_S = 30.0


def wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.05)


@pytest.fixture
def root(tmp_path: Path) -> tuple[Path, bytes]:
    files = write_dataset(str(tmp_path / "root"), {FILE: SIZE})
    return tmp_path / "root", files[FILE]


@pytest.fixture
def start(root: tuple[Path, bytes], tmp_path: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start_hub(*flags: str) -> Process:
        hub = start_process("hub", ["--root", str(root[0]), "--access-log", "off", *flags],
                            log_dir=str(tmp_path))
        started.append(hub)
        return hub

    yield start_hub
    for hub in started:
        kids = children(hub)
        hub.stop()
        for pid in kids:  # a test that failed half-way must leave no process behind
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)


def children(hub: Process) -> list[int]:
    if hub.proc.poll() is not None:
        return []
    return [c.pid for c in psutil.Process(hub.pid).children()]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def port_of(hub: Process) -> int:
    return int(hub.url.rsplit(":", 1)[1])


def get(hub: Process, path: str, headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """One request on a fresh connection (over TLS with ``tls``)."""
    conn = (http.client.HTTPConnection("127.0.0.1", port_of(hub), timeout=WAIT_S) if tls is None
            else http.client.HTTPSConnection("127.0.0.1", port_of(hub), timeout=WAIT_S,
                                             context=tls))
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def metrics(hub: Process, tls: ssl.SSLContext | None = None) -> dict[str, float]:
    status, body = get(hub, "/metrics", tls=tls)
    assert status == 200
    return {name: float(value) for name, value in
            (line.split(" ", 1) for line in body.decode().splitlines()
             if line and not line.startswith("#"))}


def listening_pids(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid is not None}


def test_every_process_listens_on_the_one_port_announced_once(
    start: Callable[..., Process],
) -> None:
    hub = start("--workers", "3")
    kids = children(hub)
    assert len(kids) == 2
    wait_until("all three listen", lambda: listening_pids(port_of(hub)) >= {hub.pid, *kids})
    assert sum("listening on" in line for line in hub.log) == 1, hub.log


def test_reads_spread_over_the_processes_and_metrics_count_them_all(
    start: Callable[..., Process], root: tuple[Path, bytes],
) -> None:
    hub = start("--workers", "3")
    wait_until("all three listen", lambda: len(listening_pids(port_of(hub))) == 3)
    reads = 60
    for i in range(reads):
        offset = (i * 7919 * READ) % (SIZE - READ)
        status, body = get(hub, f"/objects/{FILE}",
                           {"Range": f"bytes={offset}-{offset + READ - 1}"})
        assert status == 206
        assert body == root[1][offset:offset + READ]
    seen = metrics(hub)
    # Whichever process answers /metrics (one of three, by the kernel's hash of each
    # connection) sums all three's counts: one process's own would be about a third.
    assert seen["hub_processes"] == 3
    assert seen["hub_bytes_sent_total"] == reads * READ
    assert seen["hub_requests_total"] == reads + 1  # and this /metrics


def test_sigterm_to_the_first_process_stops_every_one(start: Callable[..., Process]) -> None:
    hub = start("--workers", "3")
    kids = children(hub)
    assert len(kids) == 2
    assert hub.stop(signal.SIGTERM) == 0
    wait_until("no sibling left", lambda: all(gone(pid) for pid in kids))


def test_a_first_process_killed_outright_leaves_no_sibling(
    start: Callable[..., Process],
) -> None:
    hub = start("--workers", "3")
    kids = children(hub)
    assert len(kids) == 2
    hub.stop(signal.SIGKILL)
    wait_until("no sibling left", lambda: all(gone(pid) for pid in kids))


def test_a_sibling_that_dies_is_started_again(start: Callable[..., Process]) -> None:
    hub = start("--workers", "2")
    [first] = children(hub)
    os.kill(first, signal.SIGKILL)
    wait_until("another sibling listens",
               lambda: len(listening_pids(port_of(hub)) - {hub.pid, first}) == 1)
    assert first not in children(hub)
    assert get(hub, "/healthz")[0] == 200


def test_one_worker_is_one_process(start: Callable[..., Process]) -> None:
    hub = start("--workers", "1")
    assert children(hub) == []
    assert metrics(hub)["hub_processes"] == 1


def test_one_process_by_default_auto_is_one_per_core() -> None:
    cores = len(os.sched_getaffinity(0))
    assert HubConfig.workers == 1
    _, config = parse_config(["serve", "--root", "r", "--workers", "auto"], {})
    assert config.workers == cores
    _, config = parse_config(["serve", "--root", "r"], {"HUBSPOKE_WORKERS": "4"})
    assert config.workers == 4


@pytest.mark.parametrize("text", ["0", "-1", "many"])
def test_a_bad_worker_count_is_refused_by_name(
    text: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_config(["serve", "--root", "r", "--workers", text], {})
    assert exit_.value.code == 2
    assert "--workers" in capsys.readouterr().err


def test_an_object_store_root_is_served_by_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = write_dataset(str(tmp_path / "store" / "bucket"), {FILE: 5000})[FILE]
    store = start_rclone_s3(str(tmp_path / "store"), log_dir=str(tmp_path))
    try:
        for name, value in store.env().items():
            monkeypatch.setenv(name, value)
        hub = start_process("hub", ["--root", "s3://bucket", "--workers", "3",
                                    "--index-dir", str(tmp_path / "index")],
                            log_dir=str(tmp_path))
        try:
            assert children(hub) == []
            assert metrics(hub)["hub_processes"] == 1
            assert get(hub, f"/objects/{FILE}", {"Range": "bytes=10-19"}) == (206, data[10:20])
            assert any("served by one process" in line for line in hub.log), hub.log
        finally:
            hub.stop()
    finally:
        store.stop()


def test_every_process_serves_tls(
    start: Callable[..., Process], root: tuple[Path, bytes], tmp_path: Path,
) -> None:
    pki = issue(trustme.CA(), tmp_path / "pki", "127.0.0.1")
    hub = start("--workers", "2", "--tls-cert", str(pki.cert_file), "--tls-key",
                str(pki.key_file))
    assert hub.url.startswith("https://")
    wait_until("both listen", lambda: len(listening_pids(port_of(hub))) == 2)
    tls = client_context(str(pki.ca_file))
    for _ in range(20):
        assert get(hub, f"/objects/{FILE}", {"Range": "bytes=0-99"}, tls) == (206, root[1][:100])
    assert metrics(hub, tls)["hub_bytes_sent_total"] == 20 * 100
