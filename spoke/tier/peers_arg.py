"""``--peers`` and ``--advertise``: the text of a tier's membership, parsed and checked.

Kept apart from the membership itself so the spoke's argument parser (and the manifests'
test that runs it) needs no event loop or network.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlsplit

DNS_SCHEMES = {"dns+http": "http", "dns+https": "https"}
URL_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class PeerSource:
    """One entry of ``--peers``: a peer's base URL, or a DNS name re-resolved to one peer per
    address (a Kubernetes headless Service returns one per ready pod)."""

    url: str  # a peer's base URL; for a DNS entry, the URL with the name as its host
    dns: bool = False

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


def base_url(text: str) -> str:
    """``text`` as a peer's base URL: http(s), a host, no path, query or fragment."""
    parts = urlsplit(text.strip())
    if parts.scheme not in URL_SCHEMES:
        raise argparse.ArgumentTypeError(f"{text!r}: a peer URL is http:// or https://")
    if not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: a peer URL names a host")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise argparse.ArgumentTypeError(f"{text!r}: a peer URL is only scheme://host:port")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return f"{parts.scheme}://{parts.netloc}"


def parse_peers(text: str) -> tuple[PeerSource, ...]:
    """argparse ``type=`` for ``--peers``: comma-separated ``http(s)://HOST:PORT`` or
    ``dns+http(s)://NAME:PORT`` entries ('' for no tier)."""
    sources: list[PeerSource] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        scheme, sep, rest = entry.partition("://")
        if sep and scheme in DNS_SCHEMES:
            url = base_url(f"{DNS_SCHEMES[scheme]}://{rest}")
            if urlsplit(url).port is None:
                raise argparse.ArgumentTypeError(f"{entry!r}: a dns+ entry names its port")
            sources.append(PeerSource(url, dns=True))
        else:
            sources.append(PeerSource(base_url(entry)))
    if len({s.url for s in sources}) != len(sources):
        raise argparse.ArgumentTypeError(f"{text!r}: a peer is listed twice")
    return tuple(sources)


def parse_advertise(text: str) -> str:
    """argparse ``type=`` for ``--advertise``: the base URL peers reach this spoke at."""
    return base_url(text)
