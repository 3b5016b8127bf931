"""WebDataset ``.tar`` shards read through a hubspoke spoke.

    python examples/webdataset_shards.py --endpoint http://127.0.0.1:8701 --prefix shards/

A spoke serves each shard at ``/objects/{path}`` with the hub's bytes and headers,
so WebDataset needs nothing but the URLs: it streams each shard with ``curl`` and
the spoke caches the chunks, so the next epoch (or the next job) reads them from the
cache instead of over the WAN. The listing comes from the spoke too.
"""

from __future__ import annotations

import argparse
import time

import webdataset as wds
from torch.utils.data import DataLoader

from spoke.client.clients import Client


def shard_urls(endpoint: str, prefix: str) -> list[str]:
    """The spoke URLs of the ``.tar`` objects under ``prefix``, in path order."""
    with Client(endpoint) as client:
        paths = sorted(s.path for s in client.list(prefix) if s.path.endswith(".tar"))
    return [f"{endpoint.rstrip('/')}/objects/{path}" for path in paths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="spoke (or hub) URL")
    parser.add_argument("--prefix", default="shards/")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    urls = shard_urls(args.endpoint, args.prefix)
    # Shards are shuffled per epoch and split over the workers; samples are shuffled in
    # a buffer: the shard-aware shuffle that keeps reads sequential within a shard.
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(100)
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers)
    for epoch in range(args.epochs):
        started, samples, payload = time.perf_counter(), 0, 0
        for sample in loader:
            samples += 1
            payload += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
        took = time.perf_counter() - started
        print(f"epoch {epoch}: {samples} samples, {payload} bytes in {took:.1f} s")


if __name__ == "__main__":
    main()
