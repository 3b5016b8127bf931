"""Start our servers as child processes and stop them by PID.

Used by the demo, the benchmarks and the tests that kill or restart a server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

# The main listening line starts its line; other sites' ("s3 listening on ...") follow it.
LISTENING = re.compile(r"^listening on (https?://\S+)", re.MULTILINE)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Process:
    """A server started as ``python -m ...``; stopped by its PID."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> list[str]:
        """What the server wrote on stderr so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()

    def site_url(self, name: str, timeout_s: float = 10) -> str:
        """The URL of the server's other site ``name`` (its ``{name} listening on URL``
        line, printed right after the main one: waited for up to ``timeout_s``)."""
        line = re.compile(rf"^{re.escape(name)} listening on (https?://\S+)", re.MULTILINE)
        deadline = time.monotonic() + timeout_s
        while True:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                match = line.search(f.read())
            if match:
                return match.group(1)
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no {name!r} listening line in {self.log_path}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10) -> int:
        """Send ``sig``, wait (SIGKILL after ``timeout_s``), return the exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def start_process(
    module: str, args: Sequence[str], timeout_s: float = 20, command: str = "serve",
    log_dir: str | None = None, port: int = 0,
) -> Process:
    """Run ``python -m module serve ... --port 0`` (or ``port``: a spoke of a tier, whose
    peers must know it beforehand) and wait for its listening line.

    stderr goes to a file (never a pipe nobody drains, which would block a chatty
    server), kept in ``log_dir`` or the temp directory.
    """
    fd, log_path = tempfile.mkstemp(prefix=f"{module}-", suffix=".log", dir=log_dir)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, command, *args,
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, stderr=log, stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return wait_for_address(proc, log_path, LISTENING, module, timeout_s)


def wait_for_address(
    proc: subprocess.Popen[bytes], log_path: str, address: re.Pattern[str], name: str,
    timeout_s: float,
) -> Process:
    """Wait until the log at ``log_path`` shows ``address`` (its first group is the URL);
    a process that exits or stays silent is stopped, and the error carries its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            match = address.search(f.read())
        if match:
            return Process(proc, match.group(1), log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    with open(log_path, encoding="utf-8", errors="replace") as f:
        raise RuntimeError(f"{name} did not start:\n{f.read()}")
