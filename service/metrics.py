"""Prometheus exposition of plain counter objects.

The servers count in ordinary dataclass fields (cheap on the hot path, and the
same numbers feed ``/stats``); a collector reads them at scrape time, so
``/stats`` and ``/metrics`` can never disagree. Each app has its own registry so
several servers can live in one process (tests do that).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector


class Histogram:
    """Cumulative-bucket histogram counted in plain Python (cheap to observe)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def merge(self, counts: list[int], total: float) -> None:
        """Add another histogram's observations (same buckets): its counts and sum."""
        if len(counts) != len(self.counts):
            raise ValueError("histograms with different buckets")
        for i, n in enumerate(counts):
            self.counts[i] += n
        self.sum += total
        self.count += sum(counts)

    def less(self, part: Histogram) -> Histogram:
        """This histogram without ``part``'s observations, where ``part`` counts some of
        the same events timed a little later (so never in a lower bucket): its count is
        exact, a bucket an event straddles may keep it. The cumulative counts stay
        non-decreasing, in the bound and from one scrape to the next."""
        if part.buckets != self.buckets:
            raise ValueError("histograms with different buckets")
        rest = Histogram(self.buckets)
        mine, theirs, kept = 0, 0, 0
        total = max(0, self.count - part.count)
        for i, (n, m) in enumerate(zip(self.counts, part.counts, strict=True)):
            mine, theirs = mine + n, theirs + m
            cumulative = min(total, max(kept, mine - theirs))
            rest.counts[i], kept = cumulative - kept, cumulative
        rest.count = total
        rest.sum = max(0.0, self.sum - part.sum) if total else 0.0
        return rest

    def cumulative(self) -> list[tuple[str, float]]:
        """(upper bound, observations <= bound) pairs, ending with +Inf."""
        pairs, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            pairs.append((_bound_text(bound), float(running)))
        return pairs

    def quantile(self, q: float) -> float:
        """An upper bound of the q-quantile (the bucket boundary that covers it)."""
        if not self.count:
            return 0.0
        target, running = q * self.count, 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            if running >= target:
                return bound
        return float("inf")


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


@dataclass(frozen=True, slots=True)
class HistogramSeries:
    """A histogram, or one per value of ``label`` (low cardinality only), or one per
    tuple of values of ``labels``, read at scrape time (``by_labels``)."""

    name: str
    help: str
    histogram: Histogram | None = None
    label: str = ""
    by_label: dict[str, Histogram] | None = None
    labels: tuple[str, ...] = ()
    by_labels: Callable[[], Mapping[tuple[str, ...], Histogram]] | None = None


@dataclass(frozen=True, slots=True)
class Series:
    """One exported number: its metric name, kind, help text and how to read it."""

    name: str
    kind: str  # "counter" | "gauge"
    help: str
    read: Callable[[], float]
    labels: tuple[tuple[str, str], ...] = ()  # constant labels (an info-style gauge)


@dataclass(frozen=True, slots=True)
class LabeledCounter:
    """A counter per value of ``label``, read as a mapping at scrape time."""

    name: str
    help: str
    label: str
    read: Callable[[], Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class LabeledGauge:
    """A gauge per value of ``label``, read as a mapping at scrape time."""

    name: str
    help: str
    label: str
    read: Callable[[], Mapping[str, float]]


AnySeries = Series | HistogramSeries | LabeledCounter | LabeledGauge


class SeriesCollector(Collector):
    def __init__(self, series: Sequence[AnySeries]) -> None:
        self._series = series

    def collect(self) -> Iterator[Metric]:
        for s in self._series:
            if isinstance(s, HistogramSeries):
                yield _histogram_family(s)
                continue
            if isinstance(s, LabeledCounter):
                yield _labeled_counter_family(s)
                continue
            if isinstance(s, LabeledGauge):
                gauge = GaugeMetricFamily(s.name, s.help, labels=[s.label])
                for value, number in sorted(s.read().items()):
                    gauge.add_metric([value], number)
                yield gauge
                continue
            if s.kind == "counter":
                # prometheus_client appends _total itself; keep the contract's names.
                yield CounterMetricFamily(s.name.removesuffix("_total"), s.help, value=s.read())
            elif s.labels:
                family = GaugeMetricFamily(s.name, s.help, labels=[k for k, _ in s.labels])
                family.add_metric([v for _, v in s.labels], s.read())
                yield family
            else:
                yield GaugeMetricFamily(s.name, s.help, value=s.read())


def _histogram_family(s: HistogramSeries) -> HistogramMetricFamily:
    if s.histogram is not None:
        h = s.histogram
        return HistogramMetricFamily(s.name, s.help, buckets=h.cumulative(), sum_value=h.sum)
    if s.by_labels is not None:
        family = HistogramMetricFamily(s.name, s.help, labels=list(s.labels))
        for values, h in s.by_labels().items():
            family.add_metric(list(values), buckets=h.cumulative(), sum_value=h.sum)
        return family
    family = HistogramMetricFamily(s.name, s.help, labels=[s.label])
    for value, h in (s.by_label or {}).items():
        family.add_metric([value], buckets=h.cumulative(), sum_value=h.sum)
    return family


def _labeled_counter_family(s: LabeledCounter) -> CounterMetricFamily:
    family = CounterMetricFamily(s.name.removesuffix("_total"), s.help, labels=[s.label])
    for value, count in sorted(s.read().items()):
        family.add_metric([value], count)
    return family


def make_registry(series: Sequence[AnySeries]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SeriesCollector(series))
    return registry


def metrics_response(registry: CollectorRegistry) -> web.Response:
    body = generate_latest(registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
