"""The demo: the seed's experiment in miniature. A training loop reads a dataset locally,
then through a narrow, distant link and a spoke, cold then warm, then cold with a plan.

    python -m loadtest.demo [--quick] [--link-mb-s 4 --latency-ms 60 --png FILE]

It generates a dataset (16 KiB token samples packed in shards) and starts a hub over
it, a WAN link in front of the hub (Toxiproxy, real or the project's stand-in: a
latency and a per-connection bandwidth cap) and a spoke with an empty cache behind
the link. The same training loop (:mod:`loadtest.demo_training`: loader workers
reading shuffled samples by HTTP range, a simulated GPU taking a batch per step)
then runs four epochs:

1. **local**: against the hub itself, no link: the data next to the GPUs, read
   through the same HTTP loader (the hub serves its page-cached files on its fast
   path), which is what "local" means below;
2. **spoke, cold**: through the link, the cache empty;
3. **spoke, warm**: the same spoke again;
4. **spoke, cold + plan**: a new spoke with an empty cache, the epoch's read order
   registered first (``POST /plans``), so it fetches ahead in that order.

A progress line runs meanwhile; at the end, a per-second timeline (samples/s, GPU
busy, hit ratio, hub egress, p99 read latency), a table per epoch, a PNG of the
timeline when matplotlib imports, and one line setting the seed's figures beside
the demo's. Everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from loadtest.dataset import SAMPLE_BYTES, Shard, generate
from loadtest.demo_training import FAST_READ_S, Phase, train
from loadtest.lab import Lab
from loadtest.loader import epoch_order, register_plan
from loadtest.procs import Process
from loadtest.quantiles import quantile
from loadtest.tier import free_ports, start_spoke, wait_up, write_secret
from protocol.sizes import parse_size

# What the seed reported (its experiment at full scale: 8 GPUs, a 30 ms WAN).
SEED = ("seed: cold 95–105 samples/s, GPUs 80–90 % busy; warm 115–117 = local; "
        "94–96 % of reads from NVMe under 5 ms")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="demo-data", help="where the dataset is generated")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-size", type=parse_size, default=12 << 20)
    parser.add_argument("--chunk-size", default="1MiB", help="the hub's chunk size")
    parser.add_argument("--workers", type=int, default=16, help="loader workers")
    parser.add_argument("--batch", type=int, default=32, help="samples per GPU step")
    parser.add_argument("--step-ms", type=float, default=32.0,
                        help="GPU time per step: sets the local rate (batch / step)")
    parser.add_argument("--latency-ms", type=int, default=60, help="hub-spoke round trip")
    parser.add_argument("--link-mb-s", type=float, default=4.0,
                        help="the link's bandwidth cap, MB/s per connection (0: none)")
    parser.add_argument("--quick", action="store_true",
                        help="a small dataset and a fast GPU: a check of the machinery")
    parser.add_argument("--png", help="the timeline's PNG, if matplotlib imports ('' for "
                        "none; default: timeline.png in --data-dir)")
    parser.add_argument("--spokes", type=int, default=1,
                        help="the cold and warm epochs read through a tier of this many spokes "
                        "(--peers), each serving a share of the loader's workers, as the nodes "
                        "of a cluster would; the planned epoch reads through one new spoke")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.spokes < 1:
        parser.error("--spokes must be 1 or more")
    if args.png is None:
        args.png = os.path.join(args.data_dir, "timeline.png")
    if args.quick:
        args.shards, args.shard_size, args.step_ms, args.workers = 2, 2 << 20, 4.0, 8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hub_root = os.path.join(args.data_dir, "hub")
    step("dataset", f"{args.shards} shards of {args.shard_size / (1 << 20):g} MiB in {hub_root}")
    shards = generate(hub_root, args.shards, args.shard_size)
    dataset_bytes = sum(s.size for s in shards)
    rate = args.batch / (args.step_ms / 1000)
    # The servers' logs go with the run (one that fails to start raises with its log).
    with tempfile.TemporaryDirectory(prefix="hubspoke-demo-logs-") as logs, \
            Lab(log_dir=logs) as lab:
        cache_dir = lab.temp_dir("hubspoke-demo-cache-")
        hub = lab.hub(hub_root, "--chunk-size", args.chunk_size, "--access-log", "off")
        link = lab.link(hub.url, latency_ms=args.latency_ms,
                        bandwidth_kb_s=round(args.link_mb_s * 1000))
        cap = f"{args.link_mb_s:g} MB/s per connection" if args.link_mb_s else "no cap"
        # In a tier, X-Cache says HIT for chunks in the spoke that answered; chunks that
        # spoke had from a peer count as misses there, though they never crossed the link.
        tier = (f"a tier of {args.spokes} spokes (a peer's chunk is a miss in the hit ratio)"
                if args.spokes > 1 else "spoke")
        step("servers", f"hub {hub.url} -> link {link.url} ({args.latency_ms} ms, {cap}) "
                        f"-> {tier}")
        spokes = start_spokes(lab, link.url, cache_dir, args.spokes, 2 * dataset_bytes)

        def second_spoke() -> str:
            for spoke in spokes:
                lab.stop(spoke)
            spokes.append(lab.spoke(link.url, os.path.join(cache_dir, "planned"),
                                    "--capacity", str(2 * dataset_bytes)))
            return spokes[-1].url

        step("training", f"{len(shards) * shards[0].samples:,} samples of "
                         f"{SAMPLE_BYTES // 1024} KiB per epoch, {args.workers} workers, GPU "
                         f"at {rate:,.0f} samples/s ({args.batch} per {args.step_ms:g} ms step)")
        started = time.perf_counter()
        phases = asyncio.run(run_epochs(args, hub.url, [p.url for p in spokes], second_spoke,
                                        shards))
        elapsed = time.perf_counter() - started
    print()
    print("\n".join(timeline(phases)))
    print()
    print("\n".join(epochs_table(phases)))
    print()
    print(SEED)
    print(demo_line(phases))
    png = args.png and plot(phases, args.png, rate)
    summary = {**figures(phases, dataset_bytes, rate), "spokes": args.spokes}
    print(f"(four epochs in {elapsed:.1f} s{'; timeline in ' + png if png else ''})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 1 if summary["errors"] else 0


def start_spokes(lab: Lab, hub_url: str, cache_dir: str, n: int, capacity: int) -> list[Process]:
    """One spoke, or a tier of ``n``: each chunk crosses the link once, from its owner."""
    if n == 1:
        return [lab.spoke(hub_url, os.path.join(cache_dir, "a"), "--capacity", str(capacity))]
    ports = free_ports(n)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    secret = write_secret(lab.temp_dir("hubspoke-demo-tier-"))
    spokes = [start_spoke(lab, hub_url, os.path.join(cache_dir, f"tier-{i}"), capacity, urls, i,
                          ports, secret) for i in range(n)]
    asyncio.run(wait_tier_up(urls))
    return spokes


async def wait_tier_up(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_up(session, urls)


def step(name: str, what: str) -> None:
    print(f"== {name}: {what}", flush=True)


async def run_epochs(
    args: argparse.Namespace, hub: str, spoke: list[str], second_spoke: Callable[[], str],
    shards: list[Shard],
) -> list[Phase]:
    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=args.workers + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        egress = hub_egress(session, hub)
        common: dict[str, Any] = {"workers": args.workers, "batch": args.batch,
                                  "step_s": args.step_ms / 1000, "hub_egress": egress,
                                  "progress": progress_line}
        phases = [
            await train("local", hub, epoch_order(shards, 1), session, **common),
            await train("spoke cold", spoke, epoch_order(shards, 2), session, **common),
            await train("spoke warm", spoke, epoch_order(shards, 3), session, **common),
        ]
        planned = await asyncio.to_thread(second_spoke)
        order = epoch_order(shards, 4)
        plan = await register_plan(planned, order, session)
        phases.append(await train("cold + plan", planned, order, session, plan=plan, **common))
    return phases


def hub_egress(session: aiohttp.ClientSession, hub: str) -> Callable[[], Awaitable[int | None]]:
    async def read() -> int | None:
        try:
            async with session.get(f"{hub}/metrics") as resp:
                text = await resp.text()
        except aiohttp.ClientError:
            return None
        for line in text.splitlines():
            if line.startswith("hub_bytes_sent_total "):
                return int(float(line.split()[1]))
        return None

    return read


def progress_line(phase: Phase, done: int, total: int) -> None:
    now = time.perf_counter() - phase.started
    text = (f"  {phase.name:<12} {now:5.1f} s  {done:>7,}/{total:,} samples  "
            f"{done / now if now else 0:7,.0f} samples/s")
    hits = phase.hit_ratio
    if hits is not None and phase.name != "local":
        text += f"  hit {hits:4.0%}"
    if sys.stdout.isatty():
        end = "\n" if done == total else ""
        print(f"\r{text}   ", end=end, flush=True)
    elif done == total:
        print(text, flush=True)


def timeline(phases: list[Phase]) -> list[str]:
    """A row per second of every epoch."""
    lines = ["| epoch | s | samples/s | GPU busy | hit ratio | hub egress MB/s | p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for phase in phases:
        for sec in phase.series:
            hits = "-" if sec.hit_ratio is None or phase.name == "local" \
                else f"{sec.hit_ratio:.0%}"
            egress = "-" if sec.hub_bytes is None else f"{sec.hub_bytes / 1e6:.1f}"
            p99 = sec.p99_ms()
            lines.append(f"| {phase.name} | {sec.t} | {sec.samples:,} | "
                         f"{min(1.0, sec.busy_s):.0%} | {hits} | {egress} | "
                         f"{'-' if p99 is None else f'{p99:.1f}'} |")
    return lines


def epochs_table(phases: list[Phase]) -> list[str]:
    local = phases[0].samples_per_s
    lines = ["| epoch | samples/s | ÷ local | GPU busy | hit ratio | reads < 5 ms | p99 ms | "
             "hub egress MB | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for p in phases:
        hits = "-" if p.hit_ratio is None or p.name == "local" else f"{p.hit_ratio:.1%}"
        egress = sum(s.hub_bytes or 0 for s in p.series) / 1e6
        lat = p.latencies()
        p99 = 1000 * quantile(lat, 0.99) if lat else 0.0
        lines.append(f"| {p.name} | {p.samples_per_s:,.0f} | {p.samples_per_s / local:.2f} | "
                     f"{p.gpu_busy:.0%} | {hits} | {p.fast_reads():.0%} | {p99:.1f} | "
                     f"{egress:,.0f} | {p.errors} |")
    return lines


def demo_line(phases: list[Phase]) -> str:
    local, cold, warm, planned = phases
    return (f"demo: cold {cold.samples_per_s:,.0f} samples/s, GPU {cold.gpu_busy:.0%} busy "
            f"(with a plan {planned.samples_per_s:,.0f}, {planned.gpu_busy:.0%}); warm "
            f"{warm.samples_per_s:,.0f} = {warm.samples_per_s / local.samples_per_s:.2f} × "
            f"local {local.samples_per_s:,.0f}; {warm.fast_reads():.0%} of warm reads "
            f"under {FAST_READ_S * 1000:.0f} ms")


def figures(phases: list[Phase], dataset_bytes: int, rate: float) -> dict[str, Any]:
    local, cold, warm, planned = phases
    return {
        "dataset_mb": dataset_bytes / 1e6,
        "gpu_samples_per_s": rate,
        **{f"{key}_samples_per_s": p.samples_per_s for key, p in
           (("local", local), ("cold", cold), ("warm", warm), ("planned", planned))},
        **{f"{key}_gpu_busy": p.gpu_busy for key, p in
           (("local", local), ("cold", cold), ("warm", warm), ("planned", planned))},
        "warm_over_local": warm.samples_per_s / max(local.samples_per_s, 1e-9),
        "cold_over_local": cold.samples_per_s / max(local.samples_per_s, 1e-9),
        "planned_over_local": planned.samples_per_s / max(local.samples_per_s, 1e-9),
        "warm_hit_ratio": warm.hit_ratio,
        "warm_fast_reads": warm.fast_reads(),
        "cold_hub_egress_mb": sum(s.hub_bytes or 0 for s in cold.series) / 1e6,
        "warm_hub_egress_mb": sum(s.hub_bytes or 0 for s in warm.series) / 1e6,
        "errors": sum(p.errors for p in phases),
    }


def plot(phases: list[Phase], path: str, rate: float) -> str | None:
    """The timeline as a PNG at ``path``; None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    t0 = 0.0
    for phase in phases:
        xs = [t0 + s.t + 0.5 for s in phase.series]
        axes[0].plot(xs, [s.samples for s in phase.series], lw=2, label=phase.name)
        if phase.name != "local":  # no cache there
            axes[1].plot(xs, [100 * (s.hit_ratio or 0) for s in phase.series], lw=1.5)
        axes[2].bar(xs, [(s.hub_bytes or 0) / 1e6 for s in phase.series], width=0.9)
        axes[3].plot(xs, [s.p99_ms() or 0 for s in phase.series], lw=1.5)
        for ax in axes:
            ax.axvline(t0, color="gray", lw=0.6, ls=":")
        t0 += len(phase.series)
    axes[0].axhline(rate, color="gray", ls="--", lw=1, label="the GPU's rate")
    axes[0].set_ylabel("samples/s")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=8, loc="lower right")
    axes[0].set_title("hubspoke demo: local, then cold, warm and planned through the link")
    axes[1].set_ylabel("hit ratio %")
    axes[1].set_ylim(0, 105)
    axes[2].set_ylabel("hub egress MB/s")
    axes[3].set_ylabel("read p99 ms")
    axes[3].set_yscale("symlog", linthresh=10)
    axes[3].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
