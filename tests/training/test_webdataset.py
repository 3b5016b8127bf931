"""WebDataset .tar shards through a real spoke: the same samples, byte for byte."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import webdataset as wds
from torch.utils.data import DataLoader

from loadtest.procs import Process, start_process

SHARDS = 3
PER_SHARD = 20
Sample = dict[str, bytes]


def write_shards(root: Path) -> dict[str, Sample]:
    """``SHARDS`` tar shards of samples with a .bin, a .json and a .txt member each."""
    rng = random.Random(12)
    samples: dict[str, Sample] = {}
    (root / "wds").mkdir()
    for s in range(SHARDS):
        with tarfile.open(root / "wds" / f"shard-{s:04d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                key = f"s{s:02d}_{i:04d}"
                members = {"bin": rng.randbytes(rng.randrange(1, 40_000)),
                           "json": f'{{"label": {rng.randrange(10)}}}'.encode(),
                           "txt": rng.choice([b"", b"x", "caf\u00e9\n".encode()])}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                samples[key] = members
    return samples


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, Sample], Path]]:
    root = tmp_path_factory.mktemp("hub")
    samples = write_shards(root)
    logs = str(tmp_path_factory.mktemp("logs"))
    # Chunks smaller than a shard, so every shard spans several of them.
    hub = start_process("hub", ["--root", str(root), "--chunk-size", "64KiB"], log_dir=logs)
    spoke: Process | None = None
    try:
        spoke = start_process("spoke", ["--hub", hub.url, "--cache-dir",
                                        str(tmp_path_factory.mktemp("cache")),
                                        "--capacity", "64MiB"], log_dir=logs)
        yield spoke.url, samples, root
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()


def urls(spoke: str) -> list[str]:
    return [f"{spoke}/objects/wds/shard-{s:04d}.tar" for s in range(SHARDS)]


def as_members(sample: dict[str, object]) -> tuple[str, Sample]:
    key = sample["__key__"]
    assert isinstance(key, str)
    members = {k: v for k, v in sample.items() if not k.startswith("__")}
    assert all(isinstance(v, bytes) for v in members.values())
    return key, members  # type: ignore[return-value]


def test_webdataset_reads_the_shards_byte_exact(
    served: tuple[str, dict[str, Sample], Path],
) -> None:
    spoke, samples, root = served
    cold = dict(as_members(s) for s in wds.WebDataset(urls(spoke), shardshuffle=False))
    assert cold == samples
    # Workers split the shards; the second pass is from the spoke's cache.
    loader = DataLoader(wds.WebDataset(urls(spoke), shardshuffle=False), batch_size=None,
                        num_workers=2)
    warm = dict(as_members(s) for s in loader)
    assert warm == samples
    answer = requests.get(urls(spoke)[0], timeout=30)
    assert answer.headers["X-Cache"] == "HIT"
    assert answer.content == (root / "wds" / "shard-0000.tar").read_bytes()


def test_the_example_runs(served: tuple[str, dict[str, Sample], Path]) -> None:
    spoke, samples, _ = served
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parents[2] / "examples" / "webdataset_shards.py"),
         "--endpoint", spoke, "--prefix", "wds/", "--epochs", "1", "--workers", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    payload = sum(len(v) for s in samples.values() for v in s.values())
    assert f"epoch 0: {len(samples)} samples, {payload} bytes" in result.stdout
