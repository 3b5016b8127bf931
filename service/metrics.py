"""Prometheus exposition of plain counter objects.

The servers count in ordinary dataclass fields (cheap on the hot path, and the
same numbers feed ``/stats``); a collector reads them at scrape time, so
``/stats`` and ``/metrics`` can never disagree. Each app has its own registry so
several servers can live in one process (tests do that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class Series:
    """One exported number: its metric name, kind, help text and how to read it."""

    name: str
    kind: str  # "counter" | "gauge"
    help: str
    read: Callable[[], float]


class SeriesCollector(Collector):
    def __init__(self, series: list[Series]) -> None:
        self._series = series

    def collect(self) -> Iterator[Metric]:
        for s in self._series:
            if s.kind == "counter":
                # prometheus_client appends _total itself; keep the contract's names.
                yield CounterMetricFamily(s.name.removesuffix("_total"), s.help, value=s.read())
            else:
                yield GaugeMetricFamily(s.name, s.help, value=s.read())


def make_registry(series: list[Series]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SeriesCollector(series))
    return registry


def metrics_response(registry: CollectorRegistry) -> web.Response:
    body = generate_latest(registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
