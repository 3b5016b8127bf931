"""The floor server answers ranges correctly, and the floor measurement runs end to end."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loadtest.floor import measure, render
from loadtest.procs import start_process


def test_the_floor_server_answers_ranges_with_the_files_bytes(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    server = start_process("loadtest.floor", ["--file", str(path)])
    try:
        for start, end in ((0, 0), (65_536, 131_071), (299_990, 400_000)):
            req = urllib.request.Request(
                f"{server.url}/x", headers={"Range": f"bytes={start}-{end}"})
            with urllib.request.urlopen(req, timeout=10) as reply:
                assert reply.status == 206
                assert reply.read() == data[start:end + 1]
        req = urllib.request.Request(f"{server.url}/x", headers={"Range": "bytes=300000-300001"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 416
        err.value.close()
    finally:
        server.stop()


# Needs wrk, which `make test` installs (the Makefile's `tools`): run_wrk says so if missing.
def test_the_floor_is_measured_with_wrk(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4 << 20))
    rows = measure(str(path), 4 << 20, [0, 20], seconds=1)
    assert [r["spin_us"] for r in rows] == [0, 20]
    assert all(r["req_s"] > 0 and r["errors"] == 0 for r in rows)
    assert render(rows).count("\n") == 3  # header, rule, two rows
