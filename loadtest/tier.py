"""A regional tier of spokes against one hub: ``python -m loadtest.tier [--quick] --out DIR``.

N spokes (``python -m spoke serve --peers ...``) on 127.0.0.1, each behind its own 60 ms
Toxiproxy link to one hub (:class:`loadtest.lab.Lab`), and a loader per spoke reading the
whole dataset chunk by chunk in its own shuffled order. Reported (``tier.json`` and
``tier.md`` in ``--out``):

- hub egress ÷ dataset for each N, cold caches big enough for the dataset: the tier's
  single-flight across spokes (independent spokes would cost N);
- the hit ratio of a second pass with the dataset three times one spoke's capacity, on four
  spokes (``--hit-spokes``): the tier's cache is the sum of its spokes';
- p50 and p99 of a peer hit, a local hit and a hub miss, as the loaders saw them;
- one spoke SIGKILLed a third of the way through a cold pass: the other loaders' failed
  reads and the egress beyond the dataset (at most the dead spoke's share, the chunks it
  had fetched and took with it).

Every server listens on 127.0.0.1 only and is stopped by PID; every pass is bounded in
reads and in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import aiohttp

from loadtest.dataset import Shard, generate
from loadtest.lab import Lab
from loadtest.procs import Process, start_process
from loadtest.quantiles import quantile
from protocol.placement import chunk_key, owner

SECRET = "loadtest-tier-secret-0123456789abcdef"
LATENCY_MS = 60
PASS_TIMEOUT_S = 900.0
READERS_PER_LOADER = 8
LATENCY_READS = 64  # per spoke, one at a time


@dataclass
class Sizes:
    chunk: int
    shards: int
    shard_bytes: int

    @property
    def dataset(self) -> int:
        return self.shards * self.shard_bytes


QUICK = Sizes(chunk=1 << 20, shards=16, shard_bytes=3 << 20)
FULL = Sizes(chunk=1 << 20, shards=32, shard_bytes=6 << 20)


@dataclass
class Reads:
    """One loader's pass: reads made, failed, and their latencies by where they came from."""

    done: int = 0
    failed: int = 0
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, s: float) -> None:
        self.seconds.setdefault(kind, []).append(s)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def chunk_reads(shards: Sequence[Shard], chunk: int, seed: int) -> list[tuple[str, int, int]]:
    """Every chunk of the dataset as (path, start, length), shuffled by ``seed``."""
    reads = [(s.path, off, min(chunk, s.size - off)) for s in shards
             for off in range(0, s.size, chunk)]
    random.Random(seed).shuffle(reads)
    return reads


async def hub_sent(http: aiohttp.ClientSession, hub_url: str) -> int:
    async with http.get(f"{hub_url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("hub_bytes_sent_total "):
            return int(float(line.split()[1]))
    raise RuntimeError("the hub's /metrics has no hub_bytes_sent_total")


async def spoke_stats(http: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with http.get(f"{url}/stats") as resp:
        doc = await resp.json()
    assert isinstance(doc, dict)
    return doc


def up_count(doc: dict[str, object]) -> int:
    peers = doc.get("peers")
    assert isinstance(peers, list)
    return sum(p["state"] in ("up", "self") for p in peers)


async def wait_up(http: aiohttp.ClientSession, urls: list[str], timeout_s: float = 60) -> None:
    """Until every spoke sees every other one up."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(aiohttp.ClientError):  # a spoke still starting
            docs = [await spoke_stats(http, u) for u in urls]
            if all(up_count(d) == len(urls) for d in docs):
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the tier did not come up")
        await asyncio.sleep(0.1)


async def run_loader(
    http: aiohttp.ClientSession, url: str, reads: list[tuple[str, int, int]],
    classify: dict[str, str] | None, etags: dict[str, str], members: dict[str, float],
    out: Reads, milestone: tuple[int, asyncio.Event] | None = None,
    readers: int = READERS_PER_LOADER,
) -> None:
    """Read every (path, start, length) through the spoke at ``url``, ``readers`` at a time.
    ``classify``: a kind for every read ('miss' on a cold pass); None: by the chunk's owner
    ('local' if it is this spoke, else 'peer')."""
    queue = list(reversed(reads))
    chunk = reads[0][2] if reads else 1

    async def reader() -> None:
        while queue:
            path, start, length = queue.pop()
            began = time.perf_counter()
            try:
                headers = {"Range": f"bytes={start}-{start + length - 1}"}
                async with http.get(f"{url}/objects/{path}", headers=headers) as resp:
                    body = await resp.read()
                    ok = resp.status == 206 and len(body) == length
                    etags.setdefault(path, resp.headers.get("ETag", ""))
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            took = time.perf_counter() - began
            out.done += 1
            if milestone is not None and out.done >= milestone[0]:
                milestone[1].set()
            if not ok:
                out.failed += 1
                continue
            if classify is not None:
                kind = classify.get(path, "miss")
            else:
                who = owner(members, chunk_key(path, etags[path], start // chunk))
                kind = "local" if who == url else "peer"
            out.add(kind, took)

    await asyncio.wait_for(asyncio.gather(*(reader() for _ in range(readers))),
                           PASS_TIMEOUT_S)


def start_tier(lab: Lab, hub: Process, n: int, sizes: Sizes, capacity: int, tag: str,
               secret_file: str) -> tuple[list[Process], list[str], list[int]]:
    ports = free_ports(n)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    for i in range(n):
        link = lab.link(hub.url, latency_ms=LATENCY_MS, name=f"tier-{tag}-{i}")
        procs.append(start_spoke(lab, link.url, lab.temp_dir(f"tier-{tag}-{i}-"), capacity,
                                 urls, i, ports, secret_file))
    return procs, urls, ports


# Set from --keep-copies: non-owners keep copies of the chunks they fetch from owners.
SPOKE_FLAGS: list[str] = []


def start_spoke(lab: Lab, hub_url: str, cache_dir: str, capacity: int, urls: list[str],
                i: int, ports: list[int], secret_file: str) -> Process:
    proc = start_process("spoke", [*SPOKE_FLAGS,
        "--hub", hub_url, "--cache-dir", cache_dir, "--capacity", str(capacity),
        "--peers", ",".join(urls), "--advertise", urls[i], "--peer-secret-file", secret_file,
        "--peer-refresh", "1", "--log-level", "warning", "--scrub-rate", "0",
    ], log_dir=lab.log_dir, port=ports[i])
    lab.processes.append(proc)
    lab.callback(lab.stop, proc)
    return proc


def quantiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    return {"n": len(ordered), "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * quantile(ordered, 0.99)}


async def egress_for(lab: Lab, hub: Process, n: int, shards: list[Shard], sizes: Sizes,
                     secret_file: str, http: aiohttp.ClientSession) -> dict[str, object]:
    """N spokes, cold, each able to hold the dataset; a loader per spoke reads all of it."""
    procs, urls, _ = start_tier(lab, hub, n, sizes, 2 * sizes.dataset, f"e{n}", secret_file)
    await wait_up(http, urls)
    before = await hub_sent(http, hub.url)
    loads = [Reads() for _ in urls]
    etags: dict[str, str] = {}
    began = time.perf_counter()
    # One spoke alone reads one chunk at a time: its reads time plain hub misses, with
    # nothing else on the machine's two cores.
    readers = 1 if n == 1 else READERS_PER_LOADER
    await asyncio.gather(*(
        run_loader(http, url, chunk_reads(shards, sizes.chunk, seed=i), {}, etags, {}, loads[i],
                   readers=readers)
        for i, url in enumerate(urls)))
    took = time.perf_counter() - began
    egress = await hub_sent(http, hub.url) - before
    docs = [await spoke_stats(http, u) for u in urls]
    for proc in procs:
        lab.stop(proc)
    return {
        "spokes": n, "dataset_bytes": sizes.dataset, "hub_egress_bytes": egress,
        "egress_over_dataset": egress / sizes.dataset, "seconds": took,
        "reads": sum(r.done for r in loads), "failed_reads": sum(r.failed for r in loads),
        "peer_bytes": sum(int(str(d["peer_bytes"])) for d in docs),
        "hub_miss": quantiles([s for r in loads for s in r.seconds.get("miss", [])]),
    }


async def hit_ratio(lab: Lab, hub: Process, n: int, shards: list[Shard], sizes: Sizes,
                    secret_file: str, http: aiohttp.ClientSession) -> dict[str, object]:
    """Dataset = 3 × one spoke's capacity on ``n`` spokes: a warm-up pass, then a measured
    one, whose hit ratio is 1 - hub bytes ÷ bytes read."""
    capacity = sizes.dataset // 3
    procs, urls, _ = start_tier(lab, hub, n, sizes, capacity, f"h{n}", secret_file)
    await wait_up(http, urls)
    etags: dict[str, str] = {}
    warm = [Reads() for _ in urls]
    await asyncio.gather(*(
        run_loader(http, url, chunk_reads(shards, sizes.chunk, seed=10 + i), {}, etags, {},
                   warm[i]) for i, url in enumerate(urls)))
    members = {u: float(capacity) for u in urls}
    before = await hub_sent(http, hub.url)
    loads = [Reads() for _ in urls]
    await asyncio.gather(*(
        run_loader(http, url, chunk_reads(shards, sizes.chunk, seed=20 + i), None, etags,
                   members, loads[i]) for i, url in enumerate(urls)))
    egress = await hub_sent(http, hub.url) - before
    read = len(urls) * sizes.dataset
    # Latency, apart: one spoke at a time, one chunk at a time, so that the two cores'
    # contention does not stand in for where a chunk came from.
    timed = [Reads() for _ in urls]
    for i, url in enumerate(urls):
        sample = chunk_reads(shards, sizes.chunk, seed=40 + i)[:LATENCY_READS]
        await run_loader(http, url, sample, None, etags, members, timed[i], readers=1)
    docs = [await spoke_stats(http, u) for u in urls]
    for proc in procs:
        lab.stop(proc)
    return {
        "spokes": n, "capacity_bytes_each": capacity, "dataset_bytes": sizes.dataset,
        "hub_egress_bytes_second_pass": egress, "hit_ratio": 1 - egress / read,
        "failed_reads": sum(r.failed for r in loads) + sum(r.failed for r in warm),
        "used_bytes": [d["used_bytes"] for d in docs],
        "failed_timed_reads": sum(r.failed for r in timed),
        "local_hit": quantiles([s for r in timed for s in r.seconds.get("local", [])]),
        "peer_hit": quantiles([s for r in timed for s in r.seconds.get("peer", [])]),
        "loaded_local_hit": quantiles([s for r in loads for s in r.seconds.get("local", [])]),
        "loaded_peer_hit": quantiles([s for r in loads for s in r.seconds.get("peer", [])]),
    }


async def kill_one(lab: Lab, hub: Process, n: int, shards: list[Shard], sizes: Sizes,
                   secret_file: str, http: aiohttp.ClientSession) -> dict[str, object]:
    """A cold pass on ``n`` spokes; the last one is SIGKILLed a third of the way through."""
    procs, urls, _ = start_tier(lab, hub, n, sizes, 2 * sizes.dataset, f"k{n}", secret_file)
    await wait_up(http, urls)
    before = await hub_sent(http, hub.url)
    loads = [Reads() for _ in urls]
    etags: dict[str, str] = {}
    reads = [chunk_reads(shards, sizes.chunk, seed=30 + i) for i in range(n)]
    third = asyncio.Event()
    tasks = [asyncio.create_task(run_loader(
        http, url, reads[i], {}, etags, {}, loads[i],
        milestone=(len(reads[0]) // 3, third) if i == 0 else None))
        for i, url in enumerate(urls)]
    victim = procs[-1]
    await asyncio.wait_for(third.wait(), PASS_TIMEOUT_S)
    victim.stop(signal.SIGKILL)
    killed_at = loads[0].done
    survivors = await asyncio.gather(*tasks[:-1])
    del survivors
    tasks[-1].cancel()
    await asyncio.gather(tasks[-1], return_exceptions=True)
    egress = await hub_sent(http, hub.url) - before
    for proc in procs[:-1]:
        lab.stop(proc)
    return {
        "spokes": n, "killed": urls[-1], "killed_after_reads": killed_at,
        "failed_reads_on_survivors": sum(r.failed for r in loads[:-1]),
        "reads_on_survivors": sum(r.done for r in loads[:-1]),
        "hub_egress_bytes": egress, "extra_egress_bytes": egress - sizes.dataset,
        "extra_over_dead_share": (egress - sizes.dataset) / (sizes.dataset / n),
    }


def report_md(doc: dict[str, object]) -> str:
    lines = ["# Spoke tier", "", "| spokes | hub egress ÷ dataset | failed reads | seconds |",
             "|---|---|---|---|"]
    for row in doc["egress"]:  # type: ignore[attr-defined]
        lines.append(f"| {row['spokes']} | {row['egress_over_dataset']:.3f} | "
                     f"{row['failed_reads']} | {row['seconds']:.1f} |")
    hit = doc["hit"]
    assert isinstance(hit, dict)
    lines += ["", f"Hit ratio after warm-up, dataset = 3× one spoke's capacity, "
              f"{hit['spokes']} spokes: **{hit['hit_ratio']:.3f}**", "",
              "| read | n | p50 ms | p99 ms |", "|---|---|---|---|"]
    miss = doc["egress"][0]["hub_miss"]  # type: ignore[index]
    for name, q in (("local hit", hit["local_hit"]), ("peer hit", hit["peer_hit"]),
                    ("hub miss (cold)", miss),
                    ("local hit, 4 loaders x 8 readers", hit["loaded_local_hit"]),
                    ("peer hit, 4 loaders x 8 readers", hit["loaded_peer_hit"])):
        if q.get("n"):
            lines.append(f"| {name} | {q['n']} | {q['p50_ms']:.1f} | {q['p99_ms']:.1f} |")
    kill = doc["kill"]
    assert isinstance(kill, dict)
    lines += ["", f"One of {kill['spokes']} spokes SIGKILLed after {kill['killed_after_reads']} "
              f"reads: failed reads on the survivors {kill['failed_reads_on_survivors']} of "
              f"{kill['reads_on_survivors']}; extra egress {kill['extra_egress_bytes']} bytes "
              f"= {kill['extra_over_dead_share']:.2f} × the dead spoke's share.", ""]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, object]:
    sizes = QUICK if args.quick else FULL
    # One spoke first: its cold pass is all hub misses, the latency the others compare to.
    counts = [1, 3] if args.quick else [int(n) for n in args.spokes.split(",")]
    os.makedirs(args.out, exist_ok=True)
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    with Lab(log_dir=logs) as lab:
        root = lab.temp_dir("tier-data-")
        shards = generate(root, sizes.shards, sizes.shard_bytes)
        secret_file = write_secret(lab.temp_dir("tier-secret-"))
        hub = lab.hub(root, "--chunk-size", str(sizes.chunk), "--log-level", "warning")
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            egress = [await egress_for(lab, hub, n, shards, sizes, secret_file, http)
                      for n in counts]
            hit = await hit_ratio(lab, hub, args.hit_spokes, shards, sizes, secret_file, http)
            kill = await kill_one(lab, hub, max(counts[-1], 2), shards, sizes, secret_file,
                                  http)
    return {"sizes": asdict(sizes), "latency_ms": LATENCY_MS, "spoke_flags": SPOKE_FLAGS,
            "egress": egress, "hit": hit, "kill": kill}


def write_secret(directory: str) -> str:
    path = os.path.join(directory, "secret")
    with open(path, "w") as f:
        f.write(SECRET)
    os.chmod(path, 0o600)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.tier",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one then three spokes, and a smaller dataset (a few minutes)")
    parser.add_argument("--spokes", default="1,2,3,4", help="tier sizes to measure egress at")
    parser.add_argument("--hit-spokes", type=int, default=4,
                        help="spokes of the hit-ratio pass (the dataset is 3× one's capacity)")
    parser.add_argument("--keep-copies", action="store_true",
                        help="run the spokes with --peer-keep-copies (non-owners keep copies)")
    parser.add_argument("--out", required=True, help="directory for tier.json and tier.md")
    args = parser.parse_args(argv)
    if args.keep_copies:
        SPOKE_FLAGS.append("--peer-keep-copies")
    doc = asyncio.run(run(args))
    with open(os.path.join(args.out, "tier.json"), "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(args.out, "tier.md"), "w") as f:
        f.write(report_md(doc))
    print(report_md(doc))


if __name__ == "__main__":
    main()
