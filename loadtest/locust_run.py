"""Run the Locust load test against the demo setup, headless and bounded in time.

    python -m loadtest.locust_run --users 20 --spawn-rate 10 --run-time 20s --out reports/locust

It generates a dataset (4096-token samples packed in shards), starts a hub over
it, Toxiproxy (real or the project's stand-in) with a latency toxic in front of
the hub, and a spoke with an empty cache behind the link, all on 127.0.0.1. Then
it runs ``locust --headless`` with ``loadtest/locustfile.py`` against the spoke,
writes Locust's CSV (with per-second history) and HTML report to ``--out``, prints
a summary (requests, failures, hit ratio from the X-Cache counts over time and
from the spoke's ``/stats``), and stops everything it started by PID.

Exit status: 0 when every request succeeded, 1 when any failed (or Locust did).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.procs import REPO, Process
from protocol.sizes import parse_size

LOCUSTFILE = os.path.join(REPO, "loadtest", "locustfile.py")
# The request types the locustfile gives its pseudo-requests. Not imported from it:
# importing locust monkey-patches this process with gevent.
CACHE_EVENT = "cache"
VERIFY_EVENT = "verify"
CSV_PREFIX = "locust"
HTML_REPORT = "report.html"
# Locust needs a few seconds beyond --run-time to spawn, stop users and write reports.
LOCUST_GRACE_S = 60.0


@dataclass
class Summary:
    requests: int = 0  # HTTP requests (X-Cache and verify events excluded)
    failures: int = 0
    cache_hits: int = 0  # reads answered X-Cache: HIT
    cache_reads: int = 0  # reads with any X-Cache value
    verified: int = 0
    verify_failures: int = 0
    early_hit_ratio: float = 0.0  # X-Cache hit ratio over the first third of the run
    late_hit_ratio: float = 0.0  # ... and over the last third
    spoke_stats: dict[str, object] = field(default_factory=dict)
    locust_exit_code: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.cache_hits / self.cache_reads if self.cache_reads else 0.0

    @property
    def spoke_hit_ratio(self) -> float:
        hits, misses = self.spoke_stats.get("hits", 0), self.spoke_stats.get("misses", 0)
        assert isinstance(hits, int) and isinstance(misses, int)
        return hits / (hits + misses) if hits + misses else 0.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--spawn-rate", type=float, default=10)
    parser.add_argument("--run-time", default="20s", help="Locust's --run-time (e.g. 20s, 2m)")
    parser.add_argument("--out", default="reports/locust", help="directory for the reports")
    parser.add_argument("--data-dir", help="dataset directory to reuse (default: a temp dir)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-size", type=parse_size, default=16 << 20)
    parser.add_argument("--chunk-size", default="4MiB")
    parser.add_argument("--latency-ms", type=int, default=60, help="hub-spoke round trip")
    parser.add_argument("--capacity", type=parse_size,
                        help="spoke capacity (default: twice the dataset)")
    parser.add_argument("--verify-fraction", type=float, default=0.05)
    parser.add_argument("--shards-per-user", type=int, default=4)
    return parser.parse_args(argv)


def run_time_seconds(text: str) -> float:
    """Seconds of a Locust duration such as ``20s``, ``1m30s``, ``2h`` or ``45``."""
    if text.isdigit():
        return float(text)
    parts = re.fullmatch(r"(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?", text.strip())
    if parts is None or not any(parts.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
    h, m, s = (int(g or 0) for g in parts.groups())
    return float(3600 * h + 60 * m + s)


# ---------------------------------------------------------------------------- servers


@dataclass
class Setup:
    hub: Process
    spoke: Process
    hub_via_wan: str
    dataset_bytes: int


@contextmanager
def demo_setup(args: argparse.Namespace, log_dir: str) -> Iterator[Setup]:
    """Hub → Toxiproxy (latency) → spoke with a fresh cache; everything stopped at exit."""
    with Lab(log_dir=log_dir) as lab:
        data_dir = args.data_dir or lab.temp_dir("hubspoke-locust-data-")
        hub_root = os.path.join(data_dir, "hub")
        shards = generate(hub_root, args.shards, args.shard_size)
        dataset_bytes = sum(s.size for s in shards)
        cache_dir = lab.temp_dir("hubspoke-locust-cache-")
        hub = lab.hub(hub_root, "--chunk-size", args.chunk_size, "--access-log", "off")
        link = lab.link(hub.url, latency_ms=args.latency_ms)
        capacity = args.capacity or 2 * dataset_bytes
        spoke = lab.spoke(link.url, cache_dir, "--capacity", str(capacity), "--access-log", "off")
        yield Setup(hub, spoke, link.url, dataset_bytes)


def spoke_stats(spoke_url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{spoke_url}/stats", timeout=10) as resp:
        stats: dict[str, object] = json.load(resp)
        return stats


# ---------------------------------------------------------------------------- locust


def locust_command(args: argparse.Namespace, setup: Setup, out: str) -> list[str]:
    return [
        sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless",
        "--host", setup.spoke.url, "--users", str(args.users),
        "--spawn-rate", str(args.spawn_rate), "--run-time", args.run_time,
        "--csv", os.path.join(out, CSV_PREFIX), "--csv-full-history",
        "--html", os.path.join(out, HTML_REPORT), "--only-summary",
        "--exit-code-on-error", "1", "--loglevel", "WARNING",
        # Verification reads go to the hub directly: the reference, not the spoke's path.
        "--hub-url", setup.hub.url, "--verify-fraction", str(args.verify_fraction),
        "--shards-per-user", str(args.shards_per_user),
    ]


def run_locust(command: list[str], log_path: str, timeout_s: float) -> int:
    """Run Locust to completion (killed by PID past ``timeout_s``); its exit code."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
            print(f"locust did not finish within {timeout_s:.0f} s; stopped it", file=sys.stderr)
            return 124


# ---------------------------------------------------------------------------- reports


def read_totals(stats_csv: str, summary: Summary) -> None:
    """Fill request, failure, X-Cache and verify counts from ``locust_stats.csv``."""
    with open(stats_csv, newline="") as f:
        for row in csv.DictReader(f):
            kind, name = row["Type"], row["Name"]
            count, failed = int(row["Request Count"]), int(row["Failure Count"])
            if name == "Aggregated":
                continue
            if kind == CACHE_EVENT:
                summary.cache_reads += count
                summary.cache_hits += count if name == "X-Cache HIT" else 0
            elif kind == VERIFY_EVENT:
                summary.verified += count
                summary.verify_failures += failed
            else:
                summary.requests += count
                summary.failures += failed


def hit_ratio_timeline(history_csv: str) -> list[tuple[float, int, int]]:
    """(seconds since start, cumulative HIT reads, cumulative reads) per history row.

    ``--csv-full-history`` writes one row per name and interval with cumulative
    counts, so the X-Cache rows give the hit ratio over time.
    """
    per_time: dict[int, dict[str, int]] = {}
    with open(history_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["Type"] != CACHE_EVENT:
                continue
            per_time.setdefault(int(row["Timestamp"]), {})[row["Name"]] = int(
                row["Total Request Count"])
    if not per_time:
        return []
    start = min(per_time)
    timeline = []
    for ts in sorted(per_time):
        counts = per_time[ts]
        timeline.append((float(ts - start), counts.get("X-Cache HIT", 0), sum(counts.values())))
    return timeline


def phase_ratios(timeline: list[tuple[float, int, int]]) -> tuple[float, float]:
    """X-Cache hit ratio over the first and over the last third of the run."""
    if len(timeline) < 3:
        return 0.0, 0.0
    third = len(timeline) // 3
    _, early_hits, early_reads = timeline[third]
    _, h0, r0 = timeline[-third - 1]
    _, h1, r1 = timeline[-1]
    early = early_hits / early_reads if early_reads else 0.0
    late = (h1 - h0) / (r1 - r0) if r1 > r0 else 0.0
    return early, late


def write_timeline(path: str, timeline: list[tuple[float, int, int]]) -> None:
    """Per-interval hit ratio (not cumulative), the curve that should climb."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seconds", "reads", "hits", "hit_ratio"])
        previous = (0.0, 0, 0)
        for t, hits, reads in timeline:
            d_reads, d_hits = reads - previous[2], hits - previous[1]
            if d_reads > 0:
                writer.writerow([f"{t:.0f}", d_reads, d_hits, f"{d_hits / d_reads:.4f}"])
            previous = (t, hits, reads)


def print_summary(s: Summary, out: str) -> None:
    stats = s.spoke_stats
    print(f"requests {s.requests:,}  failures {s.failures:,}  "
          f"bytes verified on {s.verified:,} reads ({s.verify_failures} wrong)")
    print(f"X-Cache hit ratio: {s.hit_ratio:.1%} overall, {s.early_hit_ratio:.1%} in the first "
          f"third, {s.late_hit_ratio:.1%} in the last third")
    print(f"spoke /stats: chunk hit ratio {s.spoke_hit_ratio:.1%} (hits {stats.get('hits')}, "
          f"misses {stats.get('misses')}), hub fetches {stats.get('hub_fetches')}, "
          f"evictions {stats.get('evictions')}, used {stats.get('used_bytes')} of "
          f"{stats.get('capacity_bytes')} bytes")
    print(f"reports: {os.path.join(out, HTML_REPORT)}, {os.path.join(out, CSV_PREFIX)}_*.csv, "
          f"{os.path.join(out, 'hit_ratio.csv')}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = os.path.abspath(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    timeout_s = run_time_seconds(args.run_time) + LOCUST_GRACE_S
    summary = Summary()
    with demo_setup(args, log_dir) as setup:
        print(f"hub {setup.hub.url} -> toxiproxy {setup.hub_via_wan} ({args.latency_ms} ms) -> "
              f"spoke {setup.spoke.url}; {setup.dataset_bytes >> 20} MiB in {args.shards} "
              f"shards; locust: {args.users} users for {args.run_time}", flush=True)
        started = time.monotonic()
        summary.locust_exit_code = run_locust(
            locust_command(args, setup, out), os.path.join(log_dir, "locust.log"), timeout_s)
        summary.spoke_stats = spoke_stats(setup.spoke.url)
        print(f"(locust ran {time.monotonic() - started:.1f} s, exit code "
              f"{summary.locust_exit_code})")
    prefix = os.path.join(out, CSV_PREFIX)
    if not os.path.exists(f"{prefix}_stats.csv"):
        print(f"no Locust report written; see {log_dir}/locust.log", file=sys.stderr)
        return 1
    read_totals(f"{prefix}_stats.csv", summary)
    timeline = hit_ratio_timeline(f"{prefix}_stats_history.csv")
    write_timeline(os.path.join(out, "hit_ratio.csv"), timeline)
    summary.early_hit_ratio, summary.late_hit_ratio = phase_ratios(timeline)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({**asdict(summary), "hit_ratio": summary.hit_ratio,
                   "spoke_hit_ratio": summary.spoke_hit_ratio}, f, indent=2)
    print_summary(summary, out)
    failed = summary.failures or summary.verify_failures or summary.locust_exit_code
    return 1 if failed or summary.requests == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
