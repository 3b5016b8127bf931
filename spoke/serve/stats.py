"""The spoke's ``/stats`` document and ``/metrics`` series, read live from its cache.

The counters themselves live with the engine (:class:`spoke.cache.counters.SpokeStats`);
these views only read them, with the gauges of the cache, the hub link and the warm jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from service.metrics import (
    AnySeries,
    Histogram,
    HistogramSeries,
    LabeledCounter,
    LabeledGauge,
    Series,
)
from spoke.cache.counters import SpokeStats
from spoke.cache.engine import ChunkCache
from spoke.policy import gate_of
from spoke.prefetch.warm import WarmJobs
from spoke.tier.upstream import TierCounters, TieredUpstream
from spoke.upstream.resilience import STATE_CODES

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
                       "chunks served without being cached (no room, or the disk refused)"),
    "manifest_fetches": ("spoke_manifest_fetches_total", "counter", "manifests fetched"),
    "stale_manifests": ("spoke_stale_manifests_total", "counter",
                        "manifests served stale because the hub was unreachable"),
    "chunks_dropped": ("spoke_chunks_dropped_total", "counter",
                       "cached chunks found missing or corrupt and forgotten"),
    "purged_chunks": ("spoke_purged_chunks_total", "counter",
                      "chunks removed by purge or because the hub deleted the object"),
    "expired_chunks": ("spoke_expired_chunks_total", "counter", "chunks dropped by --max-age"),
    "quota_evictions": ("spoke_quota_evictions_total", "counter",
                        "chunks evicted because their tenant reached --tenant-quota"),
    "prefetched_chunks": ("spoke_prefetched_chunks_total", "counter",
                          "chunks fetched ahead of readers (pre-warm, read-ahead)"),
    "prefetch_used": ("spoke_prefetch_used_total", "counter",
                      "prefetched chunks that a loader read afterwards"),
    "early_fetches": ("spoke_early_fetches_total", "counter",
                      "first chunks asked of the hub alongside their object's manifest"),
    "early_fetches_used": ("spoke_early_fetches_used_total", "counter",
                           "early fetches that brought their chunk in"),
    "bytes_served_hit": ("spoke_served_hit_bytes_total", "counter",
                         "bytes sent to loaders from cached chunks"),
    "bytes_served_miss": ("spoke_served_miss_bytes_total", "counter",
                          "bytes sent to loaders that were fetched from the hub"),
    "stale_responses": ("spoke_stale_responses_total", "counter",
                        "responses served with stale metadata while the hub was unreachable"),
    "chunks_verified": ("spoke_chunks_verified_total", "counter",
                        "cached chunk files hashed before a process first served them, "
                        "or after they changed"),
    "bytes_verified": ("spoke_verified_bytes_total", "counter",
                       "bytes of cached chunk files hashed before serving"),
    "scrubbed_chunks": ("spoke_scrubbed_chunks_total", "counter",
                        "cached chunk files re-hashed by the background scrub"),
    "scrubbed_bytes": ("spoke_scrubbed_bytes_total", "counter",
                       "bytes re-hashed by the background scrub"),
    "scrub_errors": ("spoke_scrub_errors_total", "counter",
                     "background scrub steps that failed with an error"),
}


def stats_series(
    cache: ChunkCache, warm: WarmJobs, read_latency: dict[str, Histogram],
    s3_read_latency: dict[str, Histogram] | None = None,
) -> list[AnySeries]:
    """Every /metrics series of a spoke, read live from its cache. ``read_latency``
    counts every front end's reads; ``s3_read_latency`` the S3 front end's share."""
    stats = cache.stats
    series: list[AnySeries] = [
        Series(name, kind, help_text, _reader(stats, field))
        for field, (name, kind, help_text) in _METRICS.items()
    ]
    breaker, retries = cache.breaker, cache.retry_counters
    series += [
        LabeledCounter("spoke_corrupt_chunks_total",
                      "cached chunk files found bad on disk and dropped, by cause", "cause",
                      lambda: stats.corrupt_chunks),
        Series("spoke_cache_used_bytes", "gauge", "bytes of chunks on disk",
               lambda: cache.used_bytes),
        Series("spoke_cache_capacity_bytes", "gauge", "configured capacity",
               lambda: cache.capacity_bytes),
        Series("spoke_cached_chunks", "gauge", "chunks on disk", lambda: cache.chunk_count),
        Series("spoke_pinned_bytes", "gauge", "bytes of chunks under pinned prefixes",
               lambda: cache.pinned_bytes),
        Series("spoke_policy_info", "gauge", "the eviction policy in use (value 1)",
               lambda: 1, (("policy", cache.policy.name), ("admission", _admission(cache)))),
        Series("spoke_admission_window_bytes", "gauge",
               "bytes of misses not read again soon, held in the reuse gate's window",
               lambda: _gate_figure(cache, "window_bytes")),
        Series("spoke_admission_promoted_total", "counter",
               "chunks read twice in the reuse gate's window, moved to the policy",
               lambda: _gate_figure(cache, "promoted")),
        Series("spoke_admission_replaced_total", "counter",
               "chunks idle past the reuse horizon that a miss replaced",
               lambda: _gate_figure(cache, "replaced_dead")),
        Series("spoke_hub_fetches_in_flight", "gauge", "chunk fetches waiting on the hub",
               lambda: cache.fetches_in_flight),
        Series("spoke_fill_buffer_bytes", "gauge",
               "chunk buffers held by fetches running and chunks being stored",
               lambda: cache.fill_buffer_bytes),
        Series("spoke_chunks_storing", "gauge",
               "verified chunks being written to disk (served from memory meanwhile)",
               lambda: cache.chunks_storing),
        Series("spoke_hub_retries_total", "counter", "hub requests retried",
               lambda: retries.retries),
        Series("spoke_hub_timeouts_total", "counter", "hub requests that timed out",
               lambda: retries.timeouts),
        Series("spoke_hub_connections_opened_total", "counter",
               "TCP connections opened to the hub (keep-alive keeps this low)",
               lambda: cache.hub.connections_opened),
        Series("spoke_breaker_state", "gauge", "hub circuit breaker: 0 closed, 1 open, 2 half-open",
               lambda: STATE_CODES[breaker.state]),
        Series("spoke_breaker_opened_total", "counter", "times the hub circuit breaker opened",
               lambda: breaker.opened_total),
        Series("spoke_breaker_rejected_total", "counter",
               "hub requests refused at once because the breaker was open",
               lambda: breaker.rejected_total),
        Series("spoke_warm_jobs_running", "gauge", "pre-warm jobs running",
               lambda: warm.running),
        Series("spoke_warm_bytes_done", "gauge", "bytes done by running pre-warm jobs",
               lambda: sum(j.bytes_done for j in warm.jobs() if j.state == "running")),
        Series("spoke_warm_bytes_total", "gauge", "bytes to do by running pre-warm jobs",
               lambda: sum(j.bytes_total for j in warm.jobs() if j.state == "running")),
        Series("spoke_hit_ratio", "gauge", "chunk lookups served from disk / all lookups",
               lambda: _ratio(stats.hits, stats.hits + stats.misses)),
        Series("spoke_byte_hit_ratio", "gauge", "bytes served from disk / all bytes served",
               lambda: _ratio(stats.bytes_served_hit,
                              stats.bytes_served_hit + stats.bytes_served_miss)),
        Series("spoke_prefetch_accuracy", "gauge", "prefetched chunks later read / prefetched",
               lambda: _ratio(stats.prefetch_used, stats.prefetched_chunks)),
        Series("spoke_plan_admissions_refused_total", "counter",
               "fills not kept because every cached chunk is needed sooner by a plan",
               lambda: cache.policy.refused),
        LabeledCounter("spoke_background_errors_total",
                       "errors of the spoke's background tasks, which carry on", "task",
                       lambda: cache.background_errors.counts),
        LabeledCounter("spoke_disk_write_errors_total",
                       "writes the disk refused (full, read-only); the reads were answered",
                       "write", lambda: cache.disk_errors.counts),
        HistogramSeries("spoke_hub_fetch_seconds", "latency of chunk fetches from the hub",
                        cache.fetch_latency),
        HistogramSeries("spoke_read_seconds",
                        "loader read latency, by X-Cache outcome and front end",
                        labels=("cache", "front"),
                        by_labels=lambda: by_front(read_latency, s3_read_latency or {})),
    ]
    # The tier's counters are there on a spoke outside a tier too (at 0), so that one
    # dashboard serves both.
    series += tier_series(cache.hub if isinstance(cache.hub, TieredUpstream) else None)
    return series


def by_front(
    reads: dict[str, Histogram], s3: dict[str, Histogram]
) -> dict[tuple[str, ...], Histogram]:
    """``reads`` (of both front ends) by (X-Cache outcome, front end): ``s3``, the S3
    front end's share, and ``http``, the rest (``/objects``)."""
    out: dict[tuple[str, ...], Histogram] = {}
    for outcome, histogram in reads.items():
        share = s3.get(outcome)
        out[outcome, "http"] = histogram if share is None else histogram.less(share)
        out[outcome, "s3"] = share if share is not None else Histogram(histogram.buckets)
    return out


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


# Local-disk hits land in the first buckets; misses at 60 ms RTT from 0.06 s up.
READ_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25,
                          0.5, 1, 2.5, 5)


def read_latency_histograms() -> dict[str, Histogram]:
    return {outcome: Histogram(READ_LATENCY_BUCKETS_S) for outcome in ("hit", "miss", "partial")}


def _admission(cache: ChunkCache) -> str:
    """``reuse`` behind the reuse gate, else ``policy``: the policy admits by its own rule."""
    return "reuse" if gate_of(cache.policy) is not None else "policy"


def _gate_figure(cache: ChunkCache, name: str) -> int:
    """The reuse gate's ``name`` (a count, or its window's bytes); 0 without a gate."""
    gate = gate_of(cache.policy)
    return 0 if gate is None else int(getattr(gate, name))


def _reader(stats: SpokeStats, field: str) -> Callable[[], float]:
    return lambda: getattr(stats, field)


def stats_snapshot(
    cache: ChunkCache, covered: Callable[[str], bool] | None = None
) -> dict[str, object]:
    """The /stats document: the contract's keys plus the WAN figures; ``tenant_bytes``
    counts only the objects ``covered`` accepts (all of them when it is None)."""
    snapshot: dict[str, object] = dict(asdict(cache.stats))
    snapshot.update(
        used_bytes=cache.used_bytes,
        capacity_bytes=cache.capacity_bytes,
        policy=cache.policy.name,
        admission=_admission(cache),
        admission_window_bytes=_gate_figure(cache, "window_bytes"),
        admission_promoted=_gate_figure(cache, "promoted"),
        admission_replaced=_gate_figure(cache, "replaced_dead"),
        cached_chunks=cache.chunk_count,
        hub_fetches_in_flight=cache.fetches_in_flight,
        chunks_storing=cache.chunks_storing,
        fill_buffer_bytes=cache.fill_buffer_bytes,
        hub_retries=cache.retry_counters.retries,
        hub_timeouts=cache.retry_counters.timeouts,
        hub_connections_opened=cache.hub.connections_opened,
        hub_chunk_size=cache.hub_chunk_size,
        breaker_state=cache.breaker.state,
        breaker_opened=cache.breaker.opened_total,
        breaker_rejected=cache.breaker.rejected_total,
        hub_fetch_p50_s=cache.fetch_latency.quantile(0.5),
        hub_fetch_p99_s=cache.fetch_latency.quantile(0.99),
        tenant_bytes=cache.tenant_bytes if covered is None else cache.tenant_bytes_under(covered),
        pinned_bytes=cache.pinned_bytes,
        hit_ratio=_ratio(cache.stats.hits, cache.stats.hits + cache.stats.misses),
        byte_hit_ratio=_ratio(cache.stats.bytes_served_hit,
                              cache.stats.bytes_served_hit + cache.stats.bytes_served_miss),
        prefetch_accuracy=_ratio(cache.stats.prefetch_used, cache.stats.prefetched_chunks),
        background_errors=dict(cache.background_errors.counts),
        disk_write_errors=dict(cache.disk_errors.counts),
    )
    if isinstance(cache.hub, TieredUpstream):
        snapshot.update(tier_snapshot(cache.hub))
    return snapshot


def tier_snapshot(tier: TieredUpstream) -> dict[str, object]:
    """The tier's part of /stats: what peers brought (the hub bytes they saved), what
    failed, what other spokes asked of this one, and each member's state and share."""
    c = tier.counters
    return {
        "peer_fetches": c.peer_fetches, "peer_bytes": c.peer_bytes,
        "peer_errors": c.peer_errors, "hub_bytes_saved": c.peer_bytes,
        "hub_direct_fetches": c.hub_direct, "peer_requests_served": c.peers_asked_by,
        "peer_prefetches": c.peer_prefetches,
        "peer_prefetches_served": c.peer_prefetches_served, "peer_refused": c.peer_refused,
        "peers": tier.membership.snapshot(),
    }


def tier_series(tier: TieredUpstream | None) -> list[AnySeries]:
    """The tier's /metrics series (its counters only, at 0, for a spoke outside a tier)."""
    c = tier.counters if tier is not None else TierCounters()
    series: list[AnySeries] = [
        Series("spoke_peer_fetches_total", "counter", "chunks fetched from their owner spoke",
               lambda: c.peer_fetches),
        Series("spoke_peer_bytes_total", "counter",
               "chunk bytes fetched from peers: hub bytes the tier saved", lambda: c.peer_bytes),
        Series("spoke_peer_errors_total", "counter",
               "peer chunk fetches that failed and went to the next choice or the hub",
               lambda: c.peer_errors),
        Series("spoke_peer_requests_served_total", "counter",
               "chunk requests other spokes of the tier sent this one",
               lambda: c.peers_asked_by),
        Series("spoke_peer_refused_total", "counter",
               "peer requests refused without the tier's secret (a spoke with another one?)",
               lambda: c.peer_refused),
    ]
    if tier is None:
        return series
    membership = tier.membership
    return [
        *series,
        Series("spoke_tier_members", "gauge", "spokes in the tier, this one included",
               lambda: len(membership.members) + 1),
        LabeledGauge("spoke_peer_down", "1 while a peer's breaker keeps keys off it", "peer",
                     membership.down),
        LabeledGauge("spoke_peer_share", "share of the chunk keys a member owns", "peer",
                     membership.shares),
    ]
