"""Pre-warm jobs: fill the cache with a list of objects or a prefix before training.

A job lists what it must fetch, then fetches missing chunks as background work
(bounded concurrency, yielding to loaders' demand fetches) while counting
progress, so an operator can watch bytes, rate and ETA, and cancel.

A job belongs to the tenant that started it: its chunks count against that
tenant's quota, and other tenants cannot see or cancel it (404, as for a job that
does not exist). A prefix matches whole segments, as token prefixes do: ``b``
warms ``b`` and ``b/...``, never ``bank/...``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from protocol.auth import Claims, allows, path_allowed
from protocol.chunks import chunk_bounds
from protocol.errors import ProtocolError
from protocol.manifest import Manifest
from spoke.cache.engine import ChunkCache

logger = logging.getLogger(__name__)

RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"
# Errors kept per job: enough to diagnose, bounded whatever the job's size.
_MAX_ERRORS_KEPT = 20


class WarmJobNotFound(ProtocolError):
    status_hint = 404
    title = "No such warm job"


@dataclass
class WarmJob:
    id: str
    paths: list[str] | None
    prefix: str | None
    tenant: str = ""
    claims: Claims | None = None  # what the starter may read; None when auth is off
    state: str = RUNNING
    bytes_total: int = 0
    bytes_done: int = 0
    chunks_total: int = 0
    chunks_done: int = 0
    chunks_fetched: int = 0
    error_count: int = 0
    errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    task: asyncio.Task[None] | None = None

    def snapshot(self) -> dict[str, object]:
        elapsed = (self.finished or time.monotonic()) - self.started
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        remaining = self.bytes_total - self.bytes_done
        eta = 0.0 if remaining <= 0 else (remaining / rate if rate > 0 else None)
        return {
            "id": self.id, "state": self.state,
            "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
            "chunks_done": self.chunks_done, "chunks_total": self.chunks_total,
            "chunks_fetched": self.chunks_fetched,
            "rate_bytes_per_s": round(rate, 1), "eta_s": None if eta is None else round(eta, 1),
            "elapsed_s": round(elapsed, 3), "errors": self.errors, "error_count": self.error_count,
        }

    def fail(self, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(message)


class WarmJobs:
    """Running and recent warm jobs of one spoke."""

    def __init__(self, cache: ChunkCache, concurrency: int = 4, keep: int = 100) -> None:
        self.cache = cache
        self.concurrency = concurrency
        self._keep = keep
        self._jobs: OrderedDict[str, WarmJob] = OrderedDict()

    def start(
        self, paths: list[str] | None = None, prefix: str | None = None,
        claims: Claims | None = None,
    ) -> WarmJob:
        tenant = claims.tenant if claims is not None else ""
        job = WarmJob(secrets.token_hex(8), paths, prefix, tenant, claims)
        job.task = asyncio.create_task(self._run(job))
        self._jobs[job.id] = job
        while len(self._jobs) > self._keep:
            oldest = next(iter(self._jobs.values()))
            if oldest.state == RUNNING:
                break
            self._jobs.popitem(last=False)
        return job

    def get(self, job_id: str, tenant: str = "") -> WarmJob:
        """Job ``job_id`` if ``tenant`` started it (another tenant's is not found)."""
        job = self._jobs.get(job_id)
        if job is None or job.tenant != tenant:
            raise WarmJobNotFound(f"no warm job {job_id!r}")
        return job

    def jobs(self, tenant: str | None = None) -> list[WarmJob]:
        """The jobs ``tenant`` started; every job when ``tenant`` is None."""
        return [j for j in self._jobs.values() if tenant is None or j.tenant == tenant]

    def cancel(self, job_id: str, tenant: str = "") -> WarmJob:
        job = self.get(job_id, tenant)
        if job.state == RUNNING and job.task is not None:
            job.task.cancel()
            job.state = CANCELLED
            job.finished = time.monotonic()
        return job

    async def close(self) -> None:
        tasks = [j.task for j in self._jobs.values() if j.task is not None and not j.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    @property
    def running(self) -> int:
        return sum(j.state == RUNNING for j in self._jobs.values())

    async def _run(self, job: WarmJob) -> None:
        try:
            manifests = await self._plan(job)
            await self._fetch_all(job, manifests)
        except asyncio.CancelledError:
            job.state = CANCELLED
            raise
        except ProtocolError as exc:
            job.fail(f"{type(exc).__name__}: {exc}")
        finally:
            if job.state == RUNNING:
                job.state = FAILED if job.error_count else DONE
            job.finished = job.finished or time.monotonic()
            logger.info("warm job %s %s: %d/%d chunks, %d fetched, %d errors", job.id,
                        job.state, job.chunks_done, job.chunks_total, job.chunks_fetched,
                        job.error_count)

    async def _plan(self, job: WarmJob) -> list[Manifest]:
        paths = job.paths
        if paths is None:
            prefix = job.prefix or ""
            listed = await self.cache.hub.list_objects(prefix)
            # The hub lists by string prefix (``b`` lists ``bank/``): keep whole segments,
            # and only what the job's starter may read.
            paths = [path for path, _ in listed if path_allowed(prefix, path)
                     and (job.claims is None or allows(job.claims, path))]
        manifests = []
        for path in paths:
            try:
                manifest, _ = await self.cache.manifest(path)
            except ProtocolError as exc:
                job.fail(f"{path}: {exc}")
                continue
            manifests.append(manifest)
            job.bytes_total += manifest.size
            job.chunks_total += manifest.chunk_count
        return manifests

    async def _fetch_all(self, job: WarmJob, manifests: list[Manifest]) -> None:
        todo = ((m, i) for m in manifests for i in range(m.chunk_count))

        async def worker() -> None:
            for manifest, index in todo:
                await self._fetch_one(job, manifest, index)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    async def _fetch_one(self, job: WarmJob, manifest: Manifest, index: int) -> None:
        try:
            fetched = await self.cache.prefetch(manifest, index, job.tenant)
        except ProtocolError as exc:
            job.fail(f"{manifest.path} chunk {index}: {exc}")
            return
        job.chunks_fetched += fetched
        job.chunks_done += 1
        job.bytes_done += chunk_bounds(index, manifest.size, manifest.chunk_size).length
