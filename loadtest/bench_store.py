"""The hub over an object store, side by side with the store: ``python -m loadtest.bench_store``.

One run on 127.0.0.1 against ``rclone serve s3`` over a temporary directory:

- cold 4 MiB ranged reads through the hub (``s3://`` root) against the same client
  (aiohttp, as a spoke's chunk fills) reading the store directly by a presigned URL, at
  the same concurrency, interleaved round by round; beside them, for reference,
  botocore's reads of the store and (where nginx is installed) the same client's reads
  through nginx as a plain relay to the store, no cache: what the least relay costs;
- the first manifest of a large object (the digest pass: one streamed GET, hashed
  chunk by chunk) against the store's own sequential read of it;
- the hub's peak RSS while it hashes a small and the large object: bounded, not
  growing with the object;
- a listing of ``--list-keys`` objects streamed through the hub (pages of the store's
  ListObjectsV2): its seconds, and the hub's peak RSS meanwhile.

Bounded by ``--rounds``, ``--reads`` and the objects' sizes; the store and the hub are
child processes stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from statistics import median_high
from typing import Any

import aiohttp
import psutil
from yarl import URL

from hub.store.s3 import make_client
from loadtest.meter import cpu_seconds, process_tree
from loadtest.nginx import Nginx, nginx_binary, start_nginx
from loadtest.procs import Process, start_process
from loadtest.s3_stores import S3Store, start_rclone_s3

MIB = 1 << 20
BUCKET = "bench"
SMALL, LARGE, READS = "small.bin", "large.bin", "reads.bin"
STORE_STATUSES = (200, 206)  # rclone answers a presigned range 200 (with Content-Range)


def write_object(path: str, mib: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for i in range(mib):
            f.write(block[i % 251:] + block[:i % 251])  # distinct chunks, cheap to make


def write_empty_keys(directory: str, count: int) -> None:
    os.makedirs(directory)
    for i in range(count):
        with open(os.path.join(directory, f"key-{i:07d}"), "wb"):
            continue


def read_all(path: str) -> None:
    """Through the page cache once, so store reads and hub reads both start warm."""
    with open(path, "rb") as f:
        while f.read(8 * MIB):
            continue


async def version_of(hub: str, key: str) -> str:
    """The ETag of ``key``, asked on a connection of its own: a spoke's chunk connections
    carry fills only (the hub's fast path keeps those; a connection that carries anything
    else goes to aiohttp's handler for good)."""
    async with aiohttp.ClientSession() as http, http.head(f"{hub}/objects/{key}") as resp:
        return resp.headers["ETag"]


async def http_reads(
    http: aiohttp.ClientSession, url: str | URL, etag: str, offsets: list[int], concurrency: int,
    statuses: tuple[int, ...] = (206,),
) -> float:
    """MB/s of 4 MiB ranged GETs of ``url``, each naming its version as a spoke's chunk
    fill does (``If-Match``): the hub's ``/objects`` URL, or the store's presigned one
    (the same client both ways)."""
    queue = list(offsets)

    async def worker() -> int:
        got = 0
        while queue:
            start = queue.pop()
            stop = start + 4 * MIB - 1
            headers = {"Range": f"bytes={start}-{stop}", "If-Match": etag}
            async with http.get(url, headers=headers) as resp:
                assert resp.status in statuses, resp.status
                assert resp.headers.get("Content-Range", "").startswith(
                    f"bytes {start}-{stop}/"), resp.headers.get("Content-Range")
                body = await resp.read()
                assert len(body) == 4 * MIB, len(body)
                got += len(body)
        return got

    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    return total / (time.perf_counter() - t0) / 1e6


def direct_reads(client: Any, offsets: list[int], concurrency: int) -> float:
    queue = list(offsets)
    lock = threading.Lock()

    def worker() -> int:
        got = 0
        while True:
            with lock:
                if not queue:
                    return got
                start = queue.pop()
            answer = client.get_object(Bucket=BUCKET, Key=READS,
                                       Range=f"bytes={start}-{start + 4 * MIB - 1}")
            got += len(answer["Body"].read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(lambda _: worker(), range(concurrency)))
    return total / (time.perf_counter() - t0) / 1e6


def round_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median of each round's own ratio: a round's runs are back to back and share
    the machine's load of the moment, which the medians apart do not."""
    return median_high([a / b for a, b in zip(ours, theirs, strict=True)])


def sequential_read_s(client: Any, key: str) -> float:
    t0 = time.perf_counter()
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
    while body.read(4 * MIB):
        continue
    return time.perf_counter() - t0


async def manifest_with_peak_rss(
    http: aiohttp.ClientSession, hub: Process, key: str
) -> tuple[float, float]:
    """Seconds to the first manifest of ``key``, and the hub's peak RSS (MiB) meanwhile."""
    proc = psutil.Process(hub.pid)
    peak = proc.memory_info().rss
    t0 = time.perf_counter()
    request = asyncio.ensure_future(http.get(f"{hub.url}/manifest/{key}"))
    while not request.done():
        peak = max(peak, proc.memory_info().rss)
        await asyncio.wait([request], timeout=0.02)  # sampling RSS while the hub hashes
    async with request.result() as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    return time.perf_counter() - t0, peak / MIB


async def listing_with_peak_rss(
    http: aiohttp.ClientSession, hub: Process, prefix: str
) -> tuple[int, float, float]:
    """Objects listed under ``prefix``, the seconds it took, the hub's peak RSS (MiB)."""
    proc = psutil.Process(hub.pid)
    peak = proc.memory_info().rss
    t0 = time.perf_counter()
    count = 0
    async with http.get(f"{hub.url}/list/{prefix}") as resp:
        assert resp.status == 200, await resp.text()
        async for block in resp.content.iter_chunked(1 << 16):
            count += block.count(b'"path"')
            peak = max(peak, proc.memory_info().rss)
    return count, time.perf_counter() - t0, peak / MIB


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp, \
            contextlib.ExitStack() as stack:
        bucket = os.path.join(tmp, "store", BUCKET)
        os.makedirs(bucket)
        sizes = {SMALL: args.small_mib, LARGE: args.large_mib, READS: args.reads_mib}
        for key, mib in sizes.items():
            write_object(os.path.join(bucket, key), mib)
            read_all(os.path.join(bucket, key))
        write_empty_keys(os.path.join(bucket, "many"), args.list_keys)
        store: S3Store = start_rclone_s3(os.path.join(tmp, "store"), log_dir=tmp)
        hub: Process | None = None
        try:
            env = {**os.environ, **store.env()}
            os.environ.update(store.env())  # start_process passes its environment on
            hub = start_process("hub", [
                "--root", f"s3://{BUCKET}", "--index-dir", os.path.join(tmp, "index"),
                "--access-log", "off",
            ], log_dir=tmp)
            client = make_client(store.url, env, 60)
            for key in sizes:
                # rclone computes an object's MD5 (its ETag) on the first HEAD, then keeps
                # it: asked for here, so that neither side's first read pays for it.
                client.head_object(Bucket=BUCKET, Key=key)
            size = args.reads_mib * MIB
            offsets = [(i * 4 * MIB) % (size - 4 * MIB) for i in range(args.reads)]
            rows: list[tuple[str, str, str, str]] = []
            etag = await version_of(hub.url, READS)
            hub_url = f"{hub.url}/objects/{READS}"
            # The same client both ways (aiohttp, as a spoke's fills): the store's URL is
            # presigned once, as the hub presigns its own.
            store_url = URL(client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": READS}, ExpiresIn=3600),
                encoded=True)  # as signed: not quoted again
            store_etag = client.head_object(Bucket=BUCKET, Key=READS)["ETag"]
            relay: Nginx | None = None
            if nginx_binary() is not None:
                store_at = (store_url.host or "", store_url.port or 0)
                relay = stack.enter_context(start_nginx(store_at))
            relay_url = URL(f"{relay.url}/relay{store_url.raw_path_qs}", encoded=True) \
                if relay else None
            async with aiohttp.ClientSession() as http:
                # Connections, every side.
                await http_reads(http, hub_url, etag, offsets[:4], 2)
                await http_reads(http, store_url, store_etag, offsets[:4], 2, STORE_STATUSES)
                direct_reads(client, offsets[:4], 2)
                if relay_url is not None:
                    await http_reads(http, relay_url, store_etag, offsets[:4], 2, STORE_STATUSES)
                gb = len(offsets) * 4 * MIB / 1e9
                hub_cpu = store_cpu_hub = store_cpu_direct = relay_cpu = store_cpu_relay = 0.0
                relay_pids = process_tree(relay.pid) if relay else []
                for c in args.concurrency:
                    via_hub, direct, via_relay, botocore_direct = [], [], [], []
                    for _ in range(args.rounds):
                        hub0, store0 = cpu_seconds([hub.pid]), cpu_seconds([store.process.pid])
                        via_hub.append(await http_reads(http, hub_url, etag, offsets, c))
                        hub_cpu += cpu_seconds([hub.pid]) - hub0
                        store1 = cpu_seconds([store.process.pid])
                        store_cpu_hub += store1 - store0
                        direct.append(await http_reads(http, store_url, store_etag, offsets, c,
                                                       STORE_STATUSES))
                        store_cpu_direct += cpu_seconds([store.process.pid]) - store1
                        botocore_direct.append(direct_reads(client, offsets, c))
                        if relay_url is not None:
                            relay0 = cpu_seconds(relay_pids)
                            store2 = cpu_seconds([store.process.pid])
                            via_relay.append(await http_reads(
                                http, relay_url, store_etag, offsets, c, STORE_STATUSES))
                            relay_cpu += cpu_seconds(relay_pids) - relay0
                            store_cpu_relay += cpu_seconds([store.process.pid]) - store2
                    rows.append((f"cold 4 MiB ranged reads ×{c} (MB/s, median of "
                                 f"{args.rounds}; ratio: median of the rounds')",
                                 f"{median_high(via_hub):.0f}", f"{median_high(direct):.0f}",
                                 f"{round_ratio(via_hub, direct):.2f}"))
                    rows.append((f"… the store direct through botocore ×{c}", "-",
                                 f"{median_high(botocore_direct):.0f}",
                                 f"{round_ratio(via_hub, botocore_direct):.2f}"))
                    if via_relay:
                        rows.append((f"… the store through nginx, a plain relay ×{c} "
                                     "(its own ratio to direct)", f"{median_high(via_relay):.0f}",
                                     f"{median_high(direct):.0f}",
                                     f"{round_ratio(via_relay, direct):.2f}"))
                runs = len(args.concurrency) * args.rounds
                rows.append(("CPU s per GB of ranged reads: hub / the store",
                             f"{hub_cpu / runs / gb:.2f} / {store_cpu_hub / runs / gb:.2f}",
                             f"- / {store_cpu_direct / runs / gb:.2f}", "-"))
                if relay_pids:
                    rows.append(("… through nginx, a plain relay: nginx / the store",
                                 f"{relay_cpu / runs / gb:.2f} / {store_cpu_relay / runs / gb:.2f}",
                                 "-", "-"))
                _, small_rss = await manifest_with_peak_rss(http, hub, SMALL)
                large_s, large_rss = await manifest_with_peak_rss(http, hub, LARGE)
                seq_s = sequential_read_s(client, LARGE)
                rows.append((f"first manifest of {args.large_mib} MiB (s)", f"{large_s:.2f}",
                             f"{seq_s:.2f}", f"{seq_s / large_s:.2f}"))
                count, list_s, list_rss = await listing_with_peak_rss(http, hub, "many/")
                assert count == args.list_keys, count
                t0 = time.perf_counter()
                pages = client.get_paginator("list_objects_v2").paginate(
                    Bucket=BUCKET, Prefix="many/")
                assert sum(len(page.get("Contents", [])) for page in pages) == count
                direct_list_s = time.perf_counter() - t0
                rows.append((f"list {count} keys: s (hub peak RSS MiB)",
                             f"{list_s:.1f} ({list_rss:.0f} MiB)", f"{direct_list_s:.1f}",
                             f"{direct_list_s / list_s:.2f}"))
                rows.append((f"hub peak RSS hashing {args.small_mib} MiB / "
                             f"{args.large_mib} MiB (MiB)", f"{small_rss:.0f} / {large_rss:.0f}",
                             "-", "-"))
        finally:
            if hub is not None:
                hub.stop()
            store.stop()
    print("| measure | through the hub | store direct | hub speed ÷ direct |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads-mib", type=int, default=256, help="object of the ranged reads")
    parser.add_argument("--reads", type=int, default=48, help="4 MiB reads per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--small-mib", type=int, default=64)
    parser.add_argument("--large-mib", type=int, default=1024)
    parser.add_argument("--list-keys", type=int, default=100_000, help="keys in the listing")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
