"""The S3 front end's counters, exported on the spoke's ``/metrics``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from service.metrics import AnySeries, LabeledCounter


@dataclass
class S3Stats:
    """Requests by S3 operation and error answers by S3 code (small, fixed sets)."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    def series(self) -> list[AnySeries]:
        return [
            LabeledCounter("spoke_s3_requests_total", "S3 requests, by operation", "operation",
                           lambda: self.requests),
            LabeledCounter("spoke_s3_errors_total", "S3 error answers, by S3 error code", "code",
                           lambda: self.errors),
        ]


S3_STATS = web.AppKey("s3_stats", S3Stats)
