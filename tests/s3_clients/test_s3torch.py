"""s3torchconnector (the AWS CRT client) through the S3 endpoint: S3MapDataset through a
torch DataLoader with worker processes, and its range-based S3Reader seeking."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from tests.s3_clients.endpoints import REGION, CacheWatch, Endpoint
from tests.s3_clients.tools import run
from tests.support.tools import REPO


def read_with_s3torch(s3: Endpoint, tmp_path: Path) -> dict[str, object]:
    env = s3.env(tmp_path / "home") | {"PYTHONPATH": str(REPO)}
    out = run([sys.executable, "-m", "tests.s3_clients.torch_reader", s3.url, REGION], env,
              REPO)
    result: dict[str, object] = json.loads(out)
    return result


def test_s3map_dataset_through_a_dataloader(s3: Endpoint, tmp_path: Path) -> None:
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    result = read_with_s3torch(s3, tmp_path)
    assert result["samples"] == {k.removeprefix("train/"): sha(v) for k, v in s3.files.items()
                                 if k.startswith("train/shards/")}
    data = s3.files["train/by-client/torch/cold.bin"]
    assert result["size"] == len(data)
    assert result["parts"] == [[off, n, sha(data[off:off + n])]
                               for off, n in ((65530, 20), (0, 100), (300000, 50000),
                                              (120000, 1))]
    watch = CacheWatch(s3)
    assert read_with_s3torch(s3, tmp_path) == result
    watch.assert_all_hits()
