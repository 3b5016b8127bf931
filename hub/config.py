"""The hub's configuration: the only place that reads argv and the environment."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from hub.token_cli import add_token_flags
from protocol.digests import DEFAULT_DIGEST_ALG, digest_algorithms
from service.auth import AuthSettings
from service.cli import LoggingSettings, positive, size_arg
from service.limits import LimitSettings
from service.runner import ListenSettings
from service.settings import add_settings, config_from, setting, settings
from service.tls import TlsSettings, parse_checked


@settings
class _Objects:
    """What the hub serves."""

    root: str = setting("--root", help="directory holding the objects")


@settings
class _Serving:
    """Its port, and how it cuts objects into chunks."""

    port: int = setting("--port", default=8700, parse=int, help="port (0 picks a free one)")
    chunk_size: int = setting("--chunk-size", default="4MiB", parse=positive(size_arg),
                              help="chunk size of manifests (bytes or 4MiB-style)")
    digest_alg: str = setting("--digest-alg", default=DEFAULT_DIGEST_ALG,
                              choices=digest_algorithms(), help="per-chunk digest algorithm")


@settings
class HubConfig(_Objects, ListenSettings, _Serving, LoggingSettings, AuthSettings, TlsSettings,
                LimitSettings):
    """``python -m hub serve``'s settings, its flags in this order."""


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
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    return parse_checked(build_parser(env), argv)


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, HubConfig]:
    """``serve``'s configuration (the other commands have none)."""
    args = parse_args(argv, env)
    return args.command, config_from_args(args)


def config_from_args(args: argparse.Namespace) -> HubConfig:
    return config_from(HubConfig, args)
