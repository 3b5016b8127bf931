"""The spoke's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.auth import parse_ttl
from protocol.errors import ProtocolError
from protocol.paths import validate_prefix
from service.auth import add_auth_flags
from service.cli import add_flag, add_logging_flags, positive, size_arg
from service.limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_INFLIGHT_PER_CLIENT,
    add_limit_flags,
)
from service.tls import add_tls_flags, parse_checked
from spoke.policy import POLICY_NAMES as POLICIES

# --cpu-affinity: "spread" binds each process to one CPU (spoke.workers.cpus says when it pays).
AFFINITIES = ("off", "spread")
# ``--workers auto``: two processes per core, not one. SO_REUSEPORT spreads a loader's
# connections over the processes by hash, unevenly (64 connections over two split as
# 24/40 in two of three runs), and a process that got more waits on its own core
# while the other idles. With more processes than cores the scheduler evens out the
# load. Measured on 2 cores (warm 64 KiB hits, 64 connections, side by side): 2
# processes 22.5k req/s, 3 23.2k, 4 25.5k, 6 23.6k, 8 22.6k; nginx there is best
# with its one per core (4 workers: 0.95x).
WORKERS_PER_CORE = 2
# The background scrub's pace (--scrub-rate). At 4 MiB chunks, one chunk every 250 ms:
# a niced thread's read and hash of it are a fraction of a percent of one core, the
# disk reads are a few percent of an SSD's (pages read once stay on the kernel's
# inactive list: they do not push the loaders' hot chunks out of the page cache),
# and a 1 TB cache is checked in full about once a day.
DEFAULT_SCRUB_RATE = 16 << 20


@dataclass(frozen=True, slots=True)
class SpokeConfig:
    hub_url: str
    cache_dir: str
    capacity_bytes: int
    policy: str = "arc"
    host: str = "127.0.0.1"
    port: int = 8701
    meta_ttl_s: float = 5.0
    fetch_concurrency: int = 16
    readahead_chunks: int = 4
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0
    fetch_attempts: int = 3
    fetch_deadline_s: float = 15.0
    breaker_threshold: int = 5
    breaker_reset_s: float = 1.0
    verify_on_start: bool = False
    scrub_rate_bytes_s: int = DEFAULT_SCRUB_RATE
    plan_window_bytes: int = 256 << 20
    sequential_readahead_chunks: int = 8
    max_age_s: float = 0.0
    tenant_quota_bytes: int = 0
    pinned_prefixes: tuple[str, ...] = ()
    pin_fraction: float = 0.5
    log_level: str = "info"
    log_format: str = "text"
    access_log: str = "on"
    auth_secret_file: str | None = None
    auth_previous_secret_file: str | None = None
    metrics_auth: str = "off"
    hub_token_file: str | None = None
    hub_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    max_inflight_per_client: int = DEFAULT_MAX_INFLIGHT_PER_CLIENT
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S
    workers: int = 1
    cpu_affinity: str = "off"  # or "spread" (spoke.workers.cpus)
    # Set only in a reader worker's process, by its owner (spoke.workers.pool).
    reader_channel_fd: int | None = None
    reader_cpu: int | None = None


def _serve_flags(p: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_flag(p, "--hub", env=env, required=True, help="base URL of the hub")
    add_flag(p, "--cache-dir", env=env, required=True, help="directory of the chunk cache")
    add_flag(p, "--capacity", env=env, required=True, type=positive(size_arg),
             help="hard limit on cached bytes on disk (e.g. 50GiB)")
    add_flag(p, "--policy", env=env, default="arc", choices=POLICIES, help="eviction policy")
    add_flag(p, "--host", env=env, default="127.0.0.1", help="address to bind")
    add_flag(p, "--port", env=env, default=8701, type=int, help="port (0 picks a free one)")
    add_flag(p, "--meta-ttl", env=env, default=5.0, type=float,
             help="seconds an object's size/etag is trusted before asking the hub again")
    add_flag(p, "--fetch-concurrency", env=env, default=16, type=positive(int),
             help="chunk fetches in flight to the hub at once")
    add_flag(p, "--readahead", env=env, default=4, type=int,
             help="chunks fetched ahead of a reader within one range")
    # At 60 ms RTT a healthy connect takes ~60 ms and a 4 MiB chunk well under a
    # second; these bounds only trip on a link that is really broken.
    add_flag(p, "--connect-timeout", env=env, default=2.0, type=float,
             help="seconds to open a connection to the hub")
    add_flag(p, "--read-timeout", env=env, default=5.0, type=float,
             help="seconds without any data from the hub before a fetch attempt fails")
    add_flag(p, "--fetch-attempts", env=env, default=3, type=positive(int),
             help="attempts per hub request (exponential backoff with jitter between)")
    add_flag(p, "--fetch-deadline", env=env, default=15.0, type=float,
             help="seconds after which a hub request is not retried any more")
    add_flag(p, "--breaker-threshold", env=env, default=5, type=positive(int),
             help="consecutive hub failures that open the circuit breaker")
    add_flag(p, "--breaker-reset", env=env, default=1.0, type=float,
             help="seconds the breaker stays open before one probe may go through")
    add_flag(p, "--seq-readahead", env=env, default=8, type=int,
             help="chunks fetched ahead of a reader streaming an object range by range "
                  "(0 = off; size it to bandwidth x RTT)")
    add_flag(p, "--plan-window", env=env, default="256MiB", type=positive(size_arg),
             help="bytes fetched ahead of a loader that registered its read plan")
    add_flag(p, "--max-age", env=env, default="0", type=_age,
             help="drop cached chunks stored longer ago than this (30m, 12h, 7d; 0 = never)")
    add_flag(p, "--tenant-quota", env=env, default="0", type=size_arg,
             help="bytes one tenant's reads may keep cached (0 = no quota); "
                  "a tenant at its quota evicts its own chunks first")
    add_flag(p, "--pin", env=env, default="", type=_prefixes,
             help="comma-separated prefixes whose chunks are never evicted (up to --pin-fraction)")
    add_flag(p, "--pin-fraction", env=env, default=0.5, type=_fraction,
             help="most of the capacity pinned prefixes may hold")
    add_flag(p, "--verify-on-start", env=env, default=False, action="store_true",
             help="check every cached chunk's digest at start-up and drop bad ones")
    add_flag(p, "--scrub-rate", env=env, default="16MiB", type=size_arg,
             help="bytes per second the background scrub re-hashes cached chunks at, "
                  "dropping bad ones (e.g. 64MiB; 0 = off)")
    add_logging_flags(p, env)
    add_auth_flags(p, env)
    add_flag(p, "--hub-token-file", env=env,
             help="file holding the spoke's own bearer token, sent on every hub request")
    add_flag(p, "--hub-ca", env=env,
             help="PEM CA bundle to verify an https:// hub with (default: the system CAs)")
    add_tls_flags(p, env)
    add_limit_flags(p, env)
    add_flag(p, "--workers", env=env, default="1", type=_workers,
             help="processes serving the port: the spoke and N-1 reader workers answering "
                  "cache hits from its files (SO_REUSEPORT; 'auto': two per core; plain HTTP)")
    add_flag(p, "--cpu-affinity", env=env, default="off", choices=AFFINITIES,
             help="'spread': bind each of the spoke's processes to one CPU of those it may "
                  "use, in turn (for --workers; see spoke/workers/cpus.py); 'off': let the kernel "
                  "place them")
    p.add_argument("--reader-channel", type=int, help=argparse.SUPPRESS)
    p.add_argument("--reader-cpu", type=int, help=argparse.SUPPRESS)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spoke", description="hubspoke spoke")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve loaders from a local chunk cache in front of a hub",
        description="Cache a hub's objects chunk by chunk on local disk and serve them.",
    )
    _serve_flags(serve, env)
    verify = commands.add_parser(
        "verify", help="check every cached chunk against its digest; drop bad ones",
        description="Scrub a (stopped) spoke's cache directory.",
    )
    add_flag(verify, "--cache-dir", env=env, required=True, help="directory of the chunk cache")
    warm = commands.add_parser(
        "warm", help="pre-warm a spoke with a prefix or paths, showing progress",
        description="Start a pre-warm job on a running spoke and follow it to the end.",
    )
    add_flag(warm, "--spoke", env=env, default="http://127.0.0.1:8701", help="the spoke's URL")
    group = warm.add_mutually_exclusive_group(required=True)
    group.add_argument("--prefix", help="warm every object under this prefix ('' for all)")
    group.add_argument("--path", action="append", dest="paths", help="an object (repeatable)")
    warm.add_argument("--quiet", action="store_true", help="no progress bar")
    add_flag(warm, "--token-file", env=env,
             help="file holding an admin bearer token (when the spoke checks tokens)")
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = build_parser(env)
    args = parse_checked(parser, argv)
    if args.command == "serve" and args.workers > 1 and args.tls_cert:
        parser.error("--workers above 1 needs plain HTTP: a TLS session cannot move "
                     "between processes")
    if (args.command == "serve" and args.cpu_affinity != "off"
            and not hasattr(os, "sched_setaffinity")):
        parser.error("--cpu-affinity needs an OS that binds threads to CPUs (Linux)")
    return args


def config_from_args(args: argparse.Namespace) -> SpokeConfig:
    return SpokeConfig(
        hub_url=args.hub,
        cache_dir=args.cache_dir,
        capacity_bytes=int(args.capacity),
        policy=args.policy,
        host=args.host,
        port=int(args.port),
        meta_ttl_s=float(args.meta_ttl),
        fetch_concurrency=int(args.fetch_concurrency),
        readahead_chunks=max(0, int(args.readahead)),
        connect_timeout_s=float(args.connect_timeout),
        read_timeout_s=float(args.read_timeout),
        fetch_attempts=int(args.fetch_attempts),
        fetch_deadline_s=float(args.fetch_deadline),
        breaker_threshold=int(args.breaker_threshold),
        breaker_reset_s=float(args.breaker_reset),
        verify_on_start=_flag(args.verify_on_start),
        scrub_rate_bytes_s=int(args.scrub_rate),
        plan_window_bytes=int(args.plan_window),
        sequential_readahead_chunks=max(0, int(args.seq_readahead)),
        max_age_s=float(args.max_age),
        tenant_quota_bytes=int(args.tenant_quota),
        pinned_prefixes=tuple(args.pin),
        pin_fraction=float(args.pin_fraction),
        log_level=args.log_level,
        log_format=args.log_format,
        access_log=args.access_log,
        auth_secret_file=args.auth_secret_file or None,
        auth_previous_secret_file=args.auth_previous_secret_file or None,
        metrics_auth=args.metrics_auth,
        hub_token_file=args.hub_token_file or None,
        hub_ca=args.hub_ca or None,
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
        max_inflight_per_client=int(args.max_inflight_per_client),
        max_connections_per_client=int(args.max_connections_per_client),
        header_timeout_s=float(args.header_timeout),
        keepalive_timeout_s=float(args.keepalive_timeout),
        workers=int(args.workers),
        cpu_affinity=args.cpu_affinity,
        reader_channel_fd=args.reader_channel,
        reader_cpu=args.reader_cpu,
    )


def _prefixes(text: str) -> tuple[str, ...]:
    """argparse ``type=`` for ``--pin``: comma-separated object path prefixes."""
    prefixes = tuple(p.strip() for p in text.split(",") if p.strip())
    for prefix in prefixes:
        try:
            validate_prefix(prefix)
        except ProtocolError as exc:
            raise argparse.ArgumentTypeError(f"{prefix!r}: {exc}") from None
    return prefixes


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction between 0 and 1, not {text}")
    return value


def _age(text: str) -> int:
    """argparse ``type=`` for ``--max-age``: ``0`` (never), seconds, or ``30m``/``12h``/``7d``."""
    if text.strip() == "0":
        return 0
    try:
        return parse_ttl(text)
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers(text: str) -> int:
    """argparse ``type=`` for ``--workers``: a positive count, or ``auto`` (two per core)."""
    if text == "auto":
        return WORKERS_PER_CORE * max(1, len(os.sched_getaffinity(0)))
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError("--workers must be at least 1")
    return count


def _flag(value: object) -> bool:
    """A store_true flag whose env default may arrive as text ('1', 'true')."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
