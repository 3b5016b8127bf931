"""The hub's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hub.token_cli import add_token_flags
from protocol.digests import DEFAULT_DIGEST_ALG, digest_algorithms
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

DEFAULT_CHUNK_SIZE = 4 << 20


@dataclass(frozen=True, slots=True)
class HubConfig:
    root: str
    host: str = "127.0.0.1"
    port: int = 8700
    chunk_size: int = DEFAULT_CHUNK_SIZE
    digest_alg: str = DEFAULT_DIGEST_ALG
    log_level: str = "info"
    log_format: str = "text"
    access_log: str = "on"
    auth_secret_file: str | None = None
    auth_previous_secret_file: str | None = None
    metrics_auth: str = "off"
    tls_cert: str | None = None
    tls_key: str | None = None
    max_inflight_per_client: int = DEFAULT_MAX_INFLIGHT_PER_CLIENT
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hub", description="hubspoke hub")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve a directory of objects over HTTP",
        description="Serve the files under --root as chunked objects.",
    )
    add_flag(serve, "--root", env=env, required=True, help="directory holding the objects")
    add_flag(serve, "--host", env=env, default="127.0.0.1", help="address to bind")
    add_flag(serve, "--port", env=env, default=8700, type=int, help="port (0 picks a free one)")
    add_flag(serve, "--chunk-size", env=env, default="4MiB", type=positive(size_arg),
             help="chunk size of manifests (bytes or 4MiB-style)")
    add_flag(serve, "--digest-alg", env=env, default=DEFAULT_DIGEST_ALG,
             choices=digest_algorithms(), help="per-chunk digest algorithm")
    add_logging_flags(serve, env)
    add_auth_flags(serve, env)
    add_tls_flags(serve, env)
    add_limit_flags(serve, env)
    token = commands.add_parser(
        "token", help="mint a bearer token (printed alone on stdout)",
        description="Sign a token naming a tenant, its path prefixes, scope and expiry.",
    )
    add_token_flags(token, env)
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    return parse_checked(build_parser(env), argv)


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, HubConfig]:
    """``serve``'s configuration (the other commands have none)."""
    args = parse_args(argv, env)
    return args.command, config_from_args(args)


def config_from_args(args: argparse.Namespace) -> HubConfig:
    return HubConfig(
        root=args.root,
        host=args.host,
        port=int(args.port),
        chunk_size=int(args.chunk_size),
        digest_alg=args.digest_alg,
        log_level=args.log_level,
        log_format=args.log_format,
        access_log=args.access_log,
        auth_secret_file=args.auth_secret_file or None,
        auth_previous_secret_file=args.auth_previous_secret_file or None,
        metrics_auth=args.metrics_auth,
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
        max_inflight_per_client=int(args.max_inflight_per_client),
        max_connections_per_client=int(args.max_connections_per_client),
        header_timeout_s=float(args.header_timeout),
        keepalive_timeout_s=float(args.keepalive_timeout),
    )
