"""make_app(config): the hub's routes and shared objects."""

from __future__ import annotations

from aiohttp import web

from hub import handlers
from hub.backend import Backend, FilesystemBackend
from hub.config import HubConfig
from hub.fast import FastObjects
from hub.manifests import ManifestCache
from hub.roots import digest_store_for, open_backend
from hub.stats import HubStats
from hub.store.fills import FastStoreFills, FillStore
from service import auth, front, limits, logs
from service.auth import Access, RouteTable
from service.cli import environ
from service.fast import FAST, FastHandler
from service.metrics import make_registry
from service.problem import Handler, problem_middleware
from service.routes import add_routes


def make_app(config: HubConfig, backend: Backend | None = None,
             stats: HubStats | None = None) -> web.Application:
    """The hub application; ``backend`` defaults to what ``config.root`` names, ``stats``
    to this process's own (a sibling's count with the others': hub.workers)."""
    stats = stats if stats is not None else HubStats()

    @web.middleware
    async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
        stats.requests += 1
        return await handler(request)

    app = web.Application(middlewares=[count_requests, problem_middleware])
    logs.install(app)
    front.install(app)
    limits.install(
        app, config.max_inflight_per_client,
        max_connections_per_client=config.max_connections_per_client,
        header_timeout_s=config.header_timeout_s,
        keepalive_timeout_s=config.keepalive_timeout_s,
    )
    backend = backend or open_backend(config.root, config.s3_endpoint, config.s3_timeout,
                                      environ(), check_directory=False)
    app[handlers.BACKEND] = backend
    digests = digest_store_for(backend, config.index_dir)
    app[handlers.MANIFESTS] = ManifestCache(backend, config.chunk_size, config.digest_alg,
                                            store=digests)
    if digests is not None:
        async def close_index(_: web.Application) -> None:
            digests.close()

        app.on_cleanup.append(close_index)
    app[handlers.STATS] = stats
    fast: FastHandler | None = None
    if isinstance(backend, FilesystemBackend):
        fast = FastObjects(app, backend, stats)
    elif isinstance(backend, FillStore):  # an object store's: a spoke's chunk fills
        fast = FastStoreFills(app, backend, stats)
    if fast is not None:
        app[FAST] = fast
    auth.install(app, auth.make_guard(
        config.auth_secret_file, config.auth_previous_secret_file, routes(config)
    ))
    app[handlers.REGISTRY] = make_registry(
        [*stats.series(), *auth.app_series(app, "hub"), *limits.app_series(app, "hub"),
         *front.app_series(app, "hub")]
    )
    add_routes(app, [
        ("GET", "/objects/{path:.+}", handlers.get_object),
        ("GET", "/manifest/{path:.+}", handlers.get_manifest),
        ("GET", "/list/{prefix:.*}", handlers.get_list),
        ("GET", "/list", handlers.get_list),
        ("GET", "/healthz", handlers.healthz),
        ("GET", "/metrics", handlers.metrics),
    ])
    return app


def routes(config: HubConfig) -> RouteTable:
    """What each route asks of a bearer token when auth is on (unlisted: admin scope)."""
    return {
        ("GET", "/objects/{path}"): Access.OBJECT,
        ("GET", "/manifest/{path}"): Access.OBJECT,
        ("GET", "/list/{prefix}"): Access.LISTING,
        ("GET", "/list"): Access.LISTING,
        ("GET", "/healthz"): Access.OPEN,
        ("GET", "/metrics"): auth.metrics_access(config.metrics_auth),
    }
