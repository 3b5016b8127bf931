"""``python -m loadtest.bench_memory --quick`` runs end to end and its figures are sane.

It starts a real hub and spoke on 127.0.0.1 and opens a cache index of a few thousand
chunks in child processes. The quick sizes are small, so only generous bounds are
checked: that every part was measured, every read answered, and nothing grew wildly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from loadtest.bench_memory import QUICK
from tests.support.tools import run_tool

KiB = 1 << 10
MiB = 1 << 20

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench-memory") / "memory.json"
    proc = run_tool("loadtest.bench_memory", ["--quick", "--out", str(out)], tmp_path_factory,
                    timeout_s=60)
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.timeout(90)
def test_markdown_is_printed(report: tuple[str, dict[str, Any]]) -> None:
    text, _ = report
    assert text.startswith("# Spoke memory (quick)")
    for heading in ("## Index, per cached chunk", "## Spoke RSS against open connections",
                    "## Spoke RSS around cached reads"):
        assert heading in text, heading
    assert "| marginal |" in text
    assert "nan" not in text and "inf " not in text


@pytest.mark.timeout(90)
def test_index_cost_per_chunk(report: tuple[str, dict[str, Any]]) -> None:
    _, data = report
    index = data["index"]
    sizes = index["sizes"]
    assert [s["chunks"] for s in sizes] == list(QUICK.index_sizes)
    for s in sizes:
        # A cached chunk costs some heap and some index on disk, but not kilobytes.
        assert 0 < s["heap_bytes_per_chunk"] < 4 * KiB, s
        assert 0 < s["sqlite_bytes_per_chunk"] < 4 * KiB, s
        assert s["rss_bytes"] >= 0 and s["rss_bytes_per_chunk"] < 16 * KiB, s
        assert s["sqlite_files"].get("index.sqlite3", 0) > 0, s["sqlite_files"]
        assert s["heap_top"] and all(t["where"] for t in s["heap_top"])
    # Linear in the chunk count: the cost per chunk does not change with the size.
    assert 0.7 < index["heap_per_chunk_ratio"] < 1.4, index
    assert 0 < index["marginal"]["heap_bytes"] < 4 * KiB, index["marginal"]


@pytest.mark.timeout(90)
def test_connections_cost_little(report: tuple[str, dict[str, Any]]) -> None:
    _, data = report
    con = data["connections"]
    steps = con["steps"]
    assert [s["connections"] for s in steps] == list(QUICK.connection_steps)
    for step in steps:
        # The spoke really holds each connection open (plus its listening socket...).
        assert step["spoke_sockets"] >= step["connections"] + 1, step
        assert step["vmrss"] > 0, step
    assert con["all_206"] is True
    assert con["statuses"] == {"206": QUICK.connection_steps[-1]}
    assert con["kib_per_connection"] is not None
    assert con["kib_per_connection"] < 256, con


@pytest.mark.timeout(90)
def test_cached_reads_do_not_accumulate(report: tuple[str, dict[str, Any]]) -> None:
    _, data = report
    reads = data["connections"]["reads"]
    assert len(reads["passes"]) == QUICK.read_passes
    assert reads["hub_bytes_during_reads"] == 0, "the reads were not all served from cache"
    for run in reads["passes"]:
        assert run["requests"] == QUICK.read_requests
        assert run["bytes"] == QUICK.read_requests * QUICK.big_range
        assert run["statuses"] == {"206": QUICK.read_requests}
        assert run["x_cache"] == {"HIT": QUICK.read_requests}
        assert run["rss_peak"] >= reads["rss_before"] - 16 * MiB
        # Far less than what was read: bytes stream through, they are not kept.
        assert run["rss_after"] - reads["rss_before"] < run["bytes"] // 2, run
