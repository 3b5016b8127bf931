"""The benchmark report's arithmetic, on hand-made measurements with known answers."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.bench_figures import BARE_LINK, epoch_rows, evaluate, ratio, ratios, second_rows
from loadtest.bench_report import render
from loadtest.bench_settings import QUICK
from loadtest.replay import Epoch, ReplayResult, ReplaySummary, Second


def _wrk(gb_s: float = 0.0, req_s: float = 0.0, samples_s: float = 0.0, p99_ms: float = 1.0,
         wrk_cores: float = 0.5) -> dict[str, Any]:
    return {"gb_s": gb_s, "req_s": req_s, "samples_s": samples_s, "p50_ms": 0.5,
            "p99_ms": p99_ms, "wrk_cores": wrk_cores, "server_cores": 1.0,
            "background_cores": 0.0, "bytes_per_request": 65536.0, "requests": 10,
            "rounds": 1, "errors": 0}


def _cold(gb_s: float) -> dict[str, Any]:
    return {"gb_s": gb_s, "p50_ms": 100.0, "p99_ms": 200.0, "hub_egress": 1 << 20,
            "server_cores": 0.5, "errors": 0, "notes": [], "all_gb_s": [gb_s]}


WARM = {
    "4MiB": {"spoke": _wrk(gb_s=3.0, wrk_cores=1.0), "nginx cache": _wrk(gb_s=2.0),
             "hub direct": _wrk(gb_s=4.0), "nginx file": _wrk(gb_s=5.0)},
    "64KiB": {"spoke": _wrk(req_s=900, samples_s=900, p99_ms=4.0, wrk_cores=1.8),
              "nginx cache": _wrk(req_s=1000, samples_s=1000),
              "hub direct": _wrk(req_s=300), "nginx file": _wrk(req_s=1000)},
    "batch32x64KiB": {"spoke": _wrk(gb_s=2.0, samples_s=2700), "nginx cache": _wrk(samples_s=100),
                      "hub direct": _wrk(samples_s=50)},
}
COLD = {test: {"spoke": _cold(0.75), "nginx cache": _cold(0.25), BARE_LINK: _cold(0.375),
               "nginx file (no link, client ceiling)": _cold(1.0)}
        for test in ("stream", "random")}


def test_ratio_of_nothing() -> None:
    assert ratio(3, 2) == 1.5
    assert ratio(0, 0) == 0.0
    assert ratio(1, 0) == float("inf")


def test_ratios() -> None:
    r = ratios(WARM, COLD, QUICK)
    assert r.big_vs_nginx == 1.5 and r.small_vs_nginx == 0.9
    assert r.big_vs_hub == 0.75 and r.small_vs_hub == 3.0
    assert r.nginx_cache_vs_file_big == 0.4 and r.nginx_cache_vs_file_small == 1.0
    assert (r.ceiling_big_gb_s, r.ceiling_small_req_s) == (5.0, 1000)
    assert r.big_vs_ceiling == 0.6 and r.small_vs_ceiling == 0.9
    assert r.wrk_busy == pytest.approx(0.9), "the busier of the spoke's two runs, per thread"
    assert r.client_limited, "90 % of the ceiling with wrk 90 % busy"
    assert r.nginx_best_samples_s == 1000, "one request per sample beats nginx's batches"
    assert r.batch_vs_nginx_best == 2.7 and r.batching_gain == 3.0
    assert r.stream_vs_nginx == pytest.approx(3.0) and r.random_vs_bare == pytest.approx(2.0)


def test_the_client_is_not_the_limit_when_wrk_idles() -> None:
    idle = {**WARM, "64KiB": {**WARM["64KiB"], "spoke": _wrk(req_s=900, wrk_cores=0.4)},
            "4MiB": {**WARM["4MiB"], "spoke": _wrk(gb_s=3.0, wrk_cores=0.4)}}
    assert not ratios(idle, COLD, QUICK).client_limited


def _replay(label: str, rates: list[float], hits: list[int]) -> ReplayResult:
    result = ReplayResult(label, workers=4, sample_bytes=16384)
    result.epochs = [Epoch(i + 1, samples=100, seconds=100 / rate, hits=h, errors=0,
                           p50_ms=1.0, p99_ms=2.0, hub_bytes=None if label == "local" else 1 << 20)
                     for i, (rate, h) in enumerate(zip(rates, hits, strict=True))]
    result.series = [Second(t=float(i), epoch=i + 1, epoch_t=0, seconds=0.5, samples=s,
                            samples_per_s=rate, hit_ratio=None if label == "local" else 0.5,
                            p50_ms=1.0, p99_ms=2.0, hub_bytes=None if s == 0 else 1_000_000,
                            errors=0)
                     for i, (rate, s) in enumerate(zip(rates, [10, 0], strict=True))]
    return result


def test_epoch_and_second_rows() -> None:
    local, spoke = _replay("local", [100, 200], [0, 0]), _replay("spoke", [50, 400], [25, 100])
    rows = epoch_rows(local, spoke)
    assert [(e.epoch, e.local_samples_per_s, e.spoke_samples_per_s, e.spoke_hit_pct)
            for e in rows] == [(1, 100, 50, 25.0), (2, 200, 400, 100.0)]
    first, second = second_rows(local, spoke)
    assert (first.t_end, first.local_samples_per_s, first.hit_pct) == (0.5, 100, 50.0)
    assert first.hub_mb_s == 2.0, "1 MB in half a second"
    assert second.p50_ms is None and second.hub_mb_s is None, "no sample finished"
    # No local second with that (epoch, second): a row without local's rate.
    spoke.series[1].epoch_t = 7
    assert second_rows(local, spoke)[1].local_samples_per_s is None


def _rep() -> dict[str, Any]:
    summary = ReplaySummary(
        local_samples_per_s=1000, cold_samples_per_s=300, warm_samples_per_s=990,
        warm_over_local=0.99, time_to_95pct_s=4.0, time_to_95pct_same_epoch_s=None,
        first_epoch_s=10.0, within_first_epoch=True, hit_ratio_after_warmup=0.94,
        time_to_hit95_s=None, hub_bytes_first_epoch=None, hub_bytes_after_warmup=None,
        dataset_bytes=1 << 20)
    return {"local": _replay("local", [100, 200], [0, 0]),
            "spoke": _replay("spoke", [50, 400], [25, 100]), "summary": summary,
            "client_cores": 1.0, "server_cores": {"hub": 0.1, "spoke": 0.2},
            "background_cores": 0.0, "spoke_rss_bytes": 1 << 20}


def test_evaluate_judges_each_target() -> None:
    verdicts = {t.name: t.verdict for t in evaluate(WARM, COLD, _rep(), QUICK)}
    assert verdicts == {
        "Warm 4 MiB ranges ×16: spoke ÷ nginx cache": "PASS",  # 1.5 ≥ 1
        "Warm 64 KiB ranges ×64: spoke ÷ nginx cache req/s": "PASS",  # 0.9 ≥ 0.6
        "Warm 4 MiB ranges ×16: hub direct ÷ nginx serving the file": "FAIL",  # 0.8 < 0.9
        "Warm 64 KiB ranges ×64: hub direct ÷ nginx serving the file req/s": "FAIL",  # 0.3
        "Warm 64 KiB ranges ×64: spoke p99": "PASS",  # 4 ms < 5
        "Batched 32 × 64 KiB per request: spoke ÷ nginx cache's best samples/s": "PASS",
        "Cold sequential shard streaming through 60 ms: spoke ÷ the bare link": "PASS",  # 2 ≥ 0.6
        "Cold random 4 MiB ranges through 60 ms: spoke ÷ nginx cache": "PASS",
        "Training replay: warm samples/s ÷ local": "PASS",
        "Training replay: hit ratio after warm-up (dataset fits)": "FAIL",  # 94 % < 95 %
        "Training replay: time to 95 % of local": "PASS",
    }


def test_render_lays_the_figures_out() -> None:
    rep = _rep()
    meta = {"date": "today", "cores": 2, "python": "3.11", "nginx": "nginx", "wrk": "wrk",
            "toxiproxy": "stand-in", "loadavg_before": "0", "loadavg_after": "0",
            "seconds": 1.0}
    answers = {k: {"status": 206, "content_type": "multipart/byteranges", "content_length": 1}
               for k in ("hub direct", "spoke", "nginx cache")}
    warmed = {"spoke": {"hit_checks": "20/20"}}
    text = render(meta, WARM, answers, COLD, rep, evaluate(WARM, COLD, rep, QUICK), warmed,
                  QUICK, None)
    assert "Ratios: spoke ÷ nginx cache 1.50 (4 MiB), 0.90 (64 KiB); spoke ÷ hub direct " \
           "0.75 / 3.00; nginx cache ÷ nginx file 0.40 / 1.00." in text
    assert "so the client may be part of the limit." in text
    assert "Hub direct ÷ nginx serving the same file: 0.80 (4 MiB), 0.30 (64 KiB)." in text
    hub_row = next(ln for ln in text.splitlines() if ln.startswith("| hub direct (data local) |"))
    assert "| 1.00 / 1.00 | 0.25 / inf |" in hub_row  # cores; CPU-s per GB (1 core ÷ 4 GB/s)
    assert "spoke ÷ bare link 2.00 / 2.00." in text
    assert "| 2 | 200 | 400 | 100.0 |" in text
    assert "Batching on the spoke: 3.00 × its one-request-per-sample samples/s." in text
    batch_rows = [ln for ln in text.splitlines()
                  if ln.startswith("| **spoke** |") and " per request (" in ln]
    # CPU-s per GB of each request shape: 1 core ÷ 0 GB/s (one sample) and ÷ 2 GB/s (batches)
    assert [row.split(" | ")[-2] for row in batch_rows] == ["inf", "0.50"]
