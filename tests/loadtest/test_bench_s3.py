"""``python -m loadtest.bench_s3 --quick`` runs end to end: every row measured, no errors.

Real hub, Toxiproxy, two spokes with their S3 front ends, and wrk (on PATH, as for the
bench's smoke test). The figures of a quick run mean nothing; that each row was measured
on answers checked byte for byte (the tool stops otherwise) is what is checked.
"""

from __future__ import annotations

import json

import pytest

from loadtest.bench_s3 import Row, parse_args, rows
from tests.support.tools import run_tool


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_quick_run_fills_every_row(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("bench-s3")
    proc = run_tool("loadtest.bench_s3", ["--quick", "--seconds", "1", "--rounds", "1",
                                          "--out", str(out)], tmp_path_factory, timeout_s=200)
    assert proc.stdout.startswith("# hubspoke S3 front end vs /objects")
    report = json.loads((out / "s3.json").read_text())
    assert (out / "s3.md").read_text() in proc.stdout
    assert len(report["rows"]) == 5
    for row in report["rows"]:
        assert row["s3"] > 0 and row["objects"] > 0, row
        assert row["verdict"] in ("PASS", "FAIL")
    for test in ("4MiB", "64KiB"):
        assert len(report["warm"][test]) == 4
        for name, cell in report["warm"][test].items():
            assert cell["requests"] > 0 and cell["errors"] == 0, (test, name)
    for name, cell in report["cold"].items():
        assert cell["gb_s"] > 0 and cell["errors"] == 0, name


def test_rows_compare_s3_with_objects_of_the_same_spoke() -> None:
    def cell(x: float) -> dict[str, float]:
        return {"gb_s": x, "req_s": 1000 * x}

    warm = {"4MiB": {"/objects": cell(1.0), "S3 unsigned": cell(0.95),
                     "/objects (signed spoke)": cell(2.0), "S3 presigned": cell(1.5)},
            "64KiB": {"/objects": cell(1.0), "S3 unsigned": cell(0.85),
                      "/objects (signed spoke)": cell(1.0), "S3 presigned": cell(0.81)}}
    cold = {"/objects": {"gb_s": 0.2}, "S3 unsigned": {"gb_s": 0.17}}
    table = {r.name: r for r in rows(warm, cold)}
    assert table["warm 4MiB, S3 unsigned"].verdict == "PASS"
    assert table["warm 4MiB, S3 presigned (SigV4)"].ratio == pytest.approx(0.75)
    assert table["warm 4MiB, S3 presigned (SigV4)"].verdict == "FAIL"
    assert table["warm 64KiB, S3 unsigned"].verdict == "FAIL"
    assert table["warm 64KiB, S3 presigned (SigV4)"].verdict == "PASS"
    assert table["cold 4 MiB through 60 ms, S3 unsigned"].verdict == "FAIL"
    assert Row("x", 1.0, 0.0, "GB/s", 0.9).verdict == "FAIL"


def test_a_restricted_run_has_the_rows_it_measured() -> None:
    warm = {"64KiB": {"/objects (signed spoke)": {"req_s": 1000.0},
                      "S3 presigned": {"req_s": 850.0}}}
    table = rows(warm, {})
    assert [(r.name, r.ratio, r.verdict) for r in table] == [
        ("warm 64KiB, S3 presigned (SigV4)", 0.85, "PASS")]
    args = parse_args(["--test", "64KiB", "--pair", "presigned", "--no-cold"])
    assert (args.test, args.pair, args.no_cold) == (["64KiB"], ["presigned"], True)
