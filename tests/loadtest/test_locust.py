"""The Locust load test, short: hub → Toxiproxy 60 ms → spoke, tens of users, ≈ 10 s.

It runs ``python -m loadtest.locust_run`` exactly as docs/load-tests.md does, in a
subprocess (Locust monkey-patches the process it runs in with gevent, which must
not happen to pytest), and fails on any failed request.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.locust_run import CACHE_EVENT, CSV_PREFIX, HTML_REPORT
from loadtest.procs import REPO

# Long enough for the first third of the run to hold the cold misses and the last third
# only hits; the run's length is the test's, docs/load-tests.md keeps the tool's default.
RUN_TIME_S = 10
# Locust's run, plus generating the dataset, starting three servers, writing reports.
SUBPROCESS_TIMEOUT_S = RUN_TIME_S + 100

pytestmark = [pytest.mark.slow, pytest.mark.timeout(SUBPROCESS_TIMEOUT_S + 30)]


def test_locust_run_has_no_failed_request_and_warms_up(tmp_path: Path) -> None:
    assert importlib.util.find_spec("locust") is not None, (
        "locust is a test dependency: pip install -e '.[test]'")
    out = tmp_path / "locust"
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.locust_run", "--users", "20", "--spawn-rate", "20",
         "--run-time", f"{RUN_TIME_S}s", "--out", str(out), "--shards", "8",
         "--shard-size", "8MiB", "--verify-fraction", "0.05"],
        cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False,
    )
    report = proc.stdout + proc.stderr + _tail(out / "logs" / "locust.log")
    assert proc.returncode == 0, report

    for name in (HTML_REPORT, f"{CSV_PREFIX}_stats.csv", f"{CSV_PREFIX}_stats_history.csv",
                 f"{CSV_PREFIX}_failures.csv", "hit_ratio.csv", "summary.json"):
        assert (out / name).is_file(), f"{name} missing\n{report}"
    assert "X-Cache HIT" in (out / HTML_REPORT).read_text(), "no cache stats in the HTML report"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == 0, report
    assert summary["requests"] > 500, report  # tens of users for 10 s did real work
    assert summary["verified"] > 0 and summary["verify_failures"] == 0, report
    # The cache warmed: the hit ratio rose from the first third of the run to the last.
    assert summary["late_hit_ratio"] > 0.9, report
    assert summary["early_hit_ratio"] < summary["late_hit_ratio"], report
    assert summary["spoke_stats"]["hub_fetches"] > 0, report

    with open(out / f"{CSV_PREFIX}_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert int(rows[(CACHE_EVENT, "X-Cache MISS")]["Request Count"]) > 0, report
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0, report


def _tail(path: Path, lines: int = 40) -> str:
    if not path.is_file():
        return ""
    return "\n--- locust.log ---\n" + "\n".join(path.read_text().splitlines()[-lines:])
