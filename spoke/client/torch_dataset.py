"""A PyTorch map-style dataset of fixed-size samples packed in shard files.

The reference workload: tokenized text packed in 4096-token sequences, tokens
stored as little-endian integers, one shard file after another. Point it at a
spoke (or a hub) and use it with any ``DataLoader``; each worker process gets
its own connection pool (see :class:`spoke.client.clients.Client`).

    from torch.utils.data import DataLoader
    from spoke.client.torch_dataset import ShardedSamples

    ds = ShardedSamples("http://spoke:8701", prefix="dataset/")
    for batch in DataLoader(ds, batch_size=32, shuffle=True, num_workers=4):
        ...  # batch: LongTensor [32, 4096]

torch is an optional dependency (``pip install 'hubspoke[torch]'``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from spoke.client.clients import Client

TOKENS_PER_SAMPLE = 4096
_DTYPES = {"int32": torch.int32, "int64": torch.int64, "uint16": torch.uint16,
           "int16": torch.int16, "uint8": torch.uint8}


class ShardedSamples(Dataset[torch.Tensor]):
    """Sample ``i`` is the ``i``-th fixed-size record across the shards, in path order.

    The shard list and each shard's version (ETag) are fixed when the dataset is
    made: reads carry ``If-Match``, so an epoch never mixes two versions of a shard.
    A partial record at the end of a shard is ignored.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        paths: Sequence[str] | None = None,
        prefix: str | None = None,
        tokens_per_sample: int = TOKENS_PER_SAMPLE,
        dtype: str = "int32",
        client: Client | None = None,
    ) -> None:
        if (paths is None) == (prefix is None):
            raise ValueError("give exactly one of paths= or prefix=")
        self.client = client or Client(endpoint)
        self.dtype = _DTYPES[dtype]
        self.sample_bytes = tokens_per_sample * torch.tensor([], dtype=self.dtype).element_size()
        stats = ([self.client.stat(p) for p in paths] if paths is not None
                 else self.client.list(prefix or ""))
        self.shards = [(s.path, s.etag) for s in stats if s.size >= self.sample_bytes]
        counts = [s.size // self.sample_bytes for s in stats if s.size >= self.sample_bytes]
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)

    def __len__(self) -> int:
        return self._starts[-1]

    def locate(self, index: int) -> tuple[str, str, int]:
        """(shard path, etag, byte offset) of sample ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} outside 0..{len(self) - 1}")
        shard = bisect.bisect_right(self._starts, index) - 1
        path, etag = self.shards[shard]
        return path, etag, (index - self._starts[shard]) * self.sample_bytes

    def __getitem__(self, index: int) -> torch.Tensor:
        path, etag, offset = self.locate(index)
        return self._tensor(self.client.read(path, offset, self.sample_bytes, etag=etag))

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        """A whole batch at once: the reads of each shard go out concurrently."""
        by_shard: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        for position, index in enumerate(indices):
            path, etag, offset = self.locate(index)
            by_shard[(path, etag)].append((position, offset))
        out: list[torch.Tensor | None] = [None] * len(indices)
        for (path, etag), wanted in by_shard.items():
            ranges = [(offset, self.sample_bytes) for _, offset in wanted]
            for (position, _), data in zip(wanted, self.client.read_many(path, ranges, etag=etag),
                                           strict=True):
                out[position] = self._tensor(data)
        return [t for t in out if t is not None]

    def _tensor(self, data: bytes) -> torch.Tensor:
        if len(data) != self.sample_bytes:
            raise OSError(f"short sample: {len(data)} of {self.sample_bytes} bytes")
        return torch.frombuffer(bytearray(data), dtype=self.dtype).to(torch.int64)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)
