"""The S3 front end's counters, exported on the spoke's ``/metrics``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from service.metrics import AnySeries, Histogram, HistogramSeries, LabeledCounter
from spoke.serve.stats import read_latency_histograms


@dataclass
class S3Stats:
    """Requests by S3 operation, error answers by S3 code (small, fixed sets), and the
    S3 share of the reads (``spoke_read_seconds{front="s3"}``; ``spoke_s3_read_seconds``
    holds the same, under the name it had first)."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    read_latency: dict[str, Histogram] = field(default_factory=read_latency_histograms)

    def observe(self, x_cache: str, seconds: float) -> None:
        self.read_latency[x_cache.lower()].observe(seconds)

    def series(self) -> list[AnySeries]:
        return [
            LabeledCounter("spoke_s3_requests_total", "S3 requests, by operation", "operation",
                           lambda: self.requests),
            LabeledCounter("spoke_s3_errors_total", "S3 error answers, by S3 error code", "code",
                           lambda: self.errors),
            HistogramSeries("spoke_s3_read_seconds",
                            "GetObject latency through the S3 front end, by X-Cache outcome",
                            label="cache", by_label=self.read_latency),
        ]


S3_STATS = web.AppKey("s3_stats", S3Stats)
