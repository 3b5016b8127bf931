"""Which CPU each of the spoke's processes is bound to (--cpu-affinity spread)."""

from __future__ import annotations

import pytest

from spoke.config import config_from_args, parse_args
from spoke.workers.cpus import spread


@pytest.mark.parametrize(("allowed", "processes", "expected"), [
    ({0, 1}, 4, [0, 1, 0, 1]),  # --workers auto on 2 cores: two to a CPU
    ({0, 1}, 3, [0, 1, 0]),
    ({3, 1, 2}, 5, [1, 2, 3, 1, 2]),  # in CPU order, whatever order the set gives
    ({5}, 3, [5, 5, 5]),  # one allowed CPU (taskset -c 5): all on it
    ([2, 2, 7], 2, [2, 7]),
    ({0, 1, 2, 3}, 2, [0, 1]),  # fewer processes than CPUs: one each, the rest free
    ({0, 1}, 1, [0]),
])
def test_spread_goes_round_the_allowed_cpus(
    allowed: set[int], processes: int, expected: list[int]
) -> None:
    assert spread(allowed, processes) == expected


def test_spread_over_no_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="no CPU"):
        spread(set(), 2)


BASE = ["serve", "--hub", "http://127.0.0.1:1", "--cache-dir", "/tmp/x", "--capacity", "1GiB"]


def test_cpu_affinity_is_off_unless_asked() -> None:
    assert config_from_args(parse_args(BASE, {})).cpu_affinity == "off"
    on = config_from_args(parse_args([*BASE, "--cpu-affinity", "spread"], {}))
    assert on.cpu_affinity == "spread"
    from_env = config_from_args(parse_args(BASE, {"HUBSPOKE_CPU_AFFINITY": "spread"}))
    assert from_env.cpu_affinity == "spread"


def test_an_unknown_cpu_affinity_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([*BASE, "--cpu-affinity", "pin"], {})
    assert exit_.value.code == 2
    assert "--cpu-affinity" in capsys.readouterr().err
