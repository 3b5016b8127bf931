"""The servers fix glibc's malloc thresholds at start (service.memory).

Measured in a fresh interpreter: 16 answers of 2 MiB at once, freed, over and
over (a server's multi-range answers). With glibc's moving thresholds the heap
top is given back after each round and the next round faults every page in
again; with the fixed ones the memory is reused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHURN = """
import resource, sys
from service.memory import fix_malloc_thresholds
fixed = fix_malloc_thresholds() if sys.argv[1] == "fix" else False
def rounds(n):
    for _ in range(n):
        answers = [bytearray(2 << 20) for _ in range(16)]
        del answers
rounds(3)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(fixed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CHURN, mode], cwd=REPO, check=True,
                         capture_output=True, text=True, env={**clean, **env}, timeout=60)
    fixed, faults = out.stdout.split()
    return fixed == "True", int(faults)


def test_fixed_thresholds_reuse_large_buffers_instead_of_faulting_them_in() -> None:
    fixed, with_fix = _faults("fix")
    _, default = _faults("default")
    assert fixed
    pages_per_round = 16 * (2 << 20) // 4096
    assert default > 10 * pages_per_round  # the churn the fix is for
    assert with_fix < pages_per_round


def test_an_operators_own_setting_wins() -> None:
    fixed, _ = _faults("fix", MALLOC_TRIM_THRESHOLD_=str(1 << 20))
    assert not fixed
