"""The arithmetic of the benchmark's report: ratios, verdicts, per-epoch and per-second rows.

Plain numbers and records from the measured dicts (``report.json``'s shapes), so
that :mod:`loadtest.bench_report` only lays them out and tests can check them alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadtest.bench_settings import Settings
from loadtest.replay import ReplayResult, ReplaySummary

BARE_LINK = "hub through the link (no cache)"


@dataclass
class Target:
    name: str
    measured: str
    ratio: float | None
    required: str
    passed: bool | None

    @property
    def verdict(self) -> str:
        return "n/a" if self.passed is None else ("PASS" if self.passed else "FAIL")


def cpu_s_per_gb(run: dict[str, Any]) -> float:
    """Server CPU-seconds spent per GB (10^9 bytes) sent, from a wrk cell's medians."""
    return ratio(run["server_cores"], run["gb_s"])


def ratio(a: float, b: float) -> float:
    """``a / b``; infinite when only ``b`` is 0, 0 when both are."""
    return a / b if b else float("inf") if a else 0.0


@dataclass(frozen=True)
class Ratios:
    """Every ratio the report states, from the warm (wrk) and cold (client) sections."""

    big_vs_nginx: float  # warm 4 MiB GB/s, spoke ÷ nginx cache
    small_vs_nginx: float  # warm 64 KiB req/s, spoke ÷ nginx cache
    big_vs_hub: float  # ... spoke ÷ hub direct
    small_vs_hub: float
    hub_big_vs_file: float  # warm 4 MiB GB/s, hub direct ÷ nginx serving the file
    hub_small_vs_file: float  # warm 64 KiB req/s, the same
    nginx_cache_vs_file_big: float  # nginx's cache ÷ nginx serving the file
    nginx_cache_vs_file_small: float
    ceiling_big_gb_s: float  # nginx serving the file: what the client can drive
    ceiling_small_req_s: float
    big_vs_ceiling: float  # the spoke's share of that ceiling
    small_vs_ceiling: float
    wrk_busy: float  # share of wrk's threads busy during the spoke's runs
    client_limited: bool  # the spoke near the ceiling with wrk busy: the client may limit
    nginx_best_samples_s: float  # nginx's best way to serve a batch (one request per sample)
    batch_vs_nginx_best: float  # batched samples/s, spoke ÷ nginx_best_samples_s
    batching_gain: float  # the spoke's batched ÷ one-per-request samples/s
    stream_vs_nginx: float  # cold sequential GB/s, spoke ÷ nginx cache
    random_vs_nginx: float  # cold random 4 MiB GB/s, spoke ÷ nginx cache
    stream_vs_bare: float  # ... spoke ÷ the bare link
    random_vs_bare: float


def ratios(warm: dict[str, Any], cold: dict[str, Any], s: Settings) -> Ratios:
    big, small = warm["4MiB"], warm["64KiB"]
    batch = warm[f"batch{s.batch}x64KiB"]
    ceiling_big, ceiling_small = big["nginx file"]["gb_s"], small["nginx file"]["req_s"]
    big_vs_ceiling = ratio(big["spoke"]["gb_s"], ceiling_big)
    small_vs_ceiling = ratio(small["spoke"]["req_s"], ceiling_small)
    wrk_busy = max(big["spoke"]["wrk_cores"], small["spoke"]["wrk_cores"]) / s.wrk_threads
    nginx_best = max(batch["nginx cache"]["samples_s"], small["nginx cache"]["samples_s"])

    def cold_ratio(test: str, other: str) -> float:
        return ratio(cold[test]["spoke"]["gb_s"], cold[test][other]["gb_s"])

    return Ratios(
        big_vs_nginx=ratio(big["spoke"]["gb_s"], big["nginx cache"]["gb_s"]),
        small_vs_nginx=ratio(small["spoke"]["req_s"], small["nginx cache"]["req_s"]),
        big_vs_hub=ratio(big["spoke"]["gb_s"], big["hub direct"]["gb_s"]),
        small_vs_hub=ratio(small["spoke"]["req_s"], small["hub direct"]["req_s"]),
        hub_big_vs_file=ratio(big["hub direct"]["gb_s"], ceiling_big),
        hub_small_vs_file=ratio(small["hub direct"]["req_s"], ceiling_small),
        nginx_cache_vs_file_big=ratio(big["nginx cache"]["gb_s"], ceiling_big),
        nginx_cache_vs_file_small=ratio(small["nginx cache"]["req_s"], ceiling_small),
        ceiling_big_gb_s=ceiling_big, ceiling_small_req_s=ceiling_small,
        big_vs_ceiling=big_vs_ceiling, small_vs_ceiling=small_vs_ceiling, wrk_busy=wrk_busy,
        client_limited=not (max(big_vs_ceiling, small_vs_ceiling) < 0.8 or wrk_busy < 0.5),
        nginx_best_samples_s=nginx_best,
        batch_vs_nginx_best=ratio(batch["spoke"]["samples_s"], nginx_best),
        batching_gain=ratio(batch["spoke"]["samples_s"], small["spoke"]["samples_s"]),
        stream_vs_nginx=cold_ratio("stream", "nginx cache"),
        random_vs_nginx=cold_ratio("random", "nginx cache"),
        stream_vs_bare=cold_ratio("stream", BARE_LINK),
        random_vs_bare=cold_ratio("random", BARE_LINK),
    )


def evaluate(warm: dict[str, Any], cold: dict[str, Any], rep: dict[str, Any],
             s: Settings) -> list[Target]:
    """The targets the report opens with, each measured and judged."""
    big, small = warm["4MiB"], warm["64KiB"]
    batch = warm[f"batch{s.batch}x64KiB"]
    summary: ReplaySummary = rep["summary"]
    r = ratios(warm, cold, s)
    nginx_best = r.nginx_best_samples_s
    r_big, r_small, r_batch = r.big_vs_nginx, r.small_vs_nginx, r.batch_vs_nginx_best
    r_random = r.random_vs_nginx
    hit = summary.hit_ratio_after_warmup
    t95 = summary.time_to_95pct_s
    return [
        Target("Warm 4 MiB ranges ×16: spoke ÷ nginx cache",
               f"{big['spoke']['gb_s']:.2f} vs {big['nginx cache']['gb_s']:.2f} GB/s",
               r_big, "≥ 1", r_big >= 1),
        Target("Warm 64 KiB ranges ×64: spoke ÷ nginx cache req/s",
               f"{small['spoke']['req_s']:,.0f} vs {small['nginx cache']['req_s']:,.0f} req/s",
               r_small, "≥ 0.6", r_small >= 0.6),
        Target("Warm 4 MiB ranges ×16: hub direct ÷ nginx serving the file",
               f"{big['hub direct']['gb_s']:.2f} vs {big['nginx file']['gb_s']:.2f} GB/s",
               r.hub_big_vs_file, "≥ 0.9", r.hub_big_vs_file >= 0.9),
        Target("Warm 64 KiB ranges ×64: hub direct ÷ nginx serving the file req/s",
               f"{small['hub direct']['req_s']:,.0f} vs {small['nginx file']['req_s']:,.0f} "
               "req/s", r.hub_small_vs_file, "≥ 0.6", r.hub_small_vs_file >= 0.6),
        Target("Warm 64 KiB ranges ×64: spoke p99",
               f"{small['spoke']['p99_ms']:.1f} ms (nginx {small['nginx cache']['p99_ms']:.1f})",
               None, "< 5 ms", small["spoke"]["p99_ms"] < 5),
        Target(f"Batched {s.batch} × 64 KiB per request: spoke ÷ nginx cache's best samples/s",
               f"{batch['spoke']['samples_s']:,.0f} vs {nginx_best:,.0f} samples/s",
               r_batch, "≥ 1.2", r_batch >= 1.2),
        Target("Cold sequential shard streaming through 60 ms: spoke ÷ the bare link",
               f"{cold['stream']['spoke']['gb_s']:.3f} vs "
               f"{cold['stream'][BARE_LINK]['gb_s']:.3f} GB/s (nginx cache "
               f"{cold['stream']['nginx cache']['gb_s']:.3f})", r.stream_vs_bare, "≥ 0.6",
               r.stream_vs_bare >= 0.6),
        Target("Cold random 4 MiB ranges through 60 ms: spoke ÷ nginx cache",
               f"{cold['random']['spoke']['gb_s']:.3f} vs "
               f"{cold['random']['nginx cache']['gb_s']:.3f} GB/s", r_random, "≥ 1",
               r_random >= 1),
        Target("Training replay: warm samples/s ÷ local",
               f"{summary.warm_samples_per_s:,.0f} vs {summary.local_samples_per_s:,.0f}",
               summary.warm_over_local, "≥ 0.95", summary.warm_over_local >= 0.95),
        Target("Training replay: hit ratio after warm-up (dataset fits)",
               "n/a" if hit is None else f"{hit:.1%}", hit, "≥ 95 %",
               None if hit is None else hit >= 0.95),
        Target("Training replay: time to 95 % of local",
               ("never" if t95 is None else f"{t95:.1f} s")
               + f" (first epoch {summary.first_epoch_s:.1f} s)", None,
               "within the first epoch", summary.within_first_epoch),
    ]


@dataclass(frozen=True)
class EpochRow:
    """One replay epoch, hub direct beside the spoke."""

    epoch: int
    local_samples_per_s: float
    spoke_samples_per_s: float
    spoke_hit_pct: float  # of the epoch's requests answered X-Cache: HIT
    local_p50_ms: float
    local_p99_ms: float
    spoke_p50_ms: float
    spoke_p99_ms: float
    hub_bytes: int | None


def epoch_rows(local: ReplayResult, spoke: ReplayResult) -> list[EpochRow]:
    return [EpochRow(se.epoch, le.samples_per_s, se.samples_per_s,
                     100 * se.hits / max(1, se.samples + se.errors), le.p50_ms, le.p99_ms,
                     se.p50_ms, se.p99_ms, se.hub_bytes)
            for le, se in zip(local.epochs, spoke.epochs, strict=False)]


@dataclass(frozen=True)
class SecondRow:
    """One second of the spoke's replay, beside local's rate in the same second of its epoch."""

    t_end: float  # seconds since the spoke's replay started, at the end of this bucket
    epoch: int
    spoke_samples_per_s: float
    local_samples_per_s: float | None  # None: hub direct had no such second
    hit_pct: float | None  # None: no X-Cache header
    p50_ms: float | None  # None: no sample finished in this second
    p99_ms: float | None
    hub_mb_s: float | None  # hub egress, MB (10^6) per second; None: not measured


def second_rows(local: ReplayResult, spoke: ReplayResult) -> list[SecondRow]:
    local_at = {(sec.epoch, sec.epoch_t): sec.samples_per_s for sec in local.series}
    return [SecondRow(
        t_end=sp.t + sp.seconds, epoch=sp.epoch, spoke_samples_per_s=sp.samples_per_s,
        local_samples_per_s=local_at.get((sp.epoch, sp.epoch_t)),
        hit_pct=None if sp.hit_ratio is None else 100 * sp.hit_ratio,
        p50_ms=sp.p50_ms if sp.samples else None, p99_ms=sp.p99_ms if sp.samples else None,
        hub_mb_s=None if sp.hub_bytes is None else sp.hub_bytes / 1e6 / sp.seconds,
    ) for sp in spoke.series]
