"""A reader worker on the S3 port: warm GetObjects answered here, the rest by the owner.

With ``--workers`` and ``--s3-port`` every process of the spoke listens on the S3 port
too (``SO_REUSEPORT``). A reader answers what the S3 front end's fast path would
(:class:`spoke.s3.fast.FastTargets`: a path-style ranged GetObject, its signature and
its key's scope checked here) when it is a plain read of chunks the owner has said it
stores, through the same reads as ``/objects`` (:class:`spoke.workers.worker.ReaderReads`),
with S3's request id in its head. Everything else (a miss, a listing, a HeadObject, a
refusal, a conditional...) it hands over with its connection as ``/objects`` reads are
(:class:`~spoke.workers.messages.S3HandedOver`), and the owner's S3 front end answers
it, S3 errors, auth failures and all. What it served is reported to the owner with the
rest (:class:`~spoke.workers.messages.S3Counted`), for ``/metrics``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from protocol.http1 import RequestHead
from service.fast import Adopter, FastConnection, FastHandler, FastServer, Reply
from service.limits import ConnectionLimits
from spoke.config import SpokeConfig
from spoke.s3.access import S3Access, load_keys
from spoke.s3.errors import AMZ_REQUEST_ID
from spoke.s3.fast import GET_OBJECT, FastTargets, counted
from spoke.s3.stats import S3Stats
from spoke.workers import messages


class S3ReaderReads:
    """The reader's S3 :data:`service.fast.FastHandler`: warm ranged GetObjects, else
    None (handed over)."""

    takes_queries = True  # keys are percent-encoded, presigned URLs carry a query
    request_id_header = AMZ_REQUEST_ID  # every head the fast path writes carries it

    def __init__(
        self, reads: FastHandler, access: S3Access, domain: str | None, guarded: bool,
    ) -> None:
        """``reads``: the reader's ``/objects`` reads, checking no token (the S3 key is
        what a read carries here)."""
        self.targets = FastTargets(access, domain)
        self.reads = reads
        # With tokens on, the owner's S3 fast path declines every read (spoke.s3.fast):
        # so does this one, and both answer alike.
        self.guarded = guarded
        self.stats = S3Stats()  # since the last report

    def __call__(
        self, head: RequestHead, conn: FastConnection
    ) -> Reply | Awaitable[Reply | None] | None:
        if self.guarded or head.method != "GET":
            return None
        read = self.targets.read(head)
        if read is None:
            return None
        started = time.perf_counter()
        answer = self.reads(read[1], conn)
        if answer is None:
            return None
        if isinstance(answer, Reply):
            stats = self.stats
            if answer.x_cache == "HIT":  # counted(), inline: this runs on every warm read
                stats.requests[GET_OBJECT] += 1
                stats.read_latency["hit"].observe(time.perf_counter() - started)
            else:
                counted(stats, GET_OBJECT, answer, started)
            return answer
        return self._when_done(answer, started)

    async def _when_done(self, answer: Awaitable[Reply | None], started: float) -> Reply | None:
        reply = await answer
        if reply is not None:
            counted(self.stats, GET_OBJECT, reply, started)
        return reply

    def report(self) -> list[messages.S3Counted]:
        """What was answered since the last report, for the owner's S3 counters."""
        if not self.stats.requests:
            return []
        hit = self.stats.read_latency["hit"]
        report = messages.S3Counted(dict(self.stats.requests), hit.counts, hit.sum)
        self.stats = S3Stats()
        return [report]


async def serve_s3(
    config: SpokeConfig, reads: FastHandler, hand_over: Callable[[], Adopter],
    limits: ConnectionLimits,
) -> tuple[S3ReaderReads, FastServer, asyncio.Server] | None:
    """Listen on the S3 port beside the owner (None when the spoke serves no S3), with
    ``reads`` (see :class:`S3ReaderReads`) and ``hand_over`` for what they decline."""
    if config.s3_port is None:
        return None
    keys = load_keys(config.s3_credentials) if config.s3_credentials else None
    s3_reads = S3ReaderReads(reads, S3Access(keys), config.s3_domain,
                             guarded=config.auth_secret_file is not None)
    server = FastServer(s3_reads, hand_over, limits, idle_timeout_s=config.keepalive_timeout_s)
    listener = await asyncio.get_running_loop().create_server(
        server, config.host, config.s3_port, reuse_address=True, reuse_port=True
    )
    return s3_reads, server, listener
