"""TLS contexts: the servers' (``--tls-cert/--tls-key``) and the spoke's towards the hub.

The client side always verifies the peer's certificate chain and host name (the
stdlib default context); ``--hub-ca`` only replaces the system CAs with a given
bundle, it never turns verification off.
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Sequence

from service.settings import setting, settings

# TLS 1.0 and 1.1 are deprecated by RFC 8996.
MIN_VERSION = ssl.TLSVersion.TLSv1_2


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context presenting ``cert_file`` (chain, PEM) with ``key_file``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MIN_VERSION
    context.load_cert_chain(cert_file, key_file)
    return context


def server_context_for(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The context for ``--tls-cert/--tls-key``, or None (plain HTTP) when neither is set."""
    if not cert_file and not key_file:
        return None
    if not (cert_file and key_file):
        raise ValueError("--tls-cert and --tls-key go together")
    return server_context(cert_file, key_file)


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A verifying client context: chain and host name checked against ``ca_file`` or the
    system CAs."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file or None)
    context.minimum_version = MIN_VERSION
    return context


def parse_checked(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, refusing a ``serve`` given only half a TLS pair."""
    args = parser.parse_args(argv)
    if args.command == "serve":
        check_pair(parser, args)
    return args


def check_pair(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit with a usage error when only one of ``--tls-cert``/``--tls-key`` is given."""
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")


@settings
class TlsSettings:
    """Serving HTTPS instead of HTTP (both servers take these)."""

    tls_cert: str | None = setting(
        "--tls-cert", default=None,
        help="PEM certificate (chain) to serve HTTPS with; needs --tls-key")
    tls_key: str | None = setting("--tls-key", default=None, help="PEM private key of --tls-cert")
