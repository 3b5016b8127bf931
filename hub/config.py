"""The hub's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from hub.token_cli import add_token_flags
from protocol.digests import DEFAULT_DIGEST_ALG, digest_algorithms
from service.auth import AuthSettings
from service.cli import LoggingSettings, positive, size_arg
from service.limits import LimitSettings
from service.runner import ListenSettings
from service.settings import add_settings, config_from, setting, settings
from service.tls import TlsSettings, parse_checked
from service.workers import worker_count

# ``--workers auto``: one process per usable core, as nginx's ``worker_processes auto``;
# two per core measured worse. The default is one process: side by side with nginx on
# shared cores, one hub process served small reads faster than two (it never filled
# its core there; more processes only split the wakeups). More pay on a hub host whose
# one process is busy all the time (docs/performance.md, *The hub's own reads*).
WORKERS_PER_CORE = 1
LIFELINE_FLAG = "--lifeline"


@settings
class _Objects:
    """What the hub serves."""

    root: str = setting("--root", help="directory holding the objects, or s3://BUCKET[/PREFIX]")


@settings
class StoreSettings:
    """How the hub reaches an object store (an s3:// root); the rest is the AWS environment."""

    s3_endpoint: str | None = setting(
        "--s3-endpoint", default=None,
        help="S3 endpoint URL, http:// allowed (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, "
             "else AWS's own)",
    )
    s3_timeout: float = setting("--s3-timeout", default=30.0, parse=positive(float),
                                help="seconds to connect to, or wait on a read from, the store")
    index_dir: str = setting(
        "--index-dir", default="~/.cache/hubspoke/hub", parse=os.path.expanduser,
        help="where an s3:// root's per-chunk digests are kept across restarts",
    )


@settings
class _Chunking:
    """How the hub cuts objects into chunks."""

    chunk_size: int = setting("--chunk-size", default="4MiB", parse=positive(size_arg),
                              help="chunk size of manifests (bytes or 4MiB-style)")
    digest_alg: str = setting("--digest-alg", default=DEFAULT_DIGEST_ALG,
                              choices=digest_algorithms(), help="per-chunk digest algorithm")


@settings
class _Serving(_Chunking):
    """Its port, and how it cuts objects into chunks."""

    port: int = setting("--port", default=8700, parse=int, help="port (0 picks a free one)")


@settings
class _Processes:
    """How many processes serve the port (hub.workers)."""

    workers: int = setting(
        "--workers", default="1", parse=worker_count(WORKERS_PER_CORE),
        help="processes serving the port, peers (SO_REUSEPORT; 'auto': one per core; for a "
             "directory root: an s3:// root is served by one)")
    # Set only in a sibling's process, by the first one (hub.workers).
    lifeline_fd: int | None = setting(
        LIFELINE_FLAG, default=None, parse=int, internal=True,
        help="the socket a sibling tells it listens on, and learns the first process is gone by")


@settings
class HubConfig(_Objects, ListenSettings, _Serving, _Processes, LoggingSettings, AuthSettings,
                TlsSettings, LimitSettings, StoreSettings):
    """``python -m hub serve``'s settings, its flags in this order."""


@settings
class _IndexScope:
    prefix: str = setting("--prefix", default="", help="only the objects under this prefix")


@settings
class IndexConfig(_Objects, _IndexScope, _Chunking, StoreSettings, LoggingSettings):
    """``python -m hub index``'s settings: the digests a ``serve`` of the same root,
    chunk size and algorithm will find."""


DEFAULT_CHUNK_SIZE = HubConfig.chunk_size


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hub", description="hubspoke hub")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve a directory of objects over HTTP",
        description="Serve the files under --root as chunked objects.",
    )
    add_settings(serve, HubConfig, env)
    token = commands.add_parser(
        "token", help="mint a bearer token (printed alone on stdout)",
        description="Sign a token naming a tenant, its path prefixes, scope and expiry.",
    )
    add_token_flags(token, env)
    index = commands.add_parser(
        "index", help="precompute the per-chunk digests of an s3:// root's objects",
        description="Hash every object under --root and --prefix once, into --index-dir, "
                    "so a hub serving that root answers manifests without reading them. "
                    "Resumable: objects already indexed are skipped.",
    )
    add_settings(index, IndexConfig, env)
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    return parse_checked(build_parser(env), argv)


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, HubConfig]:
    """``serve``'s configuration (the other commands have none)."""
    args = parse_args(argv, env)
    return args.command, config_from_args(args)


def config_from_args(args: argparse.Namespace) -> HubConfig:
    return config_from(HubConfig, args)


def index_config_from_args(args: argparse.Namespace) -> IndexConfig:
    return config_from(IndexConfig, args)

