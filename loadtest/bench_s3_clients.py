"""Which S3 client the hub uses: ``python -m loadtest.bench_s3_clients``.

obstore (Rust object_store, sync API from threads) against aiobotocore (botocore on
asyncio), both against the same ``rclone serve s3`` store on 127.0.0.1, interleaved
phase by phase: 4 MiB ranged-read throughput at a few concurrencies, small-read
latency, HEAD latency, a 10k-key listing, and the client's own CPU per GB read.
Bounded by ``--reads`` and the object's size; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loadtest.s3_stores import S3Store, start_rclone_s3

MIB = 1 << 20
BUCKET = "bench"
BIG = "big.bin"


def seed(root: str, big_mib: int, keys: int) -> None:
    bucket = os.path.join(root, BUCKET)
    os.makedirs(os.path.join(bucket, "many"), exist_ok=True)
    with open(os.path.join(bucket, BIG), "wb") as f:
        for _ in range(big_mib):
            f.write(os.urandom(MIB))
    for i in range(keys):
        with open(os.path.join(bucket, "many", f"k{i:06d}"), "wb") as f:
            f.write(b"x")


class ObstoreClient:
    name = "obstore"

    def __init__(self, store: S3Store, threads: int) -> None:
        import obstore
        from obstore.store import S3Store as ObS3Store

        self._obs = obstore
        self._store = ObS3Store(
            BUCKET, endpoint=store.url, access_key_id=store.access_key,
            secret_access_key=store.secret_key, region=store.region,
            client_options={"allow_http": True},
        )
        self._pool = ThreadPoolExecutor(threads)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def get_range(self, key: str, start: int, length: int) -> int:
        def blocking() -> int:
            return len(self._obs.get_range(self._store, key, start=start, length=length))
        return int(await self._run(blocking))

    async def head(self, key: str) -> None:
        await self._run(self._obs.head, self._store, key)

    async def list_count(self, prefix: str) -> int:
        def blocking() -> int:
            return sum(len(batch) for batch in self._obs.list(self._store, prefix, chunk_size=1000))
        return int(await self._run(blocking))

    async def close(self) -> None:
        self._pool.shutdown()


class BotocoreClient:
    """botocore's own (sync) client from threads: what the hub's blocking backend can call."""

    name = "botocore"

    def __init__(self, store: S3Store, threads: int) -> None:
        import botocore.session
        from botocore.config import Config

        config = Config(
            max_pool_connections=threads, response_checksum_validation="when_required",
            request_checksum_calculation="when_required",
        )
        self._client = botocore.session.get_session().create_client(
            "s3", endpoint_url=store.url, aws_access_key_id=store.access_key,
            aws_secret_access_key=store.secret_key, region_name=store.region, config=config,
        )
        self._pool = ThreadPoolExecutor(threads)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def get_range(self, key: str, start: int, length: int) -> int:
        def blocking() -> int:
            answer = self._client.get_object(
                Bucket=BUCKET, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            return len(answer["Body"].read())
        return int(await self._run(blocking))

    async def head(self, key: str) -> None:
        await self._run(lambda: self._client.head_object(Bucket=BUCKET, Key=key))

    async def list_count(self, prefix: str) -> int:
        def blocking() -> int:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=prefix
            )
            return sum(len(page.get("Contents", [])) for page in pages)
        return int(await self._run(blocking))

    async def close(self) -> None:
        self._pool.shutdown()


class AiobotocoreClient:
    name = "aiobotocore"

    def __init__(self, store: S3Store) -> None:
        self._store = store
        self._client: Any = None
        self._context: Any = None

    async def start(self, connections: int) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        config = AioConfig(
            max_pool_connections=connections, response_checksum_validation="when_required",
            request_checksum_calculation="when_required",
        )
        self._context = get_session().create_client(
            "s3", endpoint_url=self._store.url, aws_access_key_id=self._store.access_key,
            aws_secret_access_key=self._store.secret_key, region_name=self._store.region,
            config=config,
        )
        self._client = await self._context.__aenter__()

    async def get_range(self, key: str, start: int, length: int) -> int:
        answer = await self._client.get_object(
            Bucket=BUCKET, Key=key, Range=f"bytes={start}-{start + length - 1}"
        )
        async with answer["Body"] as body:
            return len(await body.read())

    async def head(self, key: str) -> None:
        await self._client.head_object(Bucket=BUCKET, Key=key)

    async def list_count(self, prefix: str) -> int:
        count = 0
        paginator = self._client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
            count += len(page.get("Contents", []))
        return count

    async def close(self) -> None:
        await self._context.__aexit__(None, None, None)


Client = ObstoreClient | BotocoreClient | AiobotocoreClient


async def throughput(
    client: Client, size: int, reads: int, concurrency: int
) -> tuple[float, float]:
    """MB/s of ``reads`` 4 MiB ranged reads at ``concurrency``, and client CPU s per GB."""
    offsets = [(i * 4 * MIB) % (size - 4 * MIB) for i in range(reads)]
    queue = list(reversed(offsets))

    async def worker() -> int:
        got = 0
        while queue:
            got += await client.get_range(BIG, queue.pop(), 4 * MIB)
        return got

    cpu0, t0 = time.process_time(), time.perf_counter()
    total = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return total / wall / 1e6, cpu / (total / 1e9)


async def latency_ms(call: Callable[[], Awaitable[object]], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-s3-clients-") as root:
        seed(root, args.big_mib, args.keys)
        store = start_rclone_s3(root, log_dir=root)
        try:
            obs = ObstoreClient(store, max(args.concurrency))
            boto = AiobotocoreClient(store)
            await boto.start(max(args.concurrency))
            clients: list[Client] = [obs, BotocoreClient(store, max(args.concurrency)), boto]
            rows: dict[str, dict[str, str]] = {c.name: {} for c in clients}
            size = args.big_mib * MIB
            ranged: list[Client] = []
            for client in clients:  # warm: connections, the store's page cache
                try:
                    await throughput(client, size, 4, 2)
                    ranged.append(client)
                except Exception as exc:  # obstore refuses rclone's 200-with-Content-Range
                    failure = str(exc).splitlines()[0][:60]
                    for c in args.concurrency:
                        rows[client.name][f"4 MiB ranged MB/s ×{c}"] = f"fails: {failure}"
                        rows[client.name][f"CPU s/GB ×{c}"] = "-"
            for c in args.concurrency:
                for client in ranged:
                    rate, cpu = await throughput(client, size, args.reads, c)
                    rows[client.name][f"4 MiB ranged MB/s ×{c}"] = f"{rate:.0f}"
                    rows[client.name][f"CPU s/GB ×{c}"] = f"{cpu:.2f}"
            for client in clients:
                cl = client
                rows[cl.name]["4 KiB read p50 ms"] = (
                    f"{await latency_ms(lambda c=cl: c.get_range(BIG, 12345, 4096), 200):.2f}"
                    if cl in ranged else "-"
                )
                head_ms = await latency_ms(lambda c=cl: c.head(BIG), 200)
                rows[cl.name]["HEAD p50 ms"] = f"{head_ms:.2f}"
                t0 = time.perf_counter()
                count = await cl.list_count("many/")
                assert count == args.keys, (cl.name, count)
                rows[cl.name][f"list {args.keys} keys s"] = f"{time.perf_counter() - t0:.2f}"
            for client in clients:
                await client.close()
        finally:
            store.stop()
    columns = list(rows["botocore"])
    print("| client | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(row[c] for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-mib", type=int, default=256, help="size of the ranged-read object")
    parser.add_argument("--reads", type=int, default=64, help="4 MiB reads per phase")
    parser.add_argument("--keys", type=int, default=10_000, help="keys in the listing")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
