"""The defaults-side-by-side benchmark runs end to end and reports every configuration."""

from __future__ import annotations

import pytest

from loadtest.bench_defaults import NGINX, SETS, main


# Needs wrk and nginx, which `make test` installs (the Makefile's `tools`).
@pytest.mark.parametrize("which", list(SETS))
def test_bench_defaults_reports_each_configuration_against_nginx(
    which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--set", which, "--rounds", "1", "--seconds", "1", "--file-mib", "8"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[2].startswith("| server | flags | samples/s")
    rows = [row.strip("| ").split(" | ") for row in table[4:]]
    assert [row[0] for row in rows] == [NGINX, *SETS[which]]
    assert rows[0][4] == "1.00"
    for row in rows:
        assert float(row[2].replace(",", "")) > 0 and float(row[4]) > 0 and int(row[5]) > 0
