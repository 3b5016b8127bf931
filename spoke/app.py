"""make_app(config, clock): the spoke's routes and the objects they share."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

from aiohttp import web

from service import auth, front, limits, logs
from service.auth import Access, RouteTable
from service.fast import FAST, FastHandler
from service.metrics import make_registry
from service.problem import problem_middleware
from service.routes import add_routes
from service.tls import client_context
from spoke.cache.clock import SYSTEM_CLOCK, Clock
from spoke.cache.counters import SpokeStats
from spoke.cache.engine import ChunkCache
from spoke.cache.scrub import BackgroundScrub, open_index, scrub
from spoke.cache.store import ChunkStore
from spoke.config import SpokeConfig
from spoke.policy import make_policy
from spoke.policy.plan_aware import PlanAwarePolicy
from spoke.prefetch.plan_prefetch import PlanPrefetcher
from spoke.prefetch.plans import PlanBook
from spoke.prefetch.readahead import SequentialReadahead
from spoke.prefetch.warm import WarmJobs
from spoke.s3.stats import S3_STATS, S3Stats
from spoke.serve import handlers, peer
from spoke.serve.fast import FastObjectReads
from spoke.serve.objects import ObjectReads
from spoke.serve.stats import read_latency_histograms, stats_series
from spoke.tier.membership import Membership
from spoke.tier.upstream import TieredUpstream
from spoke.upstream.hub import HubClient
from spoke.upstream.resilience import CircuitBreaker, RetryPolicy
from spoke.workers.pool import READERS, ReaderPool

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 192 << 20


# The clock the cache reads (tests pass a fake one to step past TTLs).
CLOCK = web.AppKey("clock", Clock)


def make_app(config: SpokeConfig, clock: Clock = SYSTEM_CLOCK) -> web.Application:
    # Read plans of a whole epoch run to tens of MB (msgpack: ~40 bytes a read).
    app = web.Application(middlewares=[problem_middleware], client_max_size=MAX_BODY_BYTES)
    logs.install(app)
    front.install(app)
    limits.install(
        app, config.max_inflight_per_client,
        max_connections_per_client=config.max_connections_per_client,
        header_timeout_s=config.header_timeout_s,
        keepalive_timeout_s=config.keepalive_timeout_s,
    )
    auth.install(app, auth.make_guard(
        config.auth_secret_file, config.auth_previous_secret_file, routes(config)
    ))
    app[handlers.CONFIG] = config
    app[CLOCK] = clock
    fast: FastHandler = FastObjectReads(app, handlers.READS)
    app[FAST] = fast
    app[handlers.READ_LATENCY] = read_latency_histograms()
    app[S3_STATS] = S3Stats()  # the S3 front end's, if it serves (spoke.s3)
    if config.workers > 1:
        readers = ReaderPool()  # started once the port is known (spoke.__main__)
        app[READERS] = app[handlers.READER_WORKERS] = readers
    app.cleanup_ctx.append(_cache_context)
    add_routes(app, [
        ("GET", "/objects/{path:.+}", handlers.get_object),
        ("GET", "/list/{prefix:.*}", handlers.get_list),
        ("GET", "/list", handlers.get_list),
        ("GET", "/stats", handlers.get_stats),
        ("DELETE", "/cache/{path:.+}", handlers.delete_cache),
        ("POST", "/plans", handlers.create_plan),
        ("GET", "/plans", handlers.list_plans),
        ("GET", "/plans/{id}", handlers.get_plan),
        ("DELETE", "/plans/{id}", handlers.delete_plan),
        ("POST", "/warm", handlers.start_warm),
        ("GET", "/warm", handlers.list_warm),
        ("GET", "/warm/{id}", handlers.get_warm),
        ("DELETE", "/warm/{id}", handlers.cancel_warm),
        ("GET", "/healthz", handlers.healthz),
        ("GET", "/metrics", handlers.metrics),
    ])
    if config.peers:
        app[peer.SECRET] = peer_secret(config)
        add_routes(app, [
            ("GET", "/peer/objects/{path:.+}", peer.get_peer_object),
            ("POST", "/peer/prefetch/{path:.+}", peer.post_peer_prefetch),
            ("GET", "/peer/info", peer.get_peer_info),
        ])
    return app


def routes(config: SpokeConfig) -> RouteTable:
    """What each route asks of a loader's bearer token when auth is on (unlisted: admin).

    The spoke checks loaders' tokens itself, so a cached read never waits on the hub;
    towards the hub it uses its own token (``--hub-token-file``).
    """
    return {
        ("GET", "/objects/{path}"): Access.OBJECT,
        ("GET", "/list/{prefix}"): Access.LISTING,
        ("GET", "/list"): Access.LISTING,
        ("GET", "/stats"): Access.ADMIN,
        ("DELETE", "/cache/{path}"): Access.ADMIN_OBJECT,
        ("POST", "/plans"): Access.TOKEN,  # the handler checks each planned path
        ("GET", "/plans"): Access.ADMIN,  # lists the plans of the admin's own tenant
        ("GET", "/plans/{id}"): Access.TOKEN,  # ids are 64 random bits
        ("DELETE", "/plans/{id}"): Access.TOKEN,
        ("POST", "/warm"): Access.ADMIN,
        ("GET", "/warm"): Access.ADMIN,
        ("GET", "/warm/{id}"): Access.ADMIN,
        ("DELETE", "/warm/{id}"): Access.ADMIN,
        ("GET", "/healthz"): Access.OPEN,
        ("GET", "/metrics"): auth.metrics_access(config.metrics_auth),
        # Not a loader's token: the tier's secret, which the peer handlers check.
        ("GET", "/peer/objects/{path}"): Access.OPEN,
        ("POST", "/peer/prefetch/{path}"): Access.OPEN,
        ("GET", "/peer/info"): Access.OPEN,
    }


def peer_secret(config: SpokeConfig) -> str:
    """The secret spokes of a tier send and check: ``--peer-secret-file``'s, else the
    spoke's hub token (the spokes of one region share it)."""
    path = config.peer_secret_file or config.hub_token_file
    assert path, "spoke.config refuses --peers without a secret"
    return auth.load_token(path)


def advertised_url(config: SpokeConfig) -> str:
    """How peers reach this spoke: ``--advertise``, else its scheme, host and port (a
    wildcard host stands for this machine's address)."""
    if config.advertise:
        return config.advertise
    host = config.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostbyname(socket.gethostname())
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if config.tls_cert else 'http'}://{host}:{config.port}"


async def _cache_context(app: web.Application) -> AsyncIterator[None]:
    config = app[handlers.CONFIG]
    book = PlanBook()
    cache = await open_cache(config, book, app[CLOCK])
    # As many as fetch at once: its fetches borrow the slots no loader waits for
    # (spoke.cache.slots), and a cold job's first batches need most of the plan at once.
    plans = PlanPrefetcher(book, cache, config.plan_window_bytes,
                           concurrency=config.fetch_concurrency)
    app[handlers.CACHE] = cache
    if isinstance(cache.hub, TieredUpstream):
        app[peer.TIER] = cache.hub
    app[handlers.PLAN_BOOK] = book
    app[handlers.PLANS] = plans
    readahead = SequentialReadahead(cache, config.sequential_readahead_chunks)
    app[handlers.READAHEAD] = readahead
    app[handlers.READS] = ObjectReads(
        cache, book, readahead, config.readahead_chunks, app[handlers.READ_LATENCY]
    )
    warm = WarmJobs(cache, concurrency=max(1, config.fetch_concurrency // 2))
    app[handlers.WARM] = warm
    app[handlers.REGISTRY] = make_registry(
        [*stats_series(cache, warm, app[handlers.READ_LATENCY], app[S3_STATS].read_latency),
         *auth.app_series(app, "spoke"),
         *limits.app_series(app, "spoke"),
         *front.app_series(app, "spoke"), *app[S3_STATS].series()]
    )
    scrubbing = None
    if config.scrub_rate_bytes_s:
        scrubbing = asyncio.create_task(
            BackgroundScrub(cache, config.scrub_rate_bytes_s).run_forever())
    try:
        yield
    finally:
        if scrubbing is not None:
            scrubbing.cancel()
        await readahead.close()
        await plans.close()
        await warm.close()
        await cache.close()
        await cache.hub.close()


async def open_cache(
    config: SpokeConfig, plans: PlanBook, clock: Clock = SYSTEM_CLOCK
) -> ChunkCache:
    """The spoke's cache, opened, with an eviction policy that consults ``plans``."""
    store = ChunkStore(config.cache_dir)
    loop = asyncio.get_running_loop()
    # Re-hashes chunk files when the index turns out damaged: off the event loop.
    index = await loop.run_in_executor(None, open_index, store, config.cache_dir)
    if config.verify_on_start:
        report = await loop.run_in_executor(None, scrub, store, index)
        logger.info("start-up scrub: %s", report)
    hub = HubClient(
        config.hub_url,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.read_timeout_s,
        max_connections=config.fetch_concurrency * 2,
        token=auth.load_token(config.hub_token_file) if config.hub_token_file else None,
        # Without --hub-ca aiohttp's default context verifies against the system CAs.
        ssl_context=client_context(config.hub_ca) if config.hub_ca else None,
    )
    await hub.start()
    upstream: HubClient | TieredUpstream = hub
    tier = None
    if config.peers:
        peer_ca = config.peer_ca or config.hub_ca
        membership = Membership(config.peers, advertised_url(config), config.capacity_bytes,
                                refresh_s=config.peer_refresh_s)
        upstream = tier = TieredUpstream(
            hub, membership, secret=peer_secret(config), peer_timeout_s=config.peer_timeout_s,
            max_connections=config.fetch_concurrency * 2,
            ssl_context=client_context(peer_ca) if peer_ca else None,
            keep_copies=config.peer_keep_copies)
        await tier.start()
    cache = ChunkCache(
        store=store,
        index=index,
        policy=PlanAwarePolicy(
            make_policy(config.policy, config.capacity_bytes, config.admission), plans.next_use,
        ),
        hub=upstream,
        clock=clock,
        capacity_bytes=config.capacity_bytes,
        meta_ttl_s=config.meta_ttl_s,
        fetch_concurrency=config.fetch_concurrency,
        due=plans.due,
        stats=SpokeStats(),
        max_age_s=config.max_age_s,
        tenant_quota_bytes=config.tenant_quota_bytes,
        pinned_prefixes=config.pinned_prefixes,
        pin_fraction=config.pin_fraction,
        retry=RetryPolicy(attempts=config.fetch_attempts, deadline_s=config.fetch_deadline_s),
        breaker=CircuitBreaker(
            failure_threshold=config.breaker_threshold, reset_timeout_s=config.breaker_reset_s,
            clock=clock.monotonic,
        ),
        placement=tier,
    )
    if tier is not None:
        tier.manifest_of, tier.stats = cache.manifests.known, cache.stats
        tier.hub_breaker = cache.breaker
    await cache.open()
    return cache
