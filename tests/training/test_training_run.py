"""``python -m loadtest.training`` at a tiny size: the summary's shape and its counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_a_tiny_training_run_writes_the_summary_and_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "loadtest.training", "--out", str(out), "--ranks", "2",
         "--workers", "2", "--dataset-size", "2MiB", "--shard-size", "512KiB",
         "--chunk-size", "256KiB", "--step-ms", "5", "--half-cache-size", "512KiB",
         "--setup-ms", "50", "--phases", "plan,noplan,half"],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    dataset = summary["dataset_bytes"]
    assert dataset == 2 << 20
    for figures in (summary["local"], summary["plan"]["cold"], summary["plan"]["warm"],
                    summary["noplan"]["cold"], summary["noplan"]["warm"]):
        assert figures["samples_per_s"] > 0 and 0 < figures["util"] <= 1
        assert figures["batches"] == -(-(dataset // summary["sample_bytes"] // 2) // 24)
        assert figures["first_batch_wait_s"] > 0 and figures["later_batches_wait_s"] >= 0
    # Every phase, the local one too, has the job's setup between its sampler and its
    # first epoch (where a plan booked with the sampler is already being fetched).
    for figures in (summary["local"], summary["plan"]["cold"], summary["noplan"]["cold"]):
        assert figures["sampler_to_start_s"] >= 0.05
    assert "sampler_to_start_s" not in summary["plan"]["warm"]
    # The dataset fits the cache: the hub sends each byte once, plan or not (the
    # hub's own count; the per-epoch figures come from /stats polled every 50 ms, so
    # the last fetches of one epoch may be counted in the next).
    assert summary["hub_egress_bytes"] == summary["plan"]["hub_egress_bytes"] == dataset
    assert summary["noplan"]["hub_egress_bytes"] == dataset
    assert summary["plan_shard_aware"]["hub_egress_bytes"] == dataset
    assert summary["local"]["hub_bytes"] == 0
    # Half the dataset cached: every chunk comes from the hub at least once.
    half = summary["half_cache"]
    assert half["capacity_bytes"] * 2 == half["dataset_bytes"]
    assert len(half["hub_bytes_per_epoch"]) >= 2
    assert half["hub_egress_bytes"] >= half["dataset_bytes"]
    assert set(summary["targets"]) >= {"cold_util_with_plan_at_least_0.95",
                                       "hub_egress_equals_dataset_when_it_fits"}
    assert summary["targets"]["hub_egress_equals_dataset_when_it_fits"] is True
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    timelines = json.loads((out / "timeline.json").read_text())
    assert set(timelines) == {"local", "plan", "noplan", "plan_shard_aware"}
    assert len(timelines["plan"]) == 2 * summary["plan"]["cold"]["batches"]
