"""Locust users that read a spoke the way data-loader workers do.

    locust -f loadtest/locustfile.py --host http://SPOKE:8701 --hub-url http://HUB:8700

Each user learns the dataset from the target's ``GET /list/{prefix}`` (nothing is
hard-coded), picks a few shards, and per epoch reads every fixed-size sample of
them in a shuffled order by HTTP range (the reference workload: 4096-token uint32
sequences, 16 KiB each). Mixed in, at a lower weight: large sequential reads of one
chunk-aligned block (4 MiB by default) and ``HEAD``s.

Every read is checked: status 206, body length, ``Content-Range``. On a fraction
of sample reads (``--verify-fraction``, default 0.05) the bytes are compared with
the hub's bytes for the same range and ETag; every large read that covers exactly
one chunk is checked against the hub manifest's per-chunk digest. Both need the
hub's URL (``--hub-url``); without it only the structural checks run.

Each data read also fires a Locust request event of type ``cache`` named
``X-Cache HIT`` / ``X-Cache MISS`` / ``X-Cache PARTIAL`` (with that read's
latency), so the report has the hit/miss counts and ``--csv-full-history`` has
them per second: the hit ratio over time. Verified reads fire ``verify`` events.

Options (each also from its environment variable): ``--hub-url``
(``HUBSPOKE_HUB_URL``), ``--verify-fraction`` (``HUBSPOKE_VERIFY_FRACTION``),
``--list-prefix`` (``HUBSPOKE_LIST_PREFIX``), ``--shards-per-user``
(``HUBSPOKE_SHARDS_PER_USER``), ``--sample-bytes`` (``HUBSPOKE_SAMPLE_BYTES``),
``--large-read-bytes`` (``HUBSPOKE_LARGE_READ_BYTES``).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from locust import FastHttpUser, constant, events, task
from locust.contrib.fasthttp import FastResponse, ResponseContextManager

from loadtest.dataset import SAMPLE_BYTES
from protocol.digests import digest
from protocol.headers import CACHE_HEADER
from protocol.manifest import Manifest, decode_manifest

logger = logging.getLogger("hubspoke.locust")

CACHE_EVENT = "cache"  # request_type of the X-Cache pseudo-requests
VERIFY_EVENT = "verify"  # request_type of the byte-verification pseudo-requests


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _add_options(parser: Any) -> None:
    parser.add_argument("--hub-url", default="", env_var="HUBSPOKE_HUB_URL",
                        help="hub base URL, for byte verification (empty: no verification)")
    parser.add_argument("--verify-fraction", type=float, default=0.05,
                        env_var="HUBSPOKE_VERIFY_FRACTION",
                        help="fraction of sample reads whose bytes are checked against the hub")
    parser.add_argument("--list-prefix", default="", env_var="HUBSPOKE_LIST_PREFIX",
                        help="dataset prefix passed to GET /list/")
    parser.add_argument("--shards-per-user", type=int, default=4,
                        env_var="HUBSPOKE_SHARDS_PER_USER", help="shards each user reads")
    parser.add_argument("--sample-bytes", type=int, default=SAMPLE_BYTES,
                        env_var="HUBSPOKE_SAMPLE_BYTES", help="bytes per sample read")
    parser.add_argument("--large-read-bytes", type=int, default=4 << 20,
                        env_var="HUBSPOKE_LARGE_READ_BYTES",
                        help="bytes per sequential read (rounded to the hub's chunk size)")


@dataclass(frozen=True, slots=True)
class Shard:
    path: str
    size: int
    etag: str

    @property
    def url(self) -> str:
        return "/objects/" + quote(self.path)


# Manifests are immutable per (path, etag), so all users of this process share them.
_MANIFESTS: dict[tuple[str, str], Manifest] = {}


def expected_content_range(start: int, length: int, size: int) -> str:
    return f"bytes {start}-{start + length - 1}/{size}"


def header(resp: FastResponse | ResponseContextManager, name: str) -> str | None:
    """A response header (repeated ones joined); an error response may have none."""
    if resp.headers is None:
        return None
    value = resp.headers.get(name)
    return ", ".join(value) if isinstance(value, list) else value


def check_read(resp: FastResponse | ResponseContextManager, start: int, length: int,
               size: int) -> str | None:
    """Why a ranged read is wrong, or None when it is right (status, length, Content-Range)."""
    if resp.status_code != 206:
        return f"status {resp.status_code}, expected 206"
    content_range = header(resp, "Content-Range")
    if content_range != expected_content_range(start, length, size):
        return f"Content-Range {content_range!r} for bytes={start}-{start + length - 1}"
    body = resp.content or b""
    if len(body) != length:
        return f"{len(body)} bytes, expected {length}"
    return None


class LoaderUser(FastHttpUser):
    """One data-loader worker: shuffled sample reads over its own shard set."""

    # Loaders read flat out; the point is to find the spoke's limits, not to pace.
    wait_time = constant(0)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.rng = random.Random()
        self.sample_bytes: int = options.sample_bytes if options else SAMPLE_BYTES
        self.verify_fraction: float = options.verify_fraction if options else 0.05
        self.hub_url: str = (options.hub_url if options else "").rstrip("/")
        self.large_bytes: int = options.large_read_bytes if options else 4 << 20
        shards = self._list(options.list_prefix if options else "")
        wanted = options.shards_per_user if options else 4
        self.shards = self.rng.sample(shards, k=min(wanted, len(shards)))
        self.order: list[tuple[Shard, int]] = []
        self.epoch = 0
        # The sequential reader walks one of the user's shards block by block.
        self.seq_shard = self.rng.choice(self.shards)
        self.seq_offset = 0

    def _list(self, prefix: str) -> list[Shard]:
        with self.client.get(f"/list/{quote(prefix)}", name="/list",
                             catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
                raise RuntimeError(f"GET /list/{prefix} answered {resp.status_code}")
            listing = resp.json()
        shards = [Shard(o["path"], int(o["size"]), o["etag"]) for o in listing["objects"]
                  if int(o["size"]) >= self.sample_bytes]
        if not shards:
            raise RuntimeError(f"no object of at least {self.sample_bytes} bytes under {prefix!r}")
        return shards

    # ---------------------------------------------------------------- tasks

    @task(60)
    def read_sample(self) -> None:
        shard, index = self._next_sample()
        start = index * self.sample_bytes
        self._ranged_read(shard, start, self.sample_bytes, "/objects [sample]",
                          verify=self.rng.random() < self.verify_fraction)

    @task(1)
    def read_sequential(self) -> None:
        shard = self.seq_shard
        manifest = self._manifest(shard)
        block = self.large_bytes
        if manifest is not None:
            # Chunk-aligned blocks of exactly one chunk can be checked against a digest.
            block = max(manifest.chunk_size, block - block % manifest.chunk_size)
        if self.seq_offset >= shard.size:
            self.seq_offset = 0
        length = min(block, shard.size - self.seq_offset)
        self._ranged_read(shard, self.seq_offset, length, "/objects [sequential]", verify=True)
        self.seq_offset += length

    @task(1)
    def head(self) -> None:
        shard = self.rng.choice(self.shards)
        with self.client.head(shard.url, name="HEAD /objects", catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}, expected 200")
            elif header(resp, "Content-Length") != str(shard.size):
                resp.failure(f"Content-Length {header(resp, 'Content-Length')!r}, "
                             f"expected {shard.size}")
            elif header(resp, "ETag") != shard.etag:
                resp.failure(f"ETag {header(resp, 'ETag')!r}, expected {shard.etag!r}")

    # ---------------------------------------------------------------- reads

    def _next_sample(self) -> tuple[Shard, int]:
        if not self.order:
            # A new epoch: every sample of the shard set once, in a fresh order.
            self.order = [(s, i) for s in self.shards for i in range(s.size // self.sample_bytes)]
            self.rng.shuffle(self.order)
            self.epoch += 1
        return self.order.pop()

    def _ranged_read(self, shard: Shard, start: int, length: int, name: str,
                     verify: bool) -> None:
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        t0 = time.perf_counter()
        with self.client.get(shard.url, headers=headers, name=name,
                             catch_response=True) as resp:
            elapsed_ms = (time.perf_counter() - t0) * 1000
            problem = check_read(resp, start, length, shard.size)
            if problem is None and verify:
                problem = self._verify(shard, start, resp)
            if problem is not None:
                resp.failure(problem)
                return
            self._cache_event(resp, elapsed_ms, length)

    def _cache_event(self, resp: ResponseContextManager, elapsed_ms: float, length: int) -> None:
        state = header(resp, CACHE_HEADER) or "none"
        self.environment.events.request.fire(
            request_type=CACHE_EVENT, name=f"X-Cache {state}", response_time=elapsed_ms,
            response_length=length, exception=None, context={},
        )

    # ---------------------------------------------------------------- verification

    def _verify(self, shard: Shard, start: int, resp: ResponseContextManager) -> str | None:
        """Why the body is wrong, or None; reads nothing more when no hub URL is known."""
        if not self.hub_url:
            return None
        if header(resp, "ETag") != shard.etag:
            # The object changed since /list; there is no reference to compare with.
            return None
        body = resp.content or b""
        manifest = self._manifest(shard)
        if manifest is not None and start % manifest.chunk_size == 0:
            index = start // manifest.chunk_size
            chunk_len = min(manifest.chunk_size, manifest.size - start)
            if len(body) == chunk_len:
                return self._verify_chunk(manifest, index, body)
        return self._verify_against_hub(shard, start, body)

    def _verify_chunk(self, manifest: Manifest, index: int, body: bytes) -> str | None:
        t0 = time.perf_counter()
        ok = digest(manifest.digest_alg, body) == manifest.digests[index]
        self._verify_event(f"chunk vs manifest {manifest.digest_alg}", t0, len(body), ok)
        return None if ok else f"wrong bytes: chunk {index} fails its {manifest.digest_alg} digest"

    def _verify_against_hub(self, shard: Shard, start: int, body: bytes) -> str | None:
        t0 = time.perf_counter()
        headers = {"Range": f"bytes={start}-{start + len(body) - 1}", "If-Match": shard.etag}
        reference = self.client.get(self.hub_url + shard.url, headers=headers,
                                    name="hub reference range")
        if reference.status_code != 206:
            # Not the spoke's fault; the read is not counted as verified.
            logger.warning("hub reference read answered %s", reference.status_code)
            return None
        ok = reference.content == body
        self._verify_event("sample vs hub bytes", t0, len(body), ok)
        return None if ok else f"wrong bytes at {shard.path} offset {start}"

    def _verify_event(self, name: str, t0: float, length: int, ok: bool) -> None:
        self.environment.events.request.fire(
            request_type=VERIFY_EVENT, name=name,
            response_time=(time.perf_counter() - t0) * 1000, response_length=length,
            exception=None if ok else AssertionError("wrong bytes"), context={},
        )

    def _manifest(self, shard: Shard) -> Manifest | None:
        if not self.hub_url:
            return None
        key = (shard.path, shard.etag)
        if key not in _MANIFESTS:
            resp = self.client.get(f"{self.hub_url}/manifest/{quote(shard.path)}",
                                   name="hub manifest")
            if resp.status_code != 200:
                return None
            manifest = decode_manifest(resp.content or b"")
            if manifest.etag != shard.etag:
                return None
            _MANIFESTS[key] = manifest
        return _MANIFESTS[key]
