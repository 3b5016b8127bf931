"""Read ``s3://train/shards/`` with s3torchconnector through a torch DataLoader, and a few
ranges with its range-based S3Reader; print what was read as JSON (key → sha256).

    python -m tests.s3_clients.torch_reader ENDPOINT_URL REGION

Run as a process of its own by test_s3torch: the CRT client takes its credentials from
the environment and runs native threads, and DataLoader workers fork.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_sample(reader: Any) -> tuple[str, str]:
    return reader.key, sha(reader.read())


def main(endpoint: str, region: str) -> dict[str, Any]:
    from s3torchconnector import S3ClientConfig, S3MapDataset, S3ReaderConstructor
    from torch.utils.data import DataLoader

    config = S3ClientConfig(force_path_style=True, max_attempts=2)
    dataset = S3MapDataset.from_prefix("s3://train/shards/", region=region, endpoint=endpoint,
                                       transform=read_sample, s3client_config=config)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, shuffle=True)
    samples = dict(loader)
    ranged = S3MapDataset.from_objects(
        ["s3://train/by-client/torch/cold.bin"], region=region, endpoint=endpoint,
        s3client_config=config, reader_constructor=S3ReaderConstructor.range_based())
    reader = ranged[0]
    parts = []
    for offset, size in ((65530, 20), (0, 100), (300000, 50000), (120000, 1)):
        reader.seek(offset)
        parts.append([offset, size, sha(reader.read(size))])
    return {"samples": samples, "parts": parts, "size": reader.seek(0, 2)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
