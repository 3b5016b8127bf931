"""The hub's warm rows alone: the hub and nginx serving the same file, side by side.

    python -m loadtest.bench_hub [--seconds 4 --rounds 2 --file-size 256MiB]
                                 [--hub-workers default,1,2,auto]

The same wrk scripts as :mod:`loadtest.bench` (random aligned ``Range`` reads of one
file, 4 MiB × 16 connections and 64 KiB × 64), in interleaved rounds over the hub's
``/objects/`` and nginx's ``/file/`` (nginx serving the file from disk: the client's
ceiling), with the file in the page cache. Prints one row per server (medians), the
hub ÷ nginx ratio the hub is held to (the median of each round's paired ratio), and
each server's CPU-seconds per GB sent (all of a server's processes). The hub runs with
its default ``--workers``; ``--hub-workers`` runs one hub per count given beside it
(``default`` for none given), each in every round, the order turned each round.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from dataclasses import asdict

from loadtest.bench import WrkRun, run_wrk, wrk_binary
from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.nginx import nginx_binary, start_nginx
from protocol.sizes import parse_size

BIG, SMALL = 4 << 20, 64 << 10
# The targets: hub ÷ nginx serving the file.
TARGETS = {"4MiB": 0.9, "64KiB": 0.6}
DEFAULT = "default"
NGINX = "nginx file"


def _worker_counts(text: str) -> list[str]:
    counts = [part.strip() for part in text.split(",") if part.strip()]
    for count in counts:
        if count not in (DEFAULT, "auto") and not (count.isdigit() and int(count) > 0):
            raise argparse.ArgumentTypeError(f"not a worker count: {count!r}")
    if not counts or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"each count once, at least one: {text!r}")
    return counts


def hub_name(workers: str) -> str:
    return "hub" if workers == DEFAULT else f"hub --workers {workers}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4, help="wrk seconds per cell")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per cell")
    parser.add_argument("--file-size", type=parse_size, default=256 << 20)
    parser.add_argument("--hub-workers", type=_worker_counts, default=[DEFAULT],
                        help="hubs to run, by --workers, comma-separated ('default': the "
                             "hub's own; 'auto', or a count)")
    parser.add_argument("--json", help="also write the runs to this JSON file")
    return parser.parse_args(argv)


def cpu_s_per_gb(run: WrkRun) -> float:
    """Server CPU-seconds spent per GB sent."""
    return run.server_cores / run.gb_s if run.gb_s else float("inf")


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[WrkRun]]]:
    runs: dict[str, dict[str, list[WrkRun]]] = {"4MiB": {}, "64KiB": {}}
    with tempfile.TemporaryDirectory(prefix="hubspoke-bench-hub-") as work, Lab() as lab:
        f = generate(work, 1, args.file_size, prefix="bench")[0]
        with open(f"{work}/{f.path}", "rb") as fh:
            while fh.read(8 << 20):
                continue  # into the page cache: these are the warm rows
        targets = []
        for workers in args.hub_workers:
            flags = [] if workers == DEFAULT else ["--workers", workers]
            hub = lab.hub(work, "--access-log", "off", "--log-level", "warning", *flags)
            targets.append((hub_name(workers), f"{hub.url}/objects/{f.path}", hub.pid))
        host, port = targets[0][1].removeprefix("http://").split("/")[0].split(":")
        nginx = lab.enter(start_nginx((host, int(port)), file_root=work))
        targets.append((NGINX, f"{nginx.url}/file/{f.path}", nginx.pid))
        tests = [("4MiB", BIG, 16), ("64KiB", SMALL, 64)]
        for rnd in range(args.rounds):
            turn = rnd % len(targets)
            order = targets[turn:] + targets[:turn]
            if rnd % 2:
                order.reverse()
            random.Random(rnd).shuffle(tests)
            for test, size, conns in tests:
                for name, url, pid in order:
                    run = run_wrk(name, test, url, "random_range.lua",
                                  [str(f.size), str(size), str(size), str(rnd + 1)],
                                  conns, args.seconds, 1, pid)
                    print(f"round {rnd + 1} {test:>6} {name:<18} {run.req_s:9,.0f} req/s "
                          f"{run.gb_s:6.2f} GB/s p99 {run.p99_ms:6.1f} ms server "
                          f"{run.server_cores:.2f} cores, {run.errors} errors",
                          file=sys.stderr, flush=True)
                    runs[test].setdefault(name, []).append(run)
    return runs


def report(runs: dict[str, dict[str, list[WrkRun]]]) -> list[str]:
    lines = ["| test | server | req/s | GB/s | p99 ms | CPU-s per GB | hub ÷ nginx (paired) "
             "| target |",
             "|---|---|---|---|---|---|---|---|"]
    for test, by_name in runs.items():
        med = {name: {k: statistics.median(getattr(r, k) for r in rs)
                      for k in ("req_s", "gb_s", "p99_ms")}
               | {"cpu": statistics.median(cpu_s_per_gb(r) for r in rs)}
               for name, rs in by_name.items()}
        # Each round ran every server once, close in time: the median of those paired ratios
        # is steadier on a shared machine than a ratio of medians.
        ratios = {name: statistics.median(
                      h.req_s / n.req_s if n.req_s else 0.0
                      for h, n in zip(rs, by_name[NGINX], strict=True))
                  for name, rs in by_name.items() if name != NGINX}
        for name, m in med.items():
            mine = name in ratios
            ratio = ratios.get(name, 0.0)
            verdict = "PASS" if ratio >= TARGETS[test] else "FAIL"
            lines.append(
                f"| {test} | {name} | {m['req_s']:,.0f} | {m['gb_s']:.2f} | {m['p99_ms']:.1f} | "
                f"{m['cpu']:.2f} | {f'{ratio:.2f}' if mine else ''} | "
                f"{f'≥ {TARGETS[test]}: {verdict}' if mine else ''} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if nginx_binary() is None or wrk_binary() is None:
        print("needs nginx and wrk on PATH (apt-get install -y nginx wrk)", file=sys.stderr)
        return 2
    runs = measure(args)
    print("\n".join(report(runs)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({t: {n: [asdict(r) for r in rs] for n, rs in by.items()}
                       for t, by in runs.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
