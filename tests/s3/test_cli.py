"""``python -m spoke serve --s3-port``: its listening line, with --workers, TLS and keys."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from loadtest.procs import REPO, Process, start_process
from tests.s3.conftest import get_object, s3_client
from tests.security.test_tls import issue
from tests.support.servers import write_dataset

FILES = {"ds/a.bin": 300_000, "ds/sub/b.bin": 5000}


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    running: list[Process] = []
    yield running
    for process in reversed(running):
        process.stop()


@pytest.fixture
def data(tmp_path: Path) -> dict[str, bytes]:
    return write_dataset(str(tmp_path / "root"), FILES)


def _spoke(processes: list[Process], tmp_path: Path, hub: Process, *extra: str) -> Process:
    spoke = start_process("spoke", ["--hub", hub.url, "--cache-dir", str(tmp_path / "cache"),
                                    "--capacity", "64MiB", "--s3-port", "0", *extra],
                          log_dir=str(tmp_path))
    processes.append(spoke)
    return spoke


async def test_s3_line_follows_the_main_line_and_workers_share_the_cache(
    processes: list[Process], tmp_path: Path, data: dict[str, bytes]
) -> None:
    hub = start_process("hub", ["--root", str(tmp_path / "root")], log_dir=str(tmp_path))
    processes.append(hub)
    spoke = _spoke(processes, tmp_path, hub, "--workers", "2")
    s3_url = spoke.site_url("s3")
    lines = [line for line in spoke.log if "listening on" in line]
    assert lines[0].startswith("listening on ") and lines[0].endswith(spoke.url)
    assert lines[1] == f"s3 listening on {s3_url}"
    assert s3_url != spoke.url
    client = s3_client(s3_url)
    for _ in range(3):  # new connections, whichever process they reach
        _, body = await get_object(client, Bucket="ds", Key="a.bin")
        assert body == data["ds/a.bin"]
    listed = await asyncio.to_thread(client.list_objects_v2, Bucket="ds", Delimiter="/")
    assert [o["Key"] for o in listed["Contents"]] == ["a.bin"]
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["sub/"]


async def test_s3_over_tls_with_keys(
    processes: list[Process], tmp_path: Path, data: dict[str, bytes]
) -> None:
    pki = issue(trustme.CA(), tmp_path / "pki", "127.0.0.1", "localhost")
    keys = tmp_path / "s3-keys"
    keys.write_text("# a comment\nTRAINKEY train-secret-0123456789 ds/sub\n")
    hub = start_process("hub", ["--root", str(tmp_path / "root")], log_dir=str(tmp_path))
    processes.append(hub)
    spoke = _spoke(processes, tmp_path, hub, "--tls-cert", str(pki.cert_file),
                   "--tls-key", str(pki.key_file), "--s3-credentials", str(keys))
    s3_url = spoke.site_url("s3")
    assert spoke.url.startswith("https://") and s3_url.startswith("https://")
    client = s3_client(s3_url, key="TRAINKEY", secret="train-secret-0123456789",
                       verify=str(pki.ca_file))
    _, body = await get_object(client, Bucket="ds", Key="sub/b.bin", Range="bytes=10-19")
    assert body == data["ds/sub/b.bin"][10:20]


def test_bad_key_files_and_unsafe_combinations_stop_the_spoke(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("ONLYTWO fields\n")
    base = [sys.executable, "-m", "spoke", "serve", "--hub", "http://127.0.0.1:9",
            "--cache-dir", str(tmp_path / "c"), "--capacity", "1MiB", "--port", "0",
            "--s3-port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for extra, says in [(["--s3-credentials", str(bad)], "line 1"),
                        (["--s3-credentials", str(tmp_path / "absent")], "--s3-credentials"),
                        (["--auth-secret-file", str(bad)], "--s3-credentials"),
                        (["--s3-port", "70000"], "port")]:
        done = subprocess.run([*base, *extra], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (extra, done.stderr)
        assert says in done.stderr, (extra, done.stderr)
