"""Generate a sample training dataset: token sequences packed in shard files.

The reference workload is tokenized text packed in 4096-token sequences. Tokens
are uint32 (vocabularies today exceed 65,536), so one sample is 16 KiB. The
bytes are seeded pseudo-random, so every run and every machine gets the same
dataset.

    python -m loadtest.dataset --out DIR --shards 16 --shard-size 16MiB
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass

from protocol.sizes import parse_size

TOKENS_PER_SAMPLE = 4096
BYTES_PER_TOKEN = 4
SAMPLE_BYTES = TOKENS_PER_SAMPLE * BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Shard:
    path: str
    size: int

    @property
    def samples(self) -> int:
        return self.size // SAMPLE_BYTES


def shard_name(prefix: str, i: int) -> str:
    return f"{prefix}/shard-{i:05d}.bin"


def generate(root: str, shards: int, shard_bytes: int, prefix: str = "dataset",
             seed: int = 1234) -> list[Shard]:
    """Write ``shards`` shard files of ``shard_bytes`` (rounded to whole samples)."""
    shard_bytes -= shard_bytes % SAMPLE_BYTES
    rng = random.Random(seed)
    made = []
    for i in range(shards):
        name = shard_name(prefix, i)
        full = os.path.join(root, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if not (os.path.exists(full) and os.path.getsize(full) == shard_bytes):
            _write_random(full, shard_bytes, rng.getrandbits(64))
        made.append(Shard(name, shard_bytes))
    return made


def _write_random(path: str, size: int, seed: int) -> None:
    rng = random.Random(seed)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        remaining = size
        while remaining:
            block = min(remaining, 1 << 20)
            f.write(rng.randbytes(block))
            remaining -= block
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-size", type=parse_size, default=16 << 20)
    args = parser.parse_args()
    for shard in generate(args.out, args.shards, args.shard_size):
        print(shard.path, shard.size)


if __name__ == "__main__":
    main()
