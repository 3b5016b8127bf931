"""The spoke's HTTP handlers: thin; the work is in ChunkCache and RangeReader."""

from __future__ import annotations

import functools
import json
import time
from typing import Protocol

import msgpack
from aiohttp import web
from prometheus_client import CollectorRegistry

from protocol.auth import allows
from protocol.errors import ProtocolError
from protocol.manifest import Manifest
from protocol.paths import validate_path, validate_prefix
from protocol.plan_request import job_plan_id, job_series, parse_job
from protocol.ranges import ByteRange
from service.auth import CLAIMS, check_paths, check_prefix
from service.body import send_plan
from service.listing import listing
from service.metrics import Histogram, metrics_response
from spoke.cache.engine import ChunkCache
from spoke.config import SpokeConfig
from spoke.prefetch.plan_prefetch import PlanPrefetcher
from spoke.prefetch.plans import MAX_PLAN_READS, PlanBook, PlannedRead, ReadPlan
from spoke.prefetch.readahead import SequentialReadahead
from spoke.prefetch.warm import WarmJobs
from spoke.serve.objects import ObjectReads, boundary_watch, watched
from spoke.serve.stats import stats_snapshot
from spoke.upstream.errors import StaleVersion


class ReaderWorkers(Protocol):
    """The reader worker processes (:class:`spoke.workers.pool.ReaderPool`) as the handlers
    see them: a protocol, because the workers run this package's reads, not the reverse."""

    handed_over: int  # connections readers passed to this process
    restarts: int  # readers replaced after dying on their own

    @property
    def alive(self) -> int: ...

    async def sync(self) -> None:
        """Return once every reader has applied every cache change told so far."""


CACHE = web.AppKey("cache", ChunkCache)
WARM = web.AppKey("warm", WarmJobs)
PLANS = web.AppKey("plans", PlanPrefetcher)
PLAN_BOOK = web.AppKey("plan_book", PlanBook)
READAHEAD = web.AppKey("readahead", SequentialReadahead)
READ_LATENCY = web.AppKey("read_latency", dict[str, Histogram])
READS = web.AppKey("reads", ObjectReads)
CONFIG = web.AppKey("config", SpokeConfig)
REGISTRY = web.AppKey("registry", CollectorRegistry)
# Set (to the same pool as spoke.workers.pool.READERS) when the spoke runs reader workers.
READER_WORKERS: web.AppKey[ReaderWorkers] = web.AppKey("reader_workers")


async def get_object(request: web.Request) -> web.StreamResponse:
    path = validate_path(request.match_info["path"])
    cache = request.app[CACHE]
    early = request.app[READS].fetch_early(request.method, request.headers, path)
    try:
        return await _serve(request, path, *await cache.manifest(path))
    except StaleVersion:
        # The object changed between our metadata and the first chunk: answer the
        # new version from the start rather than splicing two.
        cache.invalidate(path)
        return await _serve(request, path, *await cache.manifest(path))
    finally:
        cache.drop_early(early)  # a no-op once a chunk flight took it on


async def _serve(
    request: web.Request, path: str, manifest: Manifest, stale: bool
) -> web.StreamResponse:
    reads = request.app[READS]
    tenant = _tenant(request)
    prepared = reads.prepare(request.method, request.headers, path, manifest, stale, tenant)
    reader = reads.reader(manifest, tenant)
    for prime in prepared.primes:  # a failure still gets a status
        await reader.prime(prime.index, prime.within)

    watch = boundary_watch(prepared.plan)

    async def write_range(r: ByteRange, response: web.StreamResponse) -> None:
        await reader.write(r, watched(watch, response.write))

    reads.sending(prepared)
    started = time.perf_counter()
    response = await send_plan(request, prepared.plan, write_range, prepared.headers)
    reads.observe_latency(prepared.x_cache, time.perf_counter() - started)
    return response


async def get_list(request: web.Request) -> web.Response:
    prefix = validate_prefix(request.match_info.get("prefix", ""))
    accept = request.headers.get("Accept", "application/json")
    body, content_type = await request.app[CACHE].hub.fetch_list(prefix, accept)
    return listing(body, content_type)


def _tenant(request: web.Request) -> str:
    """Whose request this is: the token's tenant, or ``""`` when auth is off."""
    claims = request.get(CLAIMS)
    return claims.tenant if claims is not None else ""


async def get_stats(request: web.Request) -> web.Response:
    """The spoke's counters; ``tenant_bytes`` counts only the objects the admin's
    token covers (the rest is spoke-wide totals, which name no tenant or path)."""
    claims = request.get(CLAIMS)
    covered = None
    if claims is not None and "" not in claims.prefixes:
        covered = functools.partial(allows, claims)
    snapshot = stats_snapshot(request.app[CACHE], covered)
    readers = request.app.get(READER_WORKERS)
    if readers is not None:
        snapshot["reader_workers"] = readers.alive
        snapshot["handed_over_connections"] = readers.handed_over
        snapshot["reader_restarts"] = readers.restarts
    return web.json_response(snapshot)


async def delete_cache(request: web.Request) -> web.Response:
    """Purge one object's chunks (every version), or a prefix's with a trailing ``/``."""
    raw = request.match_info["path"]
    cache = request.app[CACHE]
    if raw.endswith("/"):
        removed = await cache.purge(prefix=validate_prefix(raw))
    else:
        removed = await cache.purge(path=validate_path(raw))
    readers = request.app.get(READER_WORKERS)
    if readers is not None:
        await readers.sync()  # no reader worker serves a purged chunk after this answer
    return web.json_response({"purged_chunks": removed})


class BadRequestBody(ProtocolError):
    title = "Bad request body"


async def start_warm(request: web.Request) -> web.Response:
    """``POST /warm`` with ``{"paths": [...]}`` or ``{"prefix": "..."}`` → 202 and the job id."""
    body = await _json_object(request)
    paths, prefix = body.get("paths"), body.get("prefix")
    if (paths is None) == (prefix is None):
        raise BadRequestBody('give exactly one of "paths" (a list) or "prefix" (a string)')
    if paths is not None:
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise BadRequestBody('"paths" must be a list of object paths')
        paths = [validate_path(p) for p in paths]
        check_paths(request, paths)
        job = request.app[WARM].start(paths=paths, claims=request.get(CLAIMS))
    elif isinstance(prefix, str):
        check_prefix(request, validate_prefix(prefix))
        job = request.app[WARM].start(prefix=validate_prefix(prefix), claims=request.get(CLAIMS))
    else:
        raise BadRequestBody('"prefix" must be a string')
    return web.json_response(job.snapshot(), status=202,
                             headers={"Location": f"/warm/{job.id}"})


async def get_warm(request: web.Request) -> web.Response:
    job = request.app[WARM].get(request.match_info["id"], _tenant(request))
    return web.json_response(job.snapshot())


async def list_warm(request: web.Request) -> web.Response:
    jobs = request.app[WARM].jobs(_tenant(request))
    return web.json_response({"jobs": [j.snapshot() for j in jobs]})


async def cancel_warm(request: web.Request) -> web.Response:
    job = request.app[WARM].cancel(request.match_info["id"], _tenant(request))
    return web.json_response(job.snapshot())


async def create_plan(request: web.Request) -> web.Response:
    """``POST /plans``: ``{"reads": [[path, offset, length], ...], "job": name}`` in JSON
    or msgpack (``job`` optional: see :mod:`protocol.plan_request`). A job's plan that
    exists already is answered ``200`` as it is."""
    body = await _json_object(request)
    job = parse_job(body.get("job"))
    reads = body.get("reads")
    if not isinstance(reads, list) or not reads:
        raise BadRequestBody('"reads" must be a non-empty list of [path, offset, length]')
    if len(reads) > MAX_PLAN_READS:
        raise BadRequestBody(f"a plan holds at most {MAX_PLAN_READS} reads")
    planned = [_planned_read(r) for r in reads]
    check_paths(request, {p.path for p in planned})  # a tenant plans only what it may read
    tenant = _tenant(request)
    plan_id = None if job is None else job_plan_id(tenant, job)
    if plan_id is not None and any(p.id == plan_id for p in request.app[PLAN_BOOK].plans(tenant)):
        return web.json_response(_plan_view(request.app[PLAN_BOOK].get(plan_id, tenant)),
                                 headers={"Location": f"/plans/{plan_id}"})
    plan = await request.app[PLANS].create(
        planned, tenant, plan_id=plan_id, job="" if job is None else job_series(job))
    return web.json_response(_plan_view(plan), status=201,
                             headers={"Location": f"/plans/{plan.id}"})


def _planned_read(item: object) -> PlannedRead:
    if (
        isinstance(item, list | tuple) and len(item) == 3 and isinstance(item[0], str)
        and all(type(v) is int and v >= 0 for v in item[1:])
    ):
        return PlannedRead(validate_path(item[0]), item[1], item[2])
    raise BadRequestBody(f"a planned read is [path, offset, length], not {str(item)[:80]}")


def _plan_view(plan: ReadPlan) -> dict[str, object]:
    return {"id": plan.id, "chunk_reads": len(plan), "distinct_chunks": plan.distinct_chunks,
            "cursor": plan.cursor, "finished": plan.finished}


async def get_plan(request: web.Request) -> web.Response:
    plan = request.app[PLAN_BOOK].get(request.match_info["id"], _tenant(request))
    return web.json_response(_plan_view(plan))


async def list_plans(request: web.Request) -> web.Response:
    plans = request.app[PLAN_BOOK].plans(_tenant(request))
    return web.json_response({"plans": [_plan_view(p) for p in plans]})


async def delete_plan(request: web.Request) -> web.Response:
    await request.app[PLANS].delete(request.match_info["id"], _tenant(request))
    return web.json_response({"deleted": request.match_info["id"]})


async def _json_object(request: web.Request) -> dict[str, object]:
    raw = await request.read()
    if request.content_type == "application/msgpack":
        try:
            body = msgpack.unpackb(raw, raw=False)
        except Exception as exc:  # msgpack raises many types for bad input
            raise BadRequestBody(f"request body is not msgpack: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequestBody("request body must be a map")
        return body
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequestBody(f"request body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequestBody("request body must be a JSON object")
    return body


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[REGISTRY])


