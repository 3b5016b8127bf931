"""psutil's figures are the ones ``/proc`` gives (what the tools printed before psutil)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.meter import (
    cpu_seconds,
    disk_of,
    disk_use,
    memory,
    open_fds,
    open_sockets,
    process_tree,
    rss_bytes,
)

# A child that holds memory, a listening socket and a socket pair, forks one grandchild,
# burns a bounded bit of CPU, says so and then sleeps: its figures stay still while read.
CHILD = """
import os, socket, sys, time
held = bytearray(8 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
pair = socket.socketpair()
if os.fork() == 0:
    time.sleep(120); os._exit(0)
sum(range(3_000_000))
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            yield proc
        finally:
            for pid in reversed(process_tree(proc.pid)):
                os.kill(pid, 9)


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        rows = (line.split(":", 1) for line in f)
        return {k: int(v.split()[0]) * 1024 for k, v in rows if v.strip().endswith("kB")}


def test_memory_is_vmrss_and_rssanon(child: subprocess.Popen[str]) -> None:
    status, mem = _status(child.pid), memory(child.pid)
    assert mem.rss == status["VmRSS"]
    assert mem.anon == status["RssAnon"]
    assert mem.file == status["RssFile"] + status["RssShmem"]
    assert mem.anon >= 8 << 20, "the child's own 8 MiB"
    assert rss_bytes([child.pid]) == status["VmRSS"]


def test_process_tree_and_cpu_cover_the_descendants(child: subprocess.Popen[str]) -> None:
    tree = process_tree(child.pid)
    assert tree[0] == child.pid and len(tree) == 2
    with open(f"/proc/{child.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    assert cpu_seconds([child.pid]) == pytest.approx(ticks / os.sysconf("SC_CLK_TCK"))
    assert cpu_seconds([child.pid]) > 0
    assert cpu_seconds([child.pid, 1 << 30]) == cpu_seconds([child.pid]), "gone pids count 0"


def test_fds_and_sockets_match_the_fd_table(child: subprocess.Popen[str]) -> None:
    fd_dir = f"/proc/{child.pid}/fd"
    links = [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
    assert open_fds(child.pid) == len(links)
    sockets = sum(link.startswith("socket:") for link in links)
    assert sockets == 3 and open_sockets(child.pid) == sockets


def test_a_synced_write_shows_on_the_disk_it_went_to(tmp_path: Path) -> None:
    disk = disk_of(str(tmp_path))
    assert disk is not None, f"{tmp_path} should be on a block device, as CI's /tmp is"
    before = disk_use(disk)
    with open(tmp_path / "written", "wb") as f:
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    used = disk_use(disk) - before
    assert used.write_bytes >= 8 << 20 and used.busy_ms >= 0


def test_a_filesystem_without_a_device_has_no_disk() -> None:
    assert disk_of("/proc") is None
