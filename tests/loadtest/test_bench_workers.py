"""The one-process-against-several benchmark runs end to end and reports both sides."""

from __future__ import annotations

import pytest

from loadtest.bench_workers import CELLS, main


# Needs wrk, which `make test` installs (the Makefile's `tools`): run_wrk says so if missing.
def test_bench_workers_reports_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workers", "2", "--rounds", "1", "--seconds", "1", "--file-mib", "8"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith("| test | --workers 1 samples/s")
    rows = table[2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == list(CELLS)
    for row in rows:
        ratio = float(row.rstrip(" |").rsplit("| ", 1)[1])
        assert ratio > 0
