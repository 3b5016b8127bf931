"""Write a small dataset in a training library's format into the served tree, then read it
back from ``s3://`` through the endpoint; print JSON of what was written and read.

    python -m tests.s3_clients.training_readers streaming|litdata TREE_ROOT CACHE_DIR

Run as a process of its own by test_training_libs (the libraries take the endpoint from
the environment, and start worker processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

SAMPLES = 300


def sample(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 40)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mosaic_streaming(root: str, cache: str) -> dict[str, Any]:
    from streaming import MDSWriter, StreamingDataset
    from torch.utils.data import DataLoader

    out = os.path.join(root, "train", "mds")
    if not os.path.exists(out):
        with MDSWriter(out=out, columns={"id": "int", "data": "bytes"},
                       size_limit=1 << 16) as writer:
            for i in range(SAMPLES):
                writer.write({"id": i, "data": sample(i)})
    dataset = StreamingDataset(remote="s3://train/mds", local=cache, shuffle=False,
                               batch_size=1)
    read = {int(s["id"]): sha(s["data"]) for s in DataLoader(dataset, batch_size=None,
                                                            num_workers=2)}
    return {"read": read, "shards": "train/mds"}


def litdata_(root: str, cache: str) -> dict[str, Any]:
    import litdata as ld

    out = os.path.join(root, "train", "litdata")
    if not os.path.exists(out):
        ld.optimize(fn=_lit_sample, inputs=list(range(SAMPLES)), output_dir=out,
                    chunk_bytes="64KB", num_workers=1)
    dataset = ld.StreamingDataset("s3://train/litdata", cache_dir=cache, storage_options={
        "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
        "aws_access_key_id": os.environ.get("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY")})
    loader = ld.StreamingDataLoader(dataset, batch_size=1, num_workers=2, collate_fn=_first)
    read = {int(s["id"]): sha(s["data"]) for s in loader}
    return {"read": read, "shards": "train/litdata"}


def _litdata_without_obstore() -> None:
    """litdata downloads chunks with obstore when it is installed (this environment has
    it), building the store without ``allow_http``: every http:// GET fails with
    "BadScheme". Its boto3 path, taken without obstore, reads a plain-HTTP endpoint."""
    from litdata.streaming import downloader

    downloader._OBSTORE_AVAILABLE = False  # type: ignore[attr-defined]


def _first(batch: list[Any]) -> Any:
    return batch[0]


def _lit_sample(i: int) -> dict[str, Any]:
    return {"id": i, "data": sample(i)}


# litdata's workers are spawned: they import this module again (as __mp_main__, with
# the same argv), and must not take obstore either.
if __name__ in ("__main__", "__mp_main__") and sys.argv[1:2] == ["litdata"]:
    _litdata_without_obstore()

if __name__ == "__main__":
    library, tree, cache_dir = sys.argv[1:4]
    reader = mosaic_streaming if library == "streaming" else litdata_
    result = reader(tree, cache_dir)
    result["written"] = {i: sha(sample(i)) for i in range(SAMPLES)}
    print(json.dumps(result))
