"""The PyTorch dataset through a real spoke, with DataLoader worker processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from loadtest.procs import Process, start_process
from spoke.client.torch_dataset import ShardedSamples
from tests.support.servers import write_dataset

TOKENS = 512  # small samples keep the test fast; the layout is the reference one
SAMPLE_BYTES = TOKENS * 4
SHARDS = {f"tok/shard-{i:05d}.bin": 24 * SAMPLE_BYTES + 100 for i in range(3)}  # partial tail


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("hub")
    files = write_dataset(str(root), SHARDS, seed=5)
    logs = str(tmp_path_factory.mktemp("logs"))
    hub = start_process("hub", ["--root", str(root), "--chunk-size", "16KiB"], log_dir=logs)
    spoke: Process | None = None
    try:
        spoke = start_process("spoke", ["--hub", hub.url, "--cache-dir",
                                        str(tmp_path_factory.mktemp("cache")),
                                        "--capacity", "64MiB"], log_dir=logs)
        yield spoke.url, files
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()


def expected(files: dict[str, bytes], index: int) -> torch.Tensor:
    shard, within = divmod(index, 24)
    data = files[f"tok/shard-{shard:05d}.bin"][within * SAMPLE_BYTES:(within + 1) * SAMPLE_BYTES]
    return torch.frombuffer(bytearray(data), dtype=torch.int32).to(torch.int64)


def test_samples_are_the_shards_records(servers: tuple[str, dict[str, bytes]]) -> None:
    url, files = servers
    dataset = ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS)
    assert len(dataset) == 72  # the 100-byte tails are not samples
    for index in (0, 23, 24, 71):
        assert torch.equal(dataset[index], expected(files, index))
    batch = dataset.__getitems__([70, 3, 25, 3])
    assert all(torch.equal(t, expected(files, i)) for t, i in zip(batch, [70, 3, 25, 3],
                                                                   strict=True))
    with pytest.raises(IndexError):
        dataset[72]


def test_dataloader_with_two_workers_and_shuffle(servers: tuple[str, dict[str, bytes]]) -> None:
    url, files = servers
    dataset = ShardedSamples(url, paths=sorted(SHARDS), tokens_per_sample=TOKENS)
    torch.manual_seed(0)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2)
    seen = [row for batch in loader for row in batch]
    assert len(seen) == 72
    by_first_token = {int(expected(files, i)[0]): i for i in range(72)}
    order = [by_first_token[int(row[0])] for row in seen]
    assert sorted(order) == list(range(72))  # every sample exactly once
    assert order != list(range(72))  # shuffled
    for row, index in zip(seen, order, strict=True):
        assert torch.equal(row, expected(files, index))


def test_example_script_runs(servers: tuple[str, dict[str, bytes]]) -> None:
    url, _ = servers
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parents[2] / "examples" / "torch_dataloader.py"),
         "--endpoint", url, "--prefix", "tok/", "--epochs", "1", "--workers", "0"],
        capture_output=True, text=True, timeout=120,
    )
    # The example reads 4096-token (16 KiB) samples: each 48 KiB shard holds 3.
    assert result.returncode == 0, result.stderr
    assert "epoch 0: 9 samples" in result.stdout
