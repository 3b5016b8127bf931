"""loadtest.tier's own parts: each loader's pass reads every chunk once, in its own order,
and the report shows every figure the issue asks for. (The benchmark itself runs real
spokes behind Toxiproxy: ``python -m loadtest.tier --quick --out DIR``.)"""

from __future__ import annotations

from loadtest.dataset import Shard
from loadtest.tier import chunk_reads, quantiles, report_md

CHUNK = 1 << 20


def test_a_pass_reads_every_chunk_once_and_each_loader_in_its_own_order() -> None:
    shards = [Shard("d/a", 3 * CHUNK), Shard("d/b", 2 * CHUNK + 5)]
    one, two = chunk_reads(shards, CHUNK, seed=1), chunk_reads(shards, CHUNK, seed=2)
    expected = {("d/a", 0, CHUNK), ("d/a", CHUNK, CHUNK), ("d/a", 2 * CHUNK, CHUNK),
                ("d/b", 0, CHUNK), ("d/b", CHUNK, CHUNK), ("d/b", 2 * CHUNK, 5)}
    assert sorted(one) == sorted(two) == sorted(expected)
    assert len(one) == len(expected)
    assert one != two


def test_quantiles() -> None:
    assert quantiles([]) == {"n": 0}
    q = quantiles([i / 1000 for i in range(1, 101)])
    assert q["n"] == 100 and abs(q["p50_ms"] - 50.5) < 1e-9 and q["p99_ms"] == 100.0


def test_the_report_has_egress_per_n_hit_ratio_latencies_and_the_kill() -> None:
    lat = {"n": 10, "p50_ms": 1.0, "p99_ms": 2.0}
    doc: dict[str, object] = {
        "egress": [{"spokes": n, "egress_over_dataset": 1.0 + n / 1000, "failed_reads": 0,
                    "seconds": 1.0, "hub_miss": lat} for n in (1, 2, 3, 4)],
        "hit": {"spokes": 4, "hit_ratio": 0.99, "local_hit": lat, "peer_hit": lat,
                "loaded_local_hit": lat, "loaded_peer_hit": lat},
        "kill": {"spokes": 3, "killed_after_reads": 10, "failed_reads_on_survivors": 0,
                 "reads_on_survivors": 100, "extra_egress_bytes": 5,
                 "extra_over_dead_share": 0.1},
    }
    text = report_md(doc)
    for n in (1, 2, 3, 4):
        assert f"| {n} | {1 + n / 1000:.3f} | 0 |" in text
    assert "**0.990**" in text
    for row in ("| local hit |", "| peer hit |", "| hub miss (cold) |"):
        assert row in text
    assert "failed reads on the survivors 0 of 100" in text
