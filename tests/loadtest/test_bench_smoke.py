"""``python -m loadtest.bench --quick`` runs end to end and fills every part of its report.

It starts real servers (hub, Toxiproxy, spoke, nginx) and runs wrk, so it needs Debian's
``nginx`` and ``wrk`` on PATH (``make test`` installs them with the Makefile's ``tools``).
The figures of a quick run mean nothing; what is checked is that each section was measured.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.tools import run_tool

REPO = Path(__file__).resolve().parents[2]

# nginx and wrk come with `make test` (the Makefile's `tools` target).
pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    proc = run_tool("loadtest.bench", ["--quick", "--out", str(out)], tmp_path_factory,
                    timeout_s=150)
    text = (out / "report.md").read_text()
    assert proc.stdout.strip().startswith("# hubspoke"), "the report is printed too"
    return out, text, json.loads((out / "report.json").read_text())


@pytest.mark.timeout(200)
def test_files_are_written(report: tuple[Path, str, dict[str, Any]]) -> None:
    out, _, _ = report
    for name in ("report.md", "report.json", "warmup.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "warmup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(200)
def test_markdown_has_every_section(report: tuple[Path, str, dict[str, Any]]) -> None:
    _, text, _ = report
    for heading in ("## Targets", "## 1. Warm random ranged reads", "## 2. Cold reads",
                    "## 3. Training replay", "## 4. Batched multi-range reads"):
        assert heading in text, heading
    assert text.count("**PASS**") + text.count("**FAIL**") == 11
    assert not re.search(r"\b(nan|inf)\b", text), "a ratio was not computed"


@pytest.mark.timeout(200)
def test_warm_section_measured_every_side(report: tuple[Path, str, dict[str, Any]]) -> None:
    _, _, data = report
    warm = data["warm"]
    for test, sides in (("4MiB", 4), ("64KiB", 4), ("batch32x64KiB", 3)):
        assert len(warm[test]) == sides, test
        for name, cell in warm[test].items():
            assert cell["requests"] > 0, (test, name)
            if test != "batch32x64KiB" or name != "nginx cache":
                # nginx answers a multi-range request with the whole object; it may be slow.
                assert cell["req_s"] > 0 and cell["errors"] == 0, (test, name, cell)
    # Single-range answers are the requested bytes (plus headers), not whole objects.
    for name, cell in warm["64KiB"].items():
        assert 64 * 1024 <= cell["bytes_per_request"] < 64 * 1024 + 4096, name
    answers = data["multi_range_answers"]
    assert answers["spoke"]["status"] == 206
    assert answers["spoke"]["content_type"].startswith("multipart/byteranges")
    assert answers["nginx cache"]["status"] in (200, 206, 416)


@pytest.mark.timeout(200)
def test_cold_section_measured_every_side(report: tuple[Path, str, dict[str, Any]]) -> None:
    _, _, data = report
    for test in ("stream", "random"):
        for name in ("spoke", "nginx cache", "hub through the link (no cache)",
                     "nginx file (no link, client ceiling)"):
            cell = data["cold"][test][name]
            assert cell["gb_s"] > 0 and cell["errors"] == 0, (test, name, cell)
        # Empty caches: each cache fetched all it served from the hub.
        for name in ("spoke", "nginx cache"):
            cell = data["cold"][test][name]
            assert cell["hub_egress"] >= cell["bytes"], (test, name, cell)


@pytest.mark.timeout(200)
def test_replay_section_is_filled(report: tuple[Path, str, dict[str, Any]]) -> None:
    _, _, data = report
    rep = data["replay"]
    for side in ("local", "spoke"):
        assert rep[side]["samples"] > 0 and rep[side]["errors"] == 0, side
        assert rep[side]["series"], side
        assert len(rep[side]["epochs"]) == data["settings"]["replay_epochs"], side
    summary = rep["summary"]
    for key in ("local_samples_per_s", "cold_samples_per_s", "warm_samples_per_s",
                "warm_over_local", "first_epoch_s"):
        assert summary[key] > 0, key
    assert summary["hit_ratio_after_warmup"] is not None
    assert summary["hub_bytes_first_epoch"] >= summary["dataset_bytes"]
    assert any(s["hit_ratio"] is not None for s in rep["spoke"]["series"])
    assert any(s["hub_bytes"] for s in rep["spoke"]["series"])


@pytest.mark.timeout(200)
def test_targets_have_verdicts(report: tuple[Path, str, dict[str, Any]]) -> None:
    _, _, data = report
    assert len(data["targets"]) == 11  # the spoke's nine and the hub's two
    assert {t["verdict"] for t in data["targets"]} <= {"PASS", "FAIL"}


@pytest.mark.timeout(200)
def test_report_renders_again_from_its_json(report: tuple[Path, str, dict[str, Any]],
                                            tmp_path: Path) -> None:
    out, text, _ = report
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest.bench", "--from-json", str(out / "report.json"),
         "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "report.md").read_text() == text
