"""The spoke's configurations side by side against nginx: ``python -m loadtest.bench_defaults``.

    python -m loadtest.bench_defaults [--rounds 3] [--seconds 5] [--file-mib 256]

A hub behind a 60 ms link per cache (as in :mod:`loadtest.bench`), nginx's slice cache and
one spoke cache directory, both warmed once; then, rounds interleaved (each round in
another order), nginx and the spoke restarted on its warm directory in each
configuration, each measured with the bench's warm 64 KiB wrk cell (64 connections).
Prints a Markdown table of each configuration's median samples/s, p99, its ratio to
nginx's in the same rounds, and the server's CPU time per request. The configurations:

* the defaults before issue 26 (``--workers 1 --access-log on --meta-ttl 5``);
* the defaults (no tuning flag);
* the tuning the bench used before (``--workers auto --access-log off --meta-ttl 3600``).

``--set access-log`` measures instead the access log's modes (on, buffered, off) in one
process each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import urllib.request

from loadtest.bench import run_wrk, wrk_binary
from loadtest.bench_workers import warm
from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.nginx import nginx_binary, start_nginx

MiB = 1 << 20
SAMPLE = 64 << 10
CONNS = 64
CONFIGS = {
    "old defaults": ("--workers", "1", "--access-log", "on", "--meta-ttl", "5"),
    "defaults": (),
    "old tuned": ("--workers", "auto", "--access-log", "off", "--meta-ttl", "3600"),
}
# --set access-log: the access log's cost alone, in one process (no worker count to vary
# with how busy the machine's other processes keep its cores).
ACCESS_LOG_CONFIGS = {
    f"access log {mode}": ("--workers", "1", "--access-log", mode)
    for mode in ("on", "buffered", "off")
}
SETS = {"defaults": CONFIGS, "access-log": ACCESS_LOG_CONFIGS}
NGINX = "nginx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--set", choices=SETS, default="defaults",
                        help="the configurations: the defaults old and new, or the access "
                             "log's modes in one process")
    args = parser.parse_args(argv)
    configs = SETS[args.set]
    if wrk_binary() is None or nginx_binary() is None:
        print("needs wrk and nginx on PATH (apt-get install -y nginx wrk)", file=sys.stderr)
        return 2
    size = args.file_mib * MiB
    results: dict[str, list[tuple[float, float, float]]] = {}
    load = [os.getloadavg()[0]]
    with Lab() as lab:
        work = lab.temp_dir("hubspoke-defaults-")
        root = os.path.join(work, "data")
        big = generate(root, 1, size, prefix="big")[0]
        hub = lab.hub(root, "--access-log", "off", "--log-level", "warning")
        spoke_link = lab.link(hub.url, name="defaults-spoke")
        nginx_link = lab.link(hub.url, name="defaults-nginx")
        nginx = lab.enter(start_nginx((nginx_link.host, nginx_link.port),
                                      cache_max_bytes=2 * size))
        cache_dir = os.path.join(work, "cache")
        spoke = lab.spoke(spoke_link.url, cache_dir, "--capacity", str(2 * size))
        try:
            warm(spoke, big.path, size)
        finally:
            lab.stop(spoke)
        warm_nginx(nginx.url, big.path, size)
        names = [NGINX, *configs]
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                script_args = [str(size), str(SAMPLE), str(rnd + 1)]
                if name == NGINX:
                    run = run_wrk(NGINX, "64 KiB", f"{nginx.url}/objects/{big.path}",
                                  "random_range.lua", script_args, CONNS, args.seconds, 1,
                                  nginx.pid)
                else:
                    spoke = lab.spoke(spoke_link.url, cache_dir, "--capacity", str(2 * size),
                                      *configs[name])
                    try:
                        run = run_wrk(name, "64 KiB", f"{spoke.url}/objects/{big.path}",
                                      "random_range.lua", script_args, CONNS, args.seconds,
                                      1, spoke.pid)
                    finally:
                        lab.stop(spoke)
                # CPU per request: what carries to a machine whose cores are busy anyway.
                cpu_us = 1e6 * run.server_cores / max(run.req_s, 1e-9)
                results.setdefault(name, []).append((run.samples_s, run.p99_ms, cpu_us))
                print(f"round {rnd + 1} {name:>13}: {run.samples_s:,.0f} samples/s, "
                      f"p99 {run.p99_ms:.1f} ms, {cpu_us:.0f} CPU us/request, "
                      f"errors {run.errors}", file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    print(render(results, configs, args, load))
    return 0


def warm_nginx(url: str, path: str, size: int) -> None:
    """Read the whole file through nginx once, so each of its slices is cached."""
    step = 64 * MiB
    for offset in range(0, size, step):
        request = urllib.request.Request(
            f"{url}/objects/{path}",
            headers={"Range": f"bytes={offset}-{min(size, offset + step) - 1}"})
        with urllib.request.urlopen(request, timeout=300) as reply:
            while reply.read(MiB):
                continue


def render(
    results: dict[str, list[tuple[float, float, float]]], configs: dict[str, tuple[str, ...]],
    args: argparse.Namespace, load: list[float],
) -> str:
    base = statistics.median(r[0] for r in results[NGINX])
    lines = [f"warm 64 KiB x {CONNS} conns, {args.rounds} interleaved round(s) of "
             f"{args.seconds:g} s, medians; load average {load[0]:.2f} before, "
             f"{load[1]:.2f} after", "",
             "| server | flags | samples/s | p99 ms | ÷ nginx | server CPU µs/request |",
             "|---|---|---|---|---|---|"]
    for name, runs in results.items():
        rate = statistics.median(r[0] for r in runs)
        flags = "" if name == NGINX else (" ".join(configs[name]) or "(none)")
        lines.append(f"| {name} | {flags} | {rate:,.0f} | "
                     f"{statistics.median(r[1] for r in runs):.1f} | {rate / base:.2f} | "
                     f"{statistics.median(r[2] for r in runs):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
