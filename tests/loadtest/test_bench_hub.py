"""The hub bench's table (loadtest.bench_hub), on hand-made wrk runs with known answers."""

from __future__ import annotations

from loadtest.bench import WrkRun
from loadtest.bench_hub import report


def run(req_s: float, bytes_per_request: int, server_cores: float) -> WrkRun:
    return WrkRun(target="t", test="t", conns=1, seconds=1.0, requests=int(req_s), bytes=0,
                  errors=0, req_s=req_s, bytes_s=req_s * bytes_per_request, samples_s=req_s,
                  p50_ms=1.0, p99_ms=2.0, bytes_per_request=bytes_per_request, wrk_cores=0.5,
                  server_cores=server_cores, background_cores=0.0)


def test_the_table_pairs_each_round_and_states_cpu_seconds_per_gb() -> None:
    big, small = 4_000_000, 64_000
    runs = {
        # Rounds of 0.5, 1.0 and 2.0 × nginx: the paired median is 1.0 (a ratio of the
        # medians, 250 ÷ 200, would say 1.25).
        "4MiB": {"hub": [run(50, big, 0.1), run(250, big, 0.1), run(400, big, 0.1)],
                 "nginx file": [run(100, big, 0.1), run(250, big, 0.1), run(200, big, 0.1)]},
        "64KiB": {"hub": [run(5000, small, 0.64)] * 3,
                  "nginx file": [run(10000, small, 0.32)] * 3},
    }
    lines = report(runs)
    hub_big = next(ln for ln in lines if ln.startswith("| 4MiB | hub |"))
    assert "| 1.00 | ≥ 0.9: PASS |" in hub_big
    hub_small = next(ln for ln in lines if ln.startswith("| 64KiB | hub |"))
    # 0.64 cores ÷ 0.32 GB/s = 2 CPU-seconds per GB; 5,000 ÷ 10,000 req/s = 0.5 < 0.6.
    assert hub_small == "| 64KiB | hub | 5,000 | 0.32 | 2.0 | 2.00 | 0.50 | ≥ 0.6: FAIL |"
    nginx_small = next(ln for ln in lines if ln.startswith("| 64KiB | nginx file |"))
    assert nginx_small == "| 64KiB | nginx file | 10,000 | 0.64 | 2.0 | 0.50 |  |  |"
