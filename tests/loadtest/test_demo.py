"""``python -m loadtest.demo --quick`` runs end to end with real servers (hub, link, spokes)
and prints every part of its story: a line per step, the progress, the per-second
timeline, the epochs' table, the seed's line beside the demo's, and its figures.

The figures of a quick run on a shared machine mean nothing; the shape is checked, and
that every sample of every epoch arrived whole."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.support.tools import run_tool

EPOCHS = ["local", "spoke cold", "spoke warm", "cold + plan"]


@pytest.mark.timeout(200)
def test_the_quick_demo_tells_the_whole_story(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp("demo")
    proc = run_tool("loadtest.demo", [
        "--quick", "--data-dir", str(out / "data"), "--png", str(out / "timeline.png"),
        "--json", str(out / "figures.json"),
    ], tmp_path_factory, timeout_s=150)
    lines = proc.stdout.splitlines()
    steps = [ln.split(":")[0] for ln in lines if ln.startswith("== ")]
    assert steps == ["== dataset", "== servers", "== training"]
    # Not a terminal: the progress line is printed once per epoch, when it ends.
    progress = [ln.split()[0:2] for ln in lines if re.match(r"  \S", ln)]
    assert [" ".join(p) if p[0] != "local" else "local" for p in progress] == \
        ["local", "spoke cold", "spoke warm", "cold +"]

    start = lines.index(
        "| epoch | s | samples/s | GPU busy | hit ratio | hub egress MB/s | p99 ms |")
    end = lines.index("", start)
    timeline = lines[start + 2:end]
    assert {ln.split(" | ")[0].removeprefix("| ") for ln in timeline} == set(EPOCHS)
    for ln in timeline:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == 7, ln  # epoch, second, samples/s, busy, hits, egress, p99
        assert re.fullmatch(r"[\d,]+", cells[2]) and re.fullmatch(r"\d+%", cells[3]), ln

    header = lines.index(next(ln for ln in lines if ln.startswith("| epoch | samples/s")))
    rows = [ln.strip("|").split("|") for ln in lines[header + 2:header + 6]]
    assert [r[0].strip() for r in rows] == EPOCHS
    assert all(r[-1].strip() == "0" for r in rows), "no errors"
    seed = next(ln for ln in lines if ln.startswith("seed: "))
    assert "95–105" in seed and "115–117" in seed
    demo = next(ln for ln in lines if ln.startswith("demo: "))
    assert re.fullmatch(r"demo: cold [\d,]+ samples/s, GPU \d+% busy \(with a plan [\d,]+, "
                        r"\d+%\); warm [\d,]+ = [\d.]+ × local [\d,]+; \d+% of warm reads "
                        r"under 5 ms", demo), demo

    figures = json.loads((out / "figures.json").read_text())
    assert figures["errors"] == 0
    assert figures["warm_hit_ratio"] == 1.0  # every warm read was a hit
    assert figures["warm_hub_egress_mb"] < figures["cold_hub_egress_mb"]
    png = Path(out / "timeline.png")
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes().startswith(b"\x89PNG")
    else:
        assert not png.exists()


@pytest.mark.timeout(200)
def test_a_tier_of_spokes_pulls_the_dataset_across_the_link_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``--spokes 3``: the cold and warm epochs read through three spokes with ``--peers``,
    a third of the workers each. Three independent spokes would each pull nearly the whole
    dataset across the link; the tier pulls each chunk once, from its owner (a fallback to
    the hub after a slow peer is allowed for, far below a second copy)."""
    out = tmp_path_factory.mktemp("demo-tier")
    proc = run_tool("loadtest.demo", [
        "--quick", "--spokes", "3", "--data-dir", str(out / "data"), "--png", "",
        "--json", str(out / "figures.json"),
    ], tmp_path_factory, timeout_s=150)
    assert "a tier of 3 spokes" in proc.stdout
    figures = json.loads((out / "figures.json").read_text())
    assert (figures["errors"], figures["spokes"]) == (0, 3)
    pulled = figures["cold_hub_egress_mb"] + figures["warm_hub_egress_mb"]
    assert figures["dataset_mb"] <= pulled < 1.5 * figures["dataset_mb"]
