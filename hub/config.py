"""The hub's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.digests import DEFAULT_DIGEST_ALG, digest_algorithms
from service.cli import add_flag, add_logging_flags, positive, size_arg

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
    return parser


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, HubConfig]:
    args = build_parser(env).parse_args(argv)
    return args.command, HubConfig(
        root=args.root,
        host=args.host,
        port=int(args.port),
        chunk_size=int(args.chunk_size),
        digest_alg=args.digest_alg,
        log_level=args.log_level,
        log_format=args.log_format,
        access_log=args.access_log,
    )
