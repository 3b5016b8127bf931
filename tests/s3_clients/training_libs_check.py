"""MosaicML Streaming and litdata read ``s3://`` datasets through the S3 endpoint.

Each library writes a small dataset in its own format into the served tree, then reads
it back from ``s3://train/...`` through a torch DataLoader with worker processes: the
samples read are the samples written, and the shard files it downloaded are the files
on disk, byte for byte.

Not collected by default (the name does not start with ``test_``): neither library is
in the test extras. Run it by name:

    pytest tests/s3_clients/training_libs_check.py

The libraries run in this environment's Python; ``HUBSPOKE_TRAINING_PYTHON`` names
another interpreter to run them in instead (a venv of their own, to try a release).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.s3_clients.endpoints import Endpoint
from tests.s3_clients.tools import files_under, run
from tests.support.tools import REPO


def read_with(library: str, s3: Endpoint, tmp_path: Path) -> tuple[dict[str, object], Path]:
    env = s3.env(tmp_path / "home") | {"PYTHONPATH": str(REPO),
                                       # MosaicML Streaming's name for the endpoint.
                                       "S3_ENDPOINT_URL": s3.url}
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n  addressing_style = path\n")
    env["AWS_CONFIG_FILE"] = str(config)
    cache = tmp_path / "cache"
    python = os.environ.get("HUBSPOKE_TRAINING_PYTHON", sys.executable)
    out = run([python, "-m", "tests.s3_clients.training_readers", library,
               str(s3.root), str(cache)], env, REPO)
    # The JSON is the last line (the libraries print progress before it).
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result, cache


@pytest.mark.parametrize("library", ["streaming", "litdata"])
def test_training_library_reads_through_s3(library: str, spoke_s3: Endpoint,
                                           tmp_path: Path) -> None:
    # The spoke only: each run costs half a minute (both passed against rclone too).
    s3 = spoke_s3
    result, cache = read_with(library, s3, tmp_path)
    assert result["read"] == result["written"]
    served = s3.root / str(result["shards"])
    on_disk = files_under(served)
    # Each library keeps its own layout under its cache directory: match by file name.
    downloaded = {Path(name).name: data for name, data in files_under(cache).items()
                  if Path(name).name in on_disk}
    assert downloaded, f"no shard of {sorted(on_disk)} in {sorted(files_under(cache))}"
    assert all(on_disk[name] == data for name, data in downloaded.items())
