"""The spoke's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence

from protocol.auth import parse_ttl
from protocol.errors import ProtocolError
from protocol.paths import validate_prefix
from service.auth import AuthSettings
from service.cli import LoggingSettings, positive, size_arg
from service.limits import LimitSettings
from service.runner import ListenSettings
from service.settings import add_flag, add_settings, config_from, setting, settings
from service.tls import TlsSettings, parse_checked
from service.workers import machine_cpus, parse_worker_count
from spoke.policy import ADMISSIONS, DEFAULT_ADMISSION
from spoke.policy import POLICY_NAMES as POLICIES
from spoke.tier.peers_arg import PeerSource, parse_advertise, parse_peers

# --cpu-affinity: "spread" binds each process to one CPU (spoke.workers.cpus says when it pays).
AFFINITIES = ("off", "spread")
# ``--workers auto``: two processes per core, not one. SO_REUSEPORT spreads a loader's
# connections over the processes by hash, unevenly, and a process that got more waits
# on its own core while the other idles. With more processes than cores the scheduler
# evens out the load; two per core measured best (docs/architecture.md).
WORKERS_PER_CORE = 2
# ... up to this many. Each reader holds its own interpreter, loop and buffers, so on a
# GPU node of many cores two per core would cost gigabytes, and cores the training job
# preprocesses on; past the point where the NIC or the disk is the limit, more readers
# only add memory. The figures behind it: docs/architecture.md.
MAX_AUTO_WORKERS = 8
# ``--workers``' value for "auto" until :func:`parse_args` turns it into a count.
AUTO_WORKERS = 0


def _count(text: str) -> int:
    """argparse ``type=`` for a number of chunks, where a negative one means none."""
    return max(0, int(text))


# argparse names a ``type=`` in its error for a value that does not parse: as before, "int".
_count.__name__ = "int"


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


def _age(text: str) -> float:
    """argparse ``type=`` for ``--max-age``: ``0`` (never), seconds, or ``30m``/``12h``/``7d``."""
    if text.strip() == "0":
        return 0.0
    try:
        return float(parse_ttl(text))
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers(text: str) -> int:
    """argparse ``type=`` for ``--workers``: a positive count, or ``auto``
    (:data:`AUTO_WORKERS`, chosen by :func:`choose_workers` once every flag is known)."""
    return parse_worker_count(text, auto=AUTO_WORKERS)


def choose_workers(cpus: int, single: str | None = None) -> tuple[int, str]:
    """``--workers auto``: the processes for ``cpus`` usable CPUs, and why, for the start
    line. ``single`` names a setting that needs one process (TLS), which then wins."""
    if single is not None:
        return 1, f"auto: 1 ({single} needs one process)"
    count = WORKERS_PER_CORE * max(1, cpus)
    if count > MAX_AUTO_WORKERS:
        return MAX_AUTO_WORKERS, (f"auto: {WORKERS_PER_CORE} per CPU for {cpus} CPUs, "
                                  f"capped at {MAX_AUTO_WORKERS}")
    return count, f"auto: {WORKERS_PER_CORE} per CPU for {cpus} CPU{'' if cpus == 1 else 's'}"


@settings
class _Store:
    """The hub it caches, and on which disk, how much, evicting how."""

    hub_url: str = setting("--hub", help="base URL of the hub")
    cache_dir: str = setting("--cache-dir", help="directory of the chunk cache")
    capacity_bytes: int = setting("--capacity", parse=positive(size_arg),
                                  help="hard limit on cached bytes on disk (e.g. 50GiB)")
    policy: str = setting("--policy", default="arc", choices=POLICIES, help="eviction policy")


@settings
class _Cache:
    """Its port, and how it fetches, keeps and drops chunks."""

    port: int = setting("--port", default=8701, parse=int, help="port (0 picks a free one)")
    # An hour: a training run reads each shard once an epoch, and a shorter TTL makes
    # every such read wait a round trip to the hub to revalidate. Versions never mix
    # (chunk fetches carry If-Match, and a changed object found on a miss is answered
    # in its new version), so the TTL only bounds how long an object cached whole keeps
    # its old version after a change at the hub.
    meta_ttl_s: float = setting(
        "--meta-ttl", default="3600", parse=float,
        help="seconds an object's size/etag is trusted before asking the hub again "
             "(lower it for objects rewritten in place)")
    fetch_concurrency: int = setting("--fetch-concurrency", default=16, parse=positive(int),
                                     help="chunk fetches in flight to the hub at once")
    readahead_chunks: int = setting("--readahead", default=4, parse=_count,
                                    help="chunks fetched ahead of a reader within one range")
    # At 60 ms RTT a healthy connect takes ~60 ms and a 4 MiB chunk well under a
    # second; these bounds only trip on a link that is really broken.
    connect_timeout_s: float = setting("--connect-timeout", default=2.0, parse=float,
                                       help="seconds to open a connection to the hub")
    read_timeout_s: float = setting(
        "--read-timeout", default=5.0, parse=float,
        help="seconds without any data from the hub before a fetch attempt fails")
    fetch_attempts: int = setting(
        "--fetch-attempts", default=3, parse=positive(int),
        help="attempts per hub request (exponential backoff with jitter between)")
    fetch_deadline_s: float = setting(
        "--fetch-deadline", default=15.0, parse=float,
        help="seconds after which a hub request is not retried any more")
    breaker_threshold: int = setting(
        "--breaker-threshold", default=5, parse=positive(int),
        help="consecutive hub failures that open the circuit breaker")
    breaker_reset_s: float = setting(
        "--breaker-reset", default=1.0, parse=float,
        help="seconds the breaker stays open before one probe may go through")
    sequential_readahead_chunks: int = setting(
        "--seq-readahead", default=8, parse=_count,
        help="chunks fetched ahead of a reader streaming an object range by range "
             "(0 = off; size it to bandwidth x RTT)")
    plan_window_bytes: int = setting(
        "--plan-window", default="256MiB", parse=positive(size_arg),
        help="bytes fetched ahead of a loader that registered its read plan")
    max_age_s: float = setting(
        "--max-age", default="0", parse=_age,
        help="drop cached chunks stored longer ago than this (30m, 12h, 7d; 0 = never)")
    tenant_quota_bytes: int = setting(
        "--tenant-quota", default="0", parse=size_arg,
        help="bytes one tenant's reads may keep cached (0 = no quota); "
             "a tenant at its quota evicts its own chunks first")
    pinned_prefixes: tuple[str, ...] = setting(
        "--pin", default="", parse=_prefixes,
        help="comma-separated prefixes whose chunks are never evicted (up to --pin-fraction)")
    pin_fraction: float = setting("--pin-fraction", default=0.5, parse=_fraction,
                                  help="most of the capacity pinned prefixes may hold")
    # reuse: a dataset larger than the cache, read epoch after epoch, keeps a fixed part
    # cached instead of cycling all of it through (docs/policies.md has the figures).
    admission: str = setting(
        "--admission", default=DEFAULT_ADMISSION, choices=ADMISSIONS,
        help="which misses --policy takes in: reuse (those read again soon, or in place of "
             "chunks nothing reads any more; the rest pass through a small window) or all")
    verify_on_start: bool = setting(
        "--verify-on-start", default=False, switch=True,
        help="check every cached chunk's digest at start-up and drop bad ones")
    # The background scrub's pace. At 4 MiB chunks, one chunk every 250 ms: a niced
    # thread's read and hash of it are a fraction of a percent of one core, the disk reads
    # are a few percent of an SSD's (pages read once stay on the kernel's inactive list:
    # they do not push the loaders' hot chunks out of the page cache), and a 1 TB cache is
    # checked in full about once a day.
    scrub_rate_bytes_s: int = setting(
        "--scrub-rate", default="16MiB", parse=size_arg,
        help="bytes per second the background scrub re-hashes cached chunks at, "
             "dropping bad ones (e.g. 64MiB; 0 = off)")


@settings
class _HubAccess:
    """How the spoke proves itself to the hub and checks the hub's certificate."""

    hub_token_file: str | None = setting(
        "--hub-token-file", default=None,
        help="file holding the spoke's own bearer token, sent on every hub request")
    hub_ca: str | None = setting(
        "--hub-ca", default=None,
        help="PEM CA bundle to verify an https:// hub with (default: the system CAs)")


def _port(text: str) -> int:
    """argparse ``type=`` for a port number (0: a free one)."""
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return port


_port.__name__ = "port"


@settings
class _S3Front:
    """The S3 API beside /objects (spoke.s3)."""

    s3_port: int | None = setting(
        "--s3-port", default=None, parse=_port,
        help="also serve the S3 API on this port (0 picks a free one; off by default)")
    s3_domain: str | None = setting(
        "--s3-domain", default=None,
        help="serve virtual-hosted buckets: a Host of BUCKET.DOMAIN names BUCKET")
    s3_credentials: str | None = setting(
        "--s3-credentials", default=None,
        help="file of S3 keys, one 'ACCESS_KEY_ID SECRET PREFIX[,PREFIX...]' a line; "
             "then SigV4 is required (without it S3 reads are anonymous)")


@settings
class _Tier:
    """The regional tier it belongs to: its peers, and how it proves itself to them."""

    peers: tuple[PeerSource, ...] = setting(
        "--peers", default="", parse=parse_peers,
        help="the tier's spokes, this one included or not: base URLs separated by commas, or "
             "dns+http://NAME:PORT, a name looked up again every few seconds ('' = no tier)")
    advertise: str | None = setting(
        "--advertise", default=None, parse=parse_advertise,
        help="the base URL peers reach this spoke at (default: http://HOST:PORT it binds)")
    peer_secret_file: str | None = setting(
        "--peer-secret-file", default=None,
        help="file holding the tier's shared secret, sent and checked on peer requests "
             "(default: the spoke's hub token)")
    peer_ca: str | None = setting(
        "--peer-ca", default=None,
        help="PEM CA bundle to verify https:// peers with (default: the hub's CA bundle "
             "if given, else the system CAs)")
    peer_timeout_s: float = setting(
        "--peer-timeout", default=3.0, parse=float,
        help="seconds without data from a peer before its chunk goes to the next owner or "
             "the hub, and the peer counts a failure")
    peer_refresh_s: float = setting(
        "--peer-refresh", default=5.0, parse=float,
        help="seconds between DNS look-ups of a dns+ peers name, and between peer health probes")
    peer_keep_copies: bool = setting(
        "--peer-keep-copies", default=False, switch=True,
        help="also keep a copy of chunks fetched from their owner in this spoke's cache "
             "(off: each chunk is stored once in the tier, which then holds the sum of "
             "its spokes' capacity)")


@settings
class SpokeConfig(_Store, ListenSettings, _Cache, LoggingSettings, AuthSettings, _HubAccess,
                  TlsSettings, LimitSettings, _Tier, _S3Front):
    """``python -m spoke serve``'s settings, its flags in this order."""

    workers: int = setting(
        "--workers", default="auto", parse=_workers,
        help="processes serving the port: the spoke and N-1 reader workers answering "
             f"cache hits from its files (SO_REUSEPORT; plain HTTP). 'auto': "
             f"{WORKERS_PER_CORE} per usable CPU, at most {MAX_AUTO_WORKERS}, 1 with TLS")
    cpu_affinity: str = setting(  # "spread": spoke.workers.cpus
        "--cpu-affinity", default="off", choices=AFFINITIES,
        help="'spread': bind each of the spoke's processes to one CPU of those it may "
             "use, in turn (for --workers; see spoke/workers/cpus.py); 'off': let the kernel "
             "place them")
    # Set only in a reader worker's process, by its owner (spoke.workers.pool).
    reader_channel_fd: int | None = setting(
        "--reader-channel", default=None, parse=int, internal=True,
        help="the socket a reader worker receives its connections on")
    reader_cpu: int | None = setting("--reader-cpu", default=None, parse=int, internal=True,
                                     help="the CPU a reader worker binds itself to")


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spoke", description="hubspoke spoke")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve loaders from a local chunk cache in front of a hub",
        description="Cache a hub's objects chunk by chunk on local disk and serve them.",
    )
    add_settings(serve, SpokeConfig, env)
    verify = commands.add_parser(
        "verify", help="check every cached chunk against its digest; drop bad ones",
        description="Scrub a (stopped) spoke's cache directory.",
    )
    add_settings(verify, SpokeConfig, env, only=["--cache-dir"])
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
    if (args.command == "serve" and args.s3_port is not None and args.auth_secret_file
            and not args.s3_credentials):
        parser.error("--s3-port with --auth-secret-file needs --s3-credentials: anonymous "
                     "S3 reads would bypass the tokens /objects requires")
    if (args.command == "serve" and args.cpu_affinity != "off"
            and not hasattr(os, "sched_setaffinity")):
        parser.error("--cpu-affinity needs an OS that binds threads to CPUs (Linux)")
    if args.command == "serve" and args.peers and not (args.peer_secret_file
                                                       or args.hub_token_file):
        parser.error("--peers needs --peer-secret-file or --hub-token-file: peer requests "
                     "are authenticated")
    if args.command == "serve" and args.peers and args.port == 0 and not args.advertise:
        parser.error("--peers with --port 0 needs --advertise: peers must know the port")
    return args


def with_workers_chosen(config: SpokeConfig) -> tuple[SpokeConfig, str]:
    """``config`` with ``--workers auto`` turned into a count (:func:`choose_workers` for
    this machine), and how the count came, for the start line."""
    if config.workers != AUTO_WORKERS:
        return config, "given"
    count, why = choose_workers(machine_cpus(), "--tls-cert" if config.tls_cert else None)
    return dataclasses.replace(config, workers=count), why


def config_from_args(args: argparse.Namespace) -> SpokeConfig:
    return config_from(SpokeConfig, args)
