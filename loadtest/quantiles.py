"""One quantile for the load tools' latency figures."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(values: Sequence[float], q: float, empty: float = 0.0) -> float:
    """The value at rank ``int(q * n)`` of the sorted ``values`` (the largest for q = 1);
    ``empty`` when there are none."""
    if not values:
        return empty
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
