"""The bench's cold stream cell alone, with the CPU each process of the path spends per GB.

    python -m loadtest.bench_cold_cpu [--rounds 4] [--readers 4] [--shards 8]
        [--shard-mib 128] [--pattern stream|random] [--side NAME=TREE[:FLAG,FLAG...]] ...
        [--relay] [--cache-root DIR]

``--readers`` loaders GET whole shards (``--pattern random``: every 4 MiB range of the
shards once, in random order, as the bench's cold random cell does with 16 readers)
through a 60 ms link, once through the bare link
(the hub, no cache) and once through each side's spoke, started empty. A side is a
checkout (``TREE``: its spoke runs that tree's code, as :mod:`loadtest.procs` starts it
there) and the spoke's flags; by default this checkout at its defaults. Rounds
interleave the sides, in turn forwards and backwards.

Each row gives the side's GB/s over the bare link's in the same round (median and each
round) and, per GB delivered, the CPU seconds of the client (this process), the hub,
the link (the Toxiproxy stand-in's processes, or none for a real one elsewhere) and the
spoke (all its processes; ``loop`` is its event loop's thread alone). On cores the path
shares, a side's ratio follows the inverse ratio of the totals: compare those, they
carry over to a loaded machine where GB/s do not.

``--relay`` adds a side where nginx stands in the spoke's place as a plain relay to the
same link (no cache, no disk, bytes passed on as they arrive; its processes in the
spoke's columns): what one more hop costs on these cores before a cache does anything.

The disk columns are the device under the caches' directory during the side's reads:
MB/s written and read, and how much of the time it had a request in flight. A cache
that stores all it serves cannot stream faster than that device writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

import psutil

import loadtest.procs as procs
from loadtest.bench import fetch_many
from loadtest.dataset import generate
from loadtest.lab import Lab
from loadtest.meter import DiskUse, cpu_seconds, disk_of, disk_use, process_tree, self_cpu
from loadtest.nginx import nginx_binary, start_nginx

MiB = 1 << 20
RANDOM_RANGE = 4 * MiB
BARE = "bare link"
RELAY = "nginx relay"
PARTS = ("client", "hub", "link", "spoke", "loop")


@dataclass
class Side:
    name: str
    tree: str
    flags: tuple[str, ...]
    gb_s: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)  # CPU-s per GB, by part
    hub_fetches: list[int] = field(default_factory=list)
    # Per round: the disk's MB/s written, MB/s read, and fraction of the time busy.
    disk: list[tuple[float, float, float]] = field(default_factory=list)


def parse_side(text: str) -> Side:
    name, _, rest = text.partition("=")
    tree, _, flags = rest.partition(":")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"--side NAME=TREE[:FLAGS], not {text!r}")
    return Side(name, os.path.abspath(tree), tuple(f for f in flags.split(",") if f))


def loop_thread_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s main thread (the spoke's event loop)."""
    try:
        for thread in psutil.Process(pid).threads():
            if thread.id == pid:
                return float(thread.user_time + thread.system_time)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0
    return 0.0


def sample(hub_pid: int, spoke_pid: int | None, relay_pid: int | None = None,
           relaying: bool = False) -> dict[str, float]:
    """CPU seconds so far, by part of the path: the relay's (never the link's) in the
    spoke's columns when it is the one ``relaying``."""
    ours = {hub_pid, spoke_pid, relay_pid, os.getpid()}
    link = [p for child in psutil.Process().children() if child.pid not in ours
            for p in process_tree(child.pid)]
    spoke = process_tree(spoke_pid) if spoke_pid else []
    relay = process_tree(relay_pid) if relay_pid and relaying else []
    return {"client": self_cpu(), "hub": cpu_seconds(process_tree(hub_pid)),
            "link": cpu_seconds(link), "spoke": cpu_seconds(spoke + relay),
            "loop": loop_thread_cpu(spoke_pid) if spoke_pid else 0.0}


def per_gb(before: dict[str, float], after: dict[str, float], nbytes: int) -> dict[str, float]:
    return {k: (after[k] - before[k]) / (nbytes / 1e9) for k in PARTS}


def disk_rates(used: DiskUse, seconds: float) -> tuple[float, float, float]:
    return (used.write_bytes / seconds / 1e6, used.read_bytes / seconds / 1e6,
            used.busy_ms / 1000 / seconds)


def total(cpu: dict[str, float]) -> float:
    """The path's CPU per GB (``loop`` is part of ``spoke``)."""
    return sum(v for k, v in cpu.items() if k != "loop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mib", type=int, default=128)
    parser.add_argument("--latency-ms", type=int, default=60)
    parser.add_argument("--pattern", choices=("stream", "random"), default="stream",
                        help="whole shards, or their 4 MiB ranges in random order")
    parser.add_argument("--side", action="append", type=parse_side, default=[],
                        help="NAME=TREE[:FLAGS]: a spoke from checkout TREE with FLAGS "
                             "(comma-separated); default: this checkout, no flags")
    parser.add_argument("--cache-root", default=None,
                        help="where the spokes' caches go (default: the run's temporary "
                             "directory); /dev/shm takes the disk out of the path")
    parser.add_argument("--relay", action="store_true",
                        help="a side through nginx as a plain relay (no cache) instead of a "
                             "spoke")
    args = parser.parse_args(argv)
    sides: list[Side] = args.side or [Side("spoke", procs.REPO, ())]
    if args.relay:
        if nginx_binary() is None:
            raise SystemExit("--relay needs nginx (apt-get install nginx)")
        sides.append(Side(RELAY, "", ()))
    bare = Side(BARE, procs.REPO, ())
    work = tempfile.mkdtemp(prefix="bench-cold-cpu-")
    repo = procs.REPO
    try:
        root = os.path.join(work, "data")
        shards = generate(root, args.shards, args.shard_mib * MiB, prefix="stream", seed=5)
        jobs: list[tuple[str, int, int | None]] = [(sh.path, 0, None) for sh in shards]
        if args.pattern == "random":
            jobs = [(sh.path, offset, RANDOM_RANGE) for sh in shards
                    for offset in range(0, sh.size - RANDOM_RANGE + 1, RANDOM_RANGE)]
            random.Random(7).shuffle(jobs)
        size = sum(sh.size for sh in shards)
        # Every byte of the shards once (random: their whole 4 MiB ranges).
        expected = size if args.pattern == "stream" else len(jobs) * RANDOM_RANGE
        with Lab(log_dir=work) as lab:
            hub = lab.hub(root, "--access-log", "off", "--log-level", "warning")
            spoke_link = lab.link(hub.url, latency_ms=args.latency_ms, name="cold-cpu-spoke")
            bare_link = lab.link(hub.url, latency_ms=args.latency_ms, name="cold-cpu-bare")
            relay = lab.enter(start_nginx((spoke_link.host, spoke_link.port))) \
                if args.relay else None
            disk = disk_of(args.cache_root or work)  # under the caches, for every round
            for rnd in range(args.rounds):
                order = [bare, *sides] if rnd % 2 == 0 else [*reversed(sides), bare]
                for side in order:
                    spoke = None
                    cache = ""
                    if side.name not in (BARE, RELAY):
                        cache = tempfile.mkdtemp(prefix=f"cache-{rnd}-",
                                                 dir=args.cache_root or work)
                        procs.REPO = side.tree  # its code, not this checkout's
                        try:
                            spoke = lab.spoke(spoke_link.url, cache, "--capacity",
                                              str(2 * size), *side.flags)
                        except BaseException:
                            shutil.rmtree(cache, ignore_errors=True)
                            raise
                        finally:
                            procs.REPO = repo
                    url = spoke.url if spoke else bare_link.url
                    relay_pid = relay.pid if relay is not None else None
                    relaying = side.name == RELAY and relay is not None
                    if relaying:
                        url = f"{relay.url}/relay"
                    disk0, t0 = (disk_use(disk) if disk else None), time.monotonic()
                    try:
                        before = sample(hub.pid, spoke.pid if spoke else None, relay_pid,
                                        relaying)
                        nbytes, seconds, errors, _ = asyncio.run(
                            fetch_many(f"{url}/objects", jobs, args.readers, 300))
                        after = sample(hub.pid, spoke.pid if spoke else None, relay_pid,
                                       relaying)
                        if disk and disk0:
                            side.disk.append(disk_rates(disk_use(disk) - disk0,
                                                        time.monotonic() - t0))
                        fetches = _stats(spoke.url).get("hub_fetches", 0) if spoke else 0
                    finally:
                        if spoke is not None:
                            lab.stop(spoke)
                            shutil.rmtree(cache, ignore_errors=True)
                    if errors or nbytes != expected:
                        raise SystemExit(f"{side.name}: {errors} errors, {nbytes} of "
                                         f"{expected} bytes")
                    side.gb_s.append(nbytes / seconds / 1e9)
                    side.cpu.append(per_gb(before, after, nbytes))
                    side.hub_fetches.append(fetches)
                    log(f"round {rnd + 1} {side.name:<12} {side.gb_s[-1]:.3f} GB/s, CPU-s/GB "
                        + " ".join(f"{k} {v:.2f}" for k, v in side.cpu[-1].items()))
                for side in sides:
                    side.ratios.append(side.gb_s[-1] / bare.gb_s[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(bare, sides, args, _loadavg()))
    return 0


def render(bare: Side, sides: list[Side], args: argparse.Namespace, loadavg: str) -> str:
    med = statistics.median
    what = "whole" if args.pattern == "stream" else "4 MiB ranges at random of"
    lines = [f"Cold {args.pattern}: {args.readers} readers, {args.shards} {what} "
             f"{args.shard_mib} MiB shards through {args.latency_ms} ms, {args.rounds} rounds "
             f"interleaved (load average after: {loadavg}). CPU seconds per GB delivered, "
             "medians.", "",
             "| side | flags | ÷ bare link | each round | GB/s | client | hub | link | spoke "
             "| spoke's loop | total | disk write MB/s | disk read MB/s | disk busy "
             "| hub fetches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for side in [bare, *sides]:
        cpu = {k: med(c[k] for c in side.cpu) for k in PARTS}
        ratio = f"{med(side.ratios):.2f}" if side.ratios else "1"
        each = " ".join(f"{r:.2f}" for r in side.ratios) or "-"
        lines.append(
            f"| {side.name} | `{' '.join(side.flags) or '(none)'}` | {ratio} | {each} | "
            f"{med(side.gb_s):.3f} | " + " | ".join(f"{cpu[k]:.2f}" for k in PARTS)
            + f" | {total(cpu):.2f} | " + _disk_cells(side.disk)
            + f" | {med(side.hub_fetches):.0f} |")
    return "\n".join(lines)


def _disk_cells(rounds: list[tuple[float, float, float]]) -> str:
    if not rounds:
        return "- | - | -"
    write, read, busy = (statistics.median(r[i] for r in rounds) for i in range(3))
    return f"{write:.0f} | {read:.0f} | {busy:.0%}"


def _stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as reply:
        doc: dict[str, int] = json.loads(reply.read())
        return doc


def _loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def log(msg: str) -> None:
    print(f"[bench_cold_cpu] {msg}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
