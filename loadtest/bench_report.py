"""The benchmark's Markdown report: layout only (numbers: :mod:`loadtest.bench_figures`)."""

from __future__ import annotations

from typing import Any

from loadtest.bench_figures import (
    Ratios,
    Target,
    cpu_s_per_gb,
    epoch_rows,
    ratios,
    second_rows,
)
from loadtest.bench_settings import GiB, MiB, Settings
from loadtest.dataset import SAMPLE_BYTES
from loadtest.nginx import CACHE_VALID_S
from loadtest.replay import ReplayResult, ReplaySummary


def _ms(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def _opt(v: float | None, fmt: str) -> str:
    """``v`` formatted, or an empty cell for None."""
    return "" if v is None else fmt.format(v)


def render(meta: dict[str, Any], warm: dict[str, Any], answers: dict[str, Any],
           cold: dict[str, Any], rep: dict[str, Any], targets: list[Target],
           warmed: dict[str, Any], s: Settings, profile: dict[str, Any] | None) -> str:
    """The Markdown report of one run (or of its ``report.json``)."""
    r = ratios(warm, cold, s)
    lines: list[str] = []
    for section in (_head(meta, targets, s), _warm(warm, warmed, r, s), _cold(cold, r, s),
                    _replay(rep, s), _batch(warm, answers, r, s), _profile(profile)):
        lines += section
    return "\n".join(lines) + "\n"


def _head(meta: dict[str, Any], targets: list[Target], s: Settings) -> list[str]:
    L: list[str] = []
    add = L.append
    add(f"# hubspoke cold→warm benchmark ({s.mode})")
    add("")
    add(f"{meta['date']} · {meta['cores']} cores · Python {meta['python']} · "
        f"{meta['nginx']} · {meta['wrk']} · Toxiproxy: {meta['toxiproxy']} · "
        f"{s.latency_ms} ms link · load average before {meta['loadavg_before']}, "
        f"after {meta['loadavg_after']} · {meta['seconds']:.0f} s in all")
    add("")
    add(f"Data: a {s.file_bytes / GiB:g} GiB file for random ranges, {s.stream_shards} stream "
        f"shards of {s.stream_shard_bytes // MiB} MiB, {s.replay_shards} replay shards of "
        f"{s.replay_shard_bytes // MiB} MiB ({SAMPLE_BYTES // 1024} KiB samples). wrk "
        f"{s.wrk_threads} threads, {s.rounds} interleaved round(s) of {s.wrk_seconds:g} s per "
        "cell, medians. Client and servers share the same cores; \"other\" is CPU used on "
        "the machine by processes outside this benchmark during the run. Both caches serve "
        f"a cached version up to {s.spoke_meta_ttl_s:g} s without asking the hub (nginx "
        f"`proxy_cache_valid {CACHE_VALID_S}s`, spoke `--meta-ttl {s.spoke_meta_ttl_s:g}`); "
        f"the spoke runs at {s.spoke_described}.")
    add("")
    add("## Targets")
    add("")
    add("| target | measured | ratio | required | result |")
    add("|---|---|---|---|---|")
    for t in targets:
        ratio = "" if t.ratio is None else f"{t.ratio:.2f}"
        add(f"| {t.name} | {t.measured} | {ratio} | {t.required} | **{t.verdict}** |")
    add("")
    return L


def _warm(warm: dict[str, Any], warmed: dict[str, Any], r: Ratios, s: Settings) -> list[str]:
    L: list[str] = []
    add = L.append
    add("## 1. Warm random ranged reads (wrk, random aligned `Range` over the file)")
    add("")
    big, small = warm["4MiB"], warm["64KiB"]
    add(f"| server | 4 MiB × {s.big_conns} conns GB/s | p99 ms | 64 KiB × {s.small_conns} "
        "conns req/s | p50 ms | p99 ms | server CPU cores (4M / 64K) | server CPU-s per GB "
        "(4M / 64K) | wrk cores (4M / 64K) | other cores |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    names = {"hub direct": "hub direct (data local)", "spoke": "**spoke, warm**",
             "nginx cache": "nginx slice cache, warm",
             "nginx file": "nginx serving the file (client ceiling)"}
    for key, label in names.items():
        b, m = big[key], small[key]
        add(f"| {label} | {b['gb_s']:.2f} | {_ms(b['p99_ms'])} | {m['req_s']:,.0f} | "
            f"{_ms(m['p50_ms'])} | {_ms(m['p99_ms'])} | {b['server_cores']:.2f} / "
            f"{m['server_cores']:.2f} | {cpu_s_per_gb(b):.2f} / {cpu_s_per_gb(m):.2f} | "
            f"{b['wrk_cores']:.2f} / {m['wrk_cores']:.2f} | "
            f"{max(b['background_cores'], m['background_cores']):.2f} |")
    add("")
    add(f"Ratios: spoke ÷ nginx cache {r.big_vs_nginx:.2f} (4 MiB), {r.small_vs_nginx:.2f} "
        f"(64 KiB); spoke ÷ hub direct {r.big_vs_hub:.2f} / {r.small_vs_hub:.2f}; nginx cache ÷ "
        f"nginx file {r.nginx_cache_vs_file_big:.2f} / {r.nginx_cache_vs_file_small:.2f}.")
    add(f"Hub direct ÷ nginx serving the same file: {r.hub_big_vs_file:.2f} (4 MiB), "
        f"{r.hub_small_vs_file:.2f} (64 KiB).")
    add(f"Client check: the same wrk drives nginx serving the file to {r.ceiling_big_gb_s:.2f} "
        f"GB/s and {r.ceiling_small_req_s:,.0f} req/s; the spoke reached "
        f"{r.big_vs_ceiling:.0%} and {r.small_vs_ceiling:.0%} of that, with wrk's "
        f"{s.wrk_threads} threads {r.wrk_busy:.0%} busy during the spoke's runs, so "
        + ("the client may be part of the limit." if r.client_limited
           else "the client was not what limited the spoke."))
    add("Warm-up before these runs (whole file read through each cache): "
        + "; ".join(f"{k} X-Cache HIT on {v['hit_checks']} spot checks"
                    for k, v in warmed.items()) + ".")
    add("")
    return L


def _cold(cold: dict[str, Any], r: Ratios, s: Settings) -> list[str]:
    L: list[str] = []
    add = L.append
    add(f"## 2. Cold reads through {s.latency_ms} ms, caches restarted empty before each test")
    add("")
    add(f"| path | sequential: {s.stream_shards} shards × {s.stream_shard_bytes // MiB} MiB, "
        f"{s.stream_readers} readers, GB/s | per-shard p50 s | random 4 MiB × "
        f"{s.file_bytes // s.big_range} once each, {s.cold_random_conns} readers, GB/s | "
        "p50 / p99 ms | hub egress MiB (seq / random) | server CPU cores (seq / random) "
        "| errors |")
    add("|---|---|---|---|---|---|---|---|")
    for key in cold["stream"]:
        a, b = cold["stream"][key], cold["random"][key]
        eg = "/".join("-" if x["hub_egress"] is None else f"{x['hub_egress'] / MiB:,.0f}"
                      for x in (a, b))
        label = f"**{key}**" if key == "spoke" else key
        add(f"| {label} | {a['gb_s']:.3f} | {a['p50_ms'] / 1000:.2f} | {b['gb_s']:.3f} | "
            f"{_ms(b['p50_ms'])} / {_ms(b['p99_ms'])} | {eg} | "
            f"{a['server_cores']:.2f} / {b['server_cores']:.2f} | {a['errors'] + b['errors']} |")
    add("")
    add(f"Ratios: spoke ÷ nginx cache {r.stream_vs_nginx:.2f} (sequential), "
        f"{r.random_vs_nginx:.2f} (random); spoke ÷ bare link "
        f"{r.stream_vs_bare:.2f} / {r.random_vs_bare:.2f}. "
        "Client: aiohttp, the same for every row.")
    notes = cold["stream"]["spoke"]["notes"][:1] + cold["random"]["spoke"]["notes"][:1]
    if notes:
        add("Spoke counters after the first round of each cold test: " + "; ".join(notes)
            + f". GB/s per round: spoke {cold['stream']['spoke']['all_gb_s']} / "
            f"{cold['random']['spoke']['all_gb_s']}, nginx cache "
            f"{cold['stream']['nginx cache']['all_gb_s']} / "
            f"{cold['random']['nginx cache']['all_gb_s']}.")
    add("")
    return L


def _replay(rep: dict[str, Any], s: Settings) -> list[str]:
    L: list[str] = []
    add = L.append
    add("## 3. Training replay")
    add("")
    local: ReplayResult = rep["local"]
    spoke: ReplayResult = rep["spoke"]
    sm: ReplaySummary = rep["summary"]
    add(f"{s.replay_workers} workers, {s.replay_epochs} epochs (alternating: hub direct "
        f"epoch 1, spoke epoch 1, hub direct epoch 2, …) of "
        f"{sm.dataset_bytes // SAMPLE_BYTES:,} shuffled {SAMPLE_BYTES // 1024} KiB samples "
        f"({sm.dataset_bytes / MiB:,.0f} MiB in {s.replay_shards} shards), one range "
        "request per sample (aiohttp); the spoke starts empty. Plot: `warmup.png`.")
    add("")
    add("| summary | value |")
    add("|---|---|")
    add(f"| local (hub direct) samples/s, epochs 2+ | {sm.local_samples_per_s:,.0f} |")
    add(f"| cold phase (spoke, epoch 1) samples/s | {sm.cold_samples_per_s:,.0f} |")
    add(f"| warm (spoke, epochs 2+) samples/s | {sm.warm_samples_per_s:,.0f} |")
    add(f"| warm ÷ local | {sm.warm_over_local:.2f} |")
    t95 = "never" if sm.time_to_95pct_s is None else f"{sm.time_to_95pct_s:.1f} s"
    add(f"| time to 95 % of local (3 s trailing mean) | {t95} (first epoch took "
        f"{sm.first_epoch_s:.1f} s) |")
    t95e = ("never" if sm.time_to_95pct_same_epoch_s is None
            else f"{sm.time_to_95pct_same_epoch_s:.1f} s")
    add(f"| time to 95 % of local's rate in the same epoch (3 s trailing mean) | {t95e} |")
    hit = "n/a" if sm.hit_ratio_after_warmup is None else f"{sm.hit_ratio_after_warmup:.1%}"
    add(f"| hit ratio after warm-up (X-Cache, epochs 2+) | {hit} |")
    th = "never" if sm.time_to_hit95_s is None else f"{sm.time_to_hit95_s:.1f} s"
    add(f"| time until a second's X-Cache hit ratio ≥ 95 % | {th} |")
    he1 = "-" if sm.hub_bytes_first_epoch is None else f"{sm.hub_bytes_first_epoch / MiB:,.0f}"
    he2 = "-" if sm.hub_bytes_after_warmup is None else f"{sm.hub_bytes_after_warmup / MiB:,.0f}"
    add(f"| hub egress MiB: epoch 1 / epochs 2+ | {he1} / {he2} (dataset "
        f"{sm.dataset_bytes / MiB:,.0f}) |")
    sc = rep["server_cores"]
    add(f"| CPU cores over the whole replay: client / hub / spoke / other processes | "
        f"{rep['client_cores']:.2f} / {sc['hub']:.2f} / {sc['spoke']:.2f} / "
        f"{rep['background_cores']:.2f} |")
    add(f"| spoke RSS after the replay | {rep['spoke_rss_bytes'] / MiB:,.0f} MiB |")
    add("")
    add("| epoch | local samples/s | spoke samples/s | spoke HIT % | local p50 / p99 ms | "
        "spoke p50 / p99 ms | hub egress MiB |")
    add("|---|---|---|---|---|---|---|")
    for e in epoch_rows(local, spoke):
        eg = "-" if e.hub_bytes is None else f"{e.hub_bytes / MiB:,.0f}"
        add(f"| {e.epoch} | {e.local_samples_per_s:,.0f} | {e.spoke_samples_per_s:,.0f} | "
            f"{e.spoke_hit_pct:.1f} | {_ms(e.local_p50_ms)} / {_ms(e.local_p99_ms)} | "
            f"{_ms(e.spoke_p50_ms)} / {_ms(e.spoke_p99_ms)} | {eg} |")
    add("")
    add("Time series (per second of each side's own running time; epochs alternate "
        "between the two servers, L1 S1 L2 S2 …; `local` is the hub-direct rate in the same "
        "second of the same epoch):")
    add("")
    add("| s | epoch | spoke samples/s | local samples/s | spoke HIT % | spoke p50 ms | "
        "spoke p99 ms | hub egress MB/s |")
    add("|---|---|---|---|---|---|---|---|")
    for sec in second_rows(local, spoke):
        add(f"| {sec.t_end:.1f} | {sec.epoch} | {sec.spoke_samples_per_s:,.0f} | "
            f"{_opt(sec.local_samples_per_s, '{:,.0f}')} | {_opt(sec.hit_pct, '{:.1f}')} | "
            f"{'' if sec.p50_ms is None else _ms(sec.p50_ms)} | "
            f"{'' if sec.p99_ms is None else _ms(sec.p99_ms)} | {_opt(sec.hub_mb_s, '{:,.0f}')} |")
    add("")
    return L


def _batch(warm: dict[str, Any], answers: dict[str, Any], r: Ratios, s: Settings) -> list[str]:
    L: list[str] = []
    add = L.append
    small = warm["64KiB"]
    add(f"## 4. Batched multi-range reads ({s.batch} × 64 KiB samples per request, "
        f"{s.batch_conns} conns)")
    add("")
    batch = warm[f"batch{s.batch}x64KiB"]
    add("| server | request shape | samples/s | req/s | p50 / p99 ms | bytes per request | "
        "server CPU-s per GB | answer |")
    add("|---|---|---|---|---|---|---|---|")
    for key, label in (("hub direct", "hub direct"), ("spoke", "**spoke**"),
                       ("nginx cache", "nginx slice cache")):
        one, many = small[key], batch[key]
        ans = answers.get(key, {})
        answer = (f"{ans.get('status')} {ans.get('content_type', '').split(';')[0]}, "
                  f"Content-Length {ans.get('content_length', -1):,}")
        add(f"| {label} | 1 sample per request ({s.small_conns} conns) | "
            f"{one['samples_s']:,.0f} | {one['req_s']:,.0f} | {_ms(one['p50_ms'])} / "
            f"{_ms(one['p99_ms'])} | {one['bytes_per_request']:,.0f} | "
            f"{cpu_s_per_gb(one):.2f} | 206 single range |")
        if ans.get("status") == 206:
            shape = (f"{many['samples_s']:,.0f} | {many['req_s']:,.1f} | "
                     f"{_ms(many['p50_ms'])} / {_ms(many['p99_ms'])} | "
                     f"{many['bytes_per_request']:,.0f} | {cpu_s_per_gb(many):.2f}")
        else:
            shape = (f"{many['samples_s']:,.0f} ({many['requests']} answers completed in "
                     f"{many['rounds']} × {s.wrk_seconds:g} s; {many['gb_s']:.2f} GB/s of "
                     f"whole-object bytes moved) | {many['req_s']:,.1f} | - | - | "
                     f"{cpu_s_per_gb(many):.2f}")
        add(f"| {label} | {s.batch} samples per request ({s.batch_conns} conns) | "
            f"{shape} | {answer} |")
    add("")
    nginx_ans = answers.get("nginx cache", {})
    if nginx_ans.get("status") != 206:
        add(f"nginx with `slice` does not answer multi-range requests from its cache: it "
            f"answered {nginx_ans.get('status')} with the whole object "
            f"({nginx_ans.get('content_length', -1):,} bytes) for a {s.batch}-range request; "
            "its best way to serve a batch is one request per sample, which is what the "
            "target compares against.")
    add(f"Batching on the spoke: {r.batching_gain:.2f} × its one-request-per-sample samples/s.")
    add("")
    return L


def _profile(profile: dict[str, Any] | None) -> list[str]:
    L: list[str] = []
    add = L.append
    if profile:
        add("## Profile of the spoke (py-spy, warm 64 KiB × 64 conns)")
        add("")
        add(f"{profile['samples']} samples; top functions by own time:")
        add("")
        add("| own % | total % | function |")
        add("|---|---|---|")
        for row in profile["top"]:
            add(f"| {row['self_pct']:.1f} | {row['total_pct']:.1f} | `{row['frame']}` |")
        add("")
    return L
