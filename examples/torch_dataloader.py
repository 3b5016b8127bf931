"""Train-loop skeleton reading 4096-token samples through a hubspoke spoke.

    python examples/torch_dataloader.py --endpoint http://127.0.0.1:8701 --prefix dataset/

Each DataLoader worker process opens its own connection pool to the spoke; the
sampler shuffles every epoch and tells the spoke the epoch's order first (a read
plan), so the spoke fetches ahead of the loader; batches are fetched with concurrent
ranged reads.
Nothing here knows about the WAN: point --endpoint at the hub and it still works,
only slower.
"""

from __future__ import annotations

import argparse
import time

from torch.utils.data import DataLoader

from spoke.client.torch_dataset import PlannedSampler, ShardedSamples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="spoke (or hub) URL")
    parser.add_argument("--prefix", default="dataset/")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    dataset = ShardedSamples(args.endpoint, prefix=args.prefix)
    sampler = PlannedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        started, samples = time.perf_counter(), 0
        for batch in loader:
            samples += batch.shape[0]  # a model step would go here
        took = time.perf_counter() - started
        print(f"epoch {epoch}: {samples} samples in {took:.1f} s ({samples / took:,.0f}/s)")


if __name__ == "__main__":
    main()
