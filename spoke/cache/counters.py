"""The spoke's counters: plain integers the engine bumps on the hot path.

Counted the way groupcache's ``Stats`` counts, read at scrape time by the ``/stats`` and
``/metrics`` views (:mod:`spoke.serve.stats`). Tests rely on them being exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spoke.cache.store import CORRUPT_CAUSES


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
    uncached_fills: int = 0  # chunks served but not stored (no room, or the disk refused)
    manifest_fetches: int = 0
    stale_manifests: int = 0  # manifests served past their TTL because the hub was down
    chunks_dropped: int = 0  # cached chunks found missing or corrupt, then forgotten
    purged_chunks: int = 0
    expired_chunks: int = 0  # dropped by --max-age
    quota_evictions: int = 0  # a tenant at its quota made room among its own chunks
    stale_responses: int = 0  # responses answered with stale metadata (hub unreachable)
    prefetched_chunks: int = 0  # chunks fetched ahead of readers (pre-warm, read-ahead)
    prefetch_used: int = 0  # of those, chunks a loader read afterwards
    early_fetches: int = 0  # first chunks asked for alongside their object's manifest
    early_fetches_used: int = 0  # of those, fetches that brought their chunk in
    bytes_served_hit: int = 0  # object bytes sent to loaders from cached chunks
    bytes_served_miss: int = 0  # object bytes sent to loaders that had to cross the WAN
    # Chunk files hashed before a process first served them, or after they changed
    # (spoke.cache.integrity), reader workers' included.
    chunks_verified: int = 0
    bytes_verified: int = 0
    # Cached chunk files found bad and dropped, by cause (spoke.cache.store.CORRUPT_CAUSES).
    corrupt_chunks: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(CORRUPT_CAUSES, 0))
    scrubbed_chunks: int = 0  # chunk files re-hashed by the background scrub
    scrubbed_bytes: int = 0
    scrub_errors: int = 0  # background scrub steps that failed (not a bad chunk: an error)
