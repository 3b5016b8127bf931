"""Running the command-line S3 clients (aws, rclone, s5cmd) of this environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TOOL_TIMEOUT_S = 120


def tool(name: str) -> str:
    """The console script beside this Python (the venv's bin)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    assert os.path.exists(path), f"{name} is not installed in this environment"
    return path


def run(args: list[str], env: dict[str, str], cwd: Path) -> bytes:
    """Run a client to completion; it must exit 0. Its stdout."""
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, timeout=TOOL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, (
        f"{args} exited {proc.returncode}\nstdout: {proc.stdout[-2000:]!r}\n"
        f"stderr: {proc.stderr[-4000:].decode(errors='replace')}")
    return proc.stdout


def fails(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run a client that must fail; its stderr."""
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, timeout=TOOL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode != 0, f"{args} succeeded: {proc.stdout[-500:]!r}"
    return proc.stderr.decode(errors="replace")


def files_under(directory: Path) -> dict[str, bytes]:
    """Relative path → bytes of every file under ``directory``."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}
