"""``python -m loadtest.bench_store`` runs end to end against a real ``rclone serve s3``.

Tiny objects and one round: the figures mean nothing. What is checked is that every
row was measured, on answers checked for status and length (the tool stops otherwise),
and that a ranged-read row's ratio is its own figures' (one round: no median to take).
"""

from __future__ import annotations

import pytest

from tests.support.tools import run_tool


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_small_run_measures_every_row(tmp_path_factory: pytest.TempPathFactory) -> None:
    proc = run_tool("loadtest.bench_store", [
        "--reads-mib", "16", "--reads", "4", "--rounds", "1", "--concurrency", "1", "2",
        "--small-mib", "1", "--large-mib", "4", "--list-keys", "20",
    ], tmp_path_factory, timeout_s=150)
    rows = [line.split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| measure")]
    names = [row[0].removeprefix("| ") for row in rows]
    for c in (1, 2):
        ranged = next(row for row in rows if row[0].startswith(f"| cold 4 MiB ranged reads ×{c}"))
        hub, direct, ratio = float(ranged[1]), float(ranged[2]), float(ranged[3].rstrip(" |"))
        assert hub > 0 and direct > 0
        assert ratio == pytest.approx(hub / direct, rel=0.05)  # the figures are rounded
        assert any(name.startswith(f"… the store direct through botocore ×{c}") for name in names)
        relayed = next(row for row in rows
                       if row[0].startswith(f"| … the store through nginx, a plain relay ×{c}"))
        assert float(relayed[1]) > 0 and relayed[2] == ranged[2]  # beside the same direct
        assert float(relayed[3].rstrip(" |")) == pytest.approx(
            float(relayed[1]) / direct, rel=0.05)
    # CPU per GB for nginx and the store beside it (a few 10 ms ticks here: may read 0).
    relay_cpu = next(row for row in rows if row[0].startswith("| … through nginx"))
    assert all(float(v) >= 0 for v in relay_cpu[1].split(" / "))
    assert any(name.startswith("first manifest of 4 MiB") for name in names)
    assert any(name.startswith("list 20 keys") for name in names)
    assert any(name.startswith("hub peak RSS hashing 1 MiB / 4 MiB") for name in names)
