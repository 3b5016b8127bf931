"""Running one of the load tools as a user would: ``python -m loadtest.X``, in a process of
its own, with a temp root of its own.

The tool's temp root is a fresh directory, so whatever is left in it afterwards is that
run's leftovers, whatever else (another test run, another tool) shares the machine's /tmp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_tool(module: str, args: list[str], tmp_path_factory: pytest.TempPathFactory,
             timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args``; it must exit 0 and leave no temp file behind."""
    tmp_root = tmp_path_factory.mktemp("tool-tmp")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_root)},
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    left = os.listdir(tmp_root)
    assert not left, f"temp files left behind: {left}"
    return proc
