"""The spoke's counters: the single source of ``/stats`` and ``/metrics``.

Counted the way groupcache's ``Stats`` counts: plain integers bumped on the hot
path, read at scrape time. Tests rely on them being exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from service.metrics import Series


@dataclass
class SpokeStats:
    hits: int = 0  # chunk lookups answered from disk
    misses: int = 0  # chunk lookups that needed the hub (including joins)
    hub_fetches: int = 0  # chunk requests sent to the hub
    hub_bytes: int = 0  # object bytes received from the hub
    singleflight_joins: int = 0  # misses that waited on a fetch already in flight
    evictions: int = 0
    fill_failures: int = 0  # chunk fetches that failed (network, status, digest)
    verify_failures: int = 0  # chunks whose bytes did not match the manifest digest
    uncached_fills: int = 0  # chunks served but not stored (no room even after evicting)
    manifest_fetches: int = 0
    stale_manifests: int = 0  # manifests served past their TTL because the hub was down
    chunks_dropped: int = 0  # cached chunks found missing or corrupt, then forgotten
    purged_chunks: int = 0


_METRICS: dict[str, tuple[str, str, str]] = {
    "hits": ("spoke_cache_hits_total", "counter", "chunk lookups served from local disk"),
    "misses": ("spoke_cache_misses_total", "counter", "chunk lookups that needed the hub"),
    "hub_fetches": ("spoke_hub_fetches_total", "counter", "chunk fetches sent to the hub"),
    "hub_bytes": ("spoke_hub_bytes_total", "counter", "object bytes received from the hub"),
    "singleflight_joins": ("spoke_singleflight_joins_total", "counter",
                           "requests that waited on a chunk fetch already in flight"),
    "evictions": ("spoke_evictions_total", "counter", "chunks evicted to make room"),
    "fill_failures": ("spoke_fill_failures_total", "counter", "failed chunk fetches"),
    "verify_failures": ("spoke_verify_failures_total", "counter",
                        "chunks from the hub that failed digest verification"),
    "uncached_fills": ("spoke_uncached_fills_total", "counter",
                       "chunks served without being cached (no room)"),
    "manifest_fetches": ("spoke_manifest_fetches_total", "counter", "manifests fetched"),
    "stale_manifests": ("spoke_stale_manifests_total", "counter",
                        "manifests served stale because the hub was unreachable"),
    "chunks_dropped": ("spoke_chunks_dropped_total", "counter",
                       "cached chunks found missing or corrupt and forgotten"),
    "purged_chunks": ("spoke_purged_chunks_total", "counter", "chunks removed by purge"),
}


def stats_series(
    stats: SpokeStats, used_bytes: Callable[[], int], capacity_bytes: int
) -> list[Series]:
    series = [
        Series(name, kind, help_text, _reader(stats, field))
        for field, (name, kind, help_text) in _METRICS.items()
    ]
    series.append(Series("spoke_cache_used_bytes", "gauge", "bytes of chunks on disk",
                         lambda: used_bytes()))
    series.append(Series("spoke_cache_capacity_bytes", "gauge", "configured capacity",
                         lambda: capacity_bytes))
    return series


def _reader(stats: SpokeStats, field: str) -> Callable[[], float]:
    return lambda: getattr(stats, field)


def stats_dict(stats: SpokeStats) -> dict[str, int]:
    return asdict(stats)
