"""S3 endpoints for the client tests: the spoke's S3 front end, or rclone's S3 server.

Both serve the same dataset tree (its top-level folders are the buckets). rclone is a
known-good S3 server: the same tests passing against it show that the tests ask what S3
answers, so a failure against the spoke is the spoke's.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.procs import Process, start_process
from loadtest.s3_stores import S3Store, start_rclone_s3
from tests.support.servers import write_dataset

ACCESS_KEY = "hubspoke-test"
SECRET_KEY = "hubspoke-secret-key"
# A second key of the spoke, allowed only under other/ (scope checks).
SCOPED_KEY = "hubspoke-scoped"
SCOPED_SECRET = "hubspoke-scoped-secret"
REGION = "us-east-1"
CHUNK = 64 * 1024
MANY = 120  # keys under train/many/, for list pagination

S3_LISTENING = re.compile(r"^s3 listening on (https?://\S+)", re.MULTILINE)
HTTP_LISTENING = re.compile(r"^listening on (https?://\S+)", re.MULTILINE)


def dataset_files() -> dict[str, int]:
    """``bucket/key`` → size: edge sizes, a many-chunk object, deep keys, many small keys."""
    files = {
        "train/empty.bin": 0,
        "train/one-byte.bin": 1,
        "train/big.bin": CHUNK * 40 + 7,
        "train/exact.bin": CHUNK * 4,
        "train/nested/a/b/deep.bin": 5000,
        "train/nested/a/side.bin": 700,
        "train/nested/top.bin": 300,
        "train/odd names/sp ace+plus=eq.bin": 1234,
        "other/notes.csv": 3000,
    }
    files |= {f"train/shards/shard-{i:03d}.bin": CHUNK + 1000 * i for i in range(8)}
    files |= {f"train/many/k-{i:04d}.bin": 10 + i for i in range(MANY)}
    # One prefix per client, so each test's first read is cold whatever ran before it.
    for client in ("boto3", "cli", "s3fs", "arrow", "rclone", "s5cmd", "torch", "shared"):
        files[f"train/by-client/{client}/cold.bin"] = CHUNK * 6 + 333
    return files


def write_tree(root: Path) -> dict[str, bytes]:
    contents = write_dataset(str(root), dataset_files(), seed=21)
    write_parquet(root / "train" / "table.parquet")
    contents["train/table.parquet"] = (root / "train" / "table.parquet").read_bytes()
    return contents


def write_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 5000
    table = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "label": pa.array([f"sample-{i % 97}" for i in range(n)]),
        "score": pa.array([i / 7 for i in range(n)], pa.float64()),
    })
    # Small row groups: a reader then asks for several ranges of the file.
    pq.write_table(table, str(path), row_group_size=700)


@dataclass
class Endpoint:
    """One S3 server over the dataset; ``spoke_http`` is the spoke's own HTTP port."""

    kind: str  # "spoke" | "rclone" | "spoke-anonymous"
    url: str
    root: Path
    files: dict[str, bytes]
    access_key: str | None = ACCESS_KEY
    secret_key: str | None = SECRET_KEY
    region: str = REGION
    spoke_http: str | None = None
    processes: list[Process | S3Store] = field(default_factory=list)

    @property
    def ranged_status(self) -> int:
        """S3 answers a Range with 206; rclone's S3 server answers 200 (with the right bytes
        and Content-Range)."""
        return 200 if self.kind == "rclone" else 206

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[1]

    def env(self, home: Path) -> dict[str, str]:
        """The environment of a client process pointed at this endpoint, and at nothing
        of the machine's (no config files, its own HOME and TMPDIR)."""
        home.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(home),
            "AWS_ENDPOINT_URL": self.url, "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if self.access_key and self.secret_key:
            env |= {"AWS_ACCESS_KEY_ID": self.access_key,
                    "AWS_SECRET_ACCESS_KEY": self.secret_key}
        return env

    def stats(self) -> dict[str, Any] | None:
        """The spoke's /stats once nothing is in flight (None for rclone)."""
        if self.spoke_http is None:
            return None
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{self.spoke_http}/stats", timeout=30) as reply:
                doc: dict[str, Any] = json.loads(reply.read())
            if doc["hub_fetches_in_flight"] == 0 and doc["chunks_storing"] == 0:
                return doc
            assert time.monotonic() < deadline, f"the spoke never settled: {doc}"
            time.sleep(0.02)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


class CacheWatch:
    """Around a repeated read: no chunk fetched from the hub, and hits counted."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.before = endpoint.stats()

    def assert_all_hits(self) -> None:
        after = self.endpoint.stats()
        if self.before is None or after is None:
            return  # rclone has no cache to ask
        assert after["hub_fetches"] == self.before["hub_fetches"], (self.before, after)
        assert after["hits"] > self.before["hits"], (self.before, after)


def s3_url_of(spoke: Process, timeout_s: float = 20) -> tuple[str, str]:
    """The spoke's (HTTP, S3) addresses from its stderr lines."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = "\n".join(spoke.log)
        http, s3 = HTTP_LISTENING.search(text), S3_LISTENING.search(text)
        if http and s3:
            return http.group(1), s3.group(1)
        if spoke.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the spoke printed no S3 address:\n{text}")
        time.sleep(0.05)


def start_hub_process(root: Path, log_dir: Path) -> Process:
    return start_process("hub", ["--root", str(root), "--chunk-size", "64KiB",
                                 "--access-log", "off"], log_dir=str(log_dir))


def start_s3_spoke(hub: Process, cache_dir: Path, log_dir: Path,
                   credentials: Path | None, *flags: str) -> tuple[Process, str, str]:
    """``python -m spoke serve --s3-port 0`` in front of ``hub``: (process, http, s3)."""
    args = ["--hub", hub.url, "--cache-dir", str(cache_dir), "--capacity", "256MiB",
            "--access-log", "off", "--s3-port", "0", *flags]
    if credentials is not None:
        args += ["--s3-credentials", str(credentials)]
    spoke = start_process("spoke", args, log_dir=str(log_dir))
    try:
        http, s3 = s3_url_of(spoke)
    except BaseException:
        spoke.stop()
        raise
    return spoke, http, s3


def write_credentials(path: Path) -> Path:
    path.write_text(f"{ACCESS_KEY} {SECRET_KEY} ''\n{SCOPED_KEY} {SCOPED_SECRET} other\n")
    path.chmod(0o600)
    return path


def start_endpoint(kind: str, root: Path, files: dict[str, bytes], work: Path) -> Endpoint:
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if kind == "rclone":
        store = start_rclone_s3(str(root), ACCESS_KEY, SECRET_KEY, log_dir=str(log_dir))
        return Endpoint(kind, store.url, root, files, processes=[store])
    hub = start_hub_process(root, log_dir)
    endpoint = Endpoint(kind, "", root, files, processes=[hub])
    try:
        credentials = None if kind == "spoke-anonymous" else write_credentials(
            work / "s3-credentials")
        spoke, http, s3 = start_s3_spoke(hub, work / "cache", log_dir, credentials)
    except BaseException:
        endpoint.stop()
        raise
    endpoint.processes.append(spoke)
    endpoint.url, endpoint.spoke_http = s3, http
    if kind == "spoke-anonymous":
        endpoint.access_key = endpoint.secret_key = None
    return endpoint
