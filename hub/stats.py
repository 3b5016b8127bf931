"""The hub's counters (exported on /metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from service.metrics import Series


@dataclass
class HubStats:
    requests: int = 0
    bytes_sent: int = 0
    manifests_served: int = 0

    def series(self) -> list[Series]:
        return [
            Series("hub_requests_total", "counter", "HTTP requests received",
                   lambda: self.requests),
            Series("hub_bytes_sent_total", "counter", "object data bytes sent",
                   lambda: self.bytes_sent),
            Series("hub_manifests_served_total", "counter", "manifests served",
                   lambda: self.manifests_served),
        ]
