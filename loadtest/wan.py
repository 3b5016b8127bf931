"""How tests, the demo and the load test get a WAN: a Toxiproxy and a ``hub`` proxy.

``start_toxiproxy()`` yields the base URL of a Toxiproxy HTTP API, from (in order):

1. ``$TOXIPROXY_URL`` if set (an already running server; nothing is started);
2. a ``toxiproxy-server`` binary on ``PATH``, started on a free loopback port;
3. our stand-in, ``python -m loadtest.toxiproxy_standin --port 0``.

Whatever it starts it stops by PID at exit (SIGTERM, wait, SIGKILL).

The rest drives that server through the ``toxiproxy-python`` client, so the same
code path works against the real server and the stand-in::

    with start_toxiproxy() as api_url:
        wan = create_hub_proxy(api_url, ("127.0.0.1", hub_port))
        add_latency(wan.proxy, rtt_ms=60)
        # point the spoke at wan.host:wan.port

or, for a URL, ``with wan_link(api_url, hub_url, latency_ms=60) as hub_via_wan: ...``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import NotFound

from loadtest.toxiproxy_standin import run_in_subprocess, split_hostport
from loadtest.toxiproxy_standin.runner import stop_process

logger = logging.getLogger(__name__)

TOXIPROXY_URL_ENV = "TOXIPROXY_URL"
TOXIPROXY_BINARY = "toxiproxy-server"
HUB_PROXY_NAME = "hub"


class WanProxy(NamedTuple):
    """A Toxiproxy proxy (a ``toxiproxy.Proxy``) and the address clients dial."""

    proxy: Any
    host: str
    port: int

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# --------------------------------------------------------------------------- the server


@contextlib.contextmanager
def start_toxiproxy(*, startup_timeout: float = 15.0) -> Iterator[str]:
    """Yield a Toxiproxy API base URL (``http://127.0.0.1:PORT``); see the module doc."""
    env_url = os.environ.get(TOXIPROXY_URL_ENV, "").strip()
    if env_url:
        logger.info("using Toxiproxy at %s (from $%s)", env_url, TOXIPROXY_URL_ENV)
        yield _normalise_url(env_url)
        return
    binary = shutil.which(TOXIPROXY_BINARY)
    if binary is not None:
        with _run_binary(binary, startup_timeout) as url:
            yield url
        return
    with run_in_subprocess("127.0.0.1", 0, startup_timeout=startup_timeout) as url:
        logger.info("started the Toxiproxy stand-in at %s", url)
        yield url


def _normalise_url(url: str) -> str:
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")


def _free_port() -> int:
    # The real binary cannot report a port it picked, so pick one for it. Another
    # process could take it in between; on loopback in a test run that is rare.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _run_binary(binary: str, startup_timeout: float) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [binary, "-host", "127.0.0.1", "-port", str(port)]
    # Its logs are not needed, and an unread pipe would eventually block it.
    with subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as proc:
        try:
            _wait_for_api(url, proc, startup_timeout)
            logger.info("started %s (pid %s) at %s", binary, proc.pid, url)
            yield url
        finally:
            stop_process(proc)


def _wait_for_api(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{TOXIPROXY_BINARY} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/version", timeout=1) as reply:
                reply.read()
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"{TOXIPROXY_BINARY} did not answer on {url} within {timeout} s")


# --------------------------------------------------------------------------- the client


def toxiproxy_client(api_url: str) -> Any:
    """A ``toxiproxy.Toxiproxy`` talking to ``api_url``.

    The client keeps host/port as class attributes of its APIConsumer, so this
    re-points every client in the process; fine for one server per process.
    """
    parts = urlsplit(_normalise_url(api_url))
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"Toxiproxy URL needs a host and a port: {api_url!r}")
    client = Toxiproxy()
    client.update_api_consumer(parts.hostname, parts.port)
    return client


def create_hub_proxy(
    api_url: str,
    upstream: str | tuple[str, int],
    *,
    name: str = HUB_PROXY_NAME,
    listen: str = "127.0.0.1:0",
) -> WanProxy:
    """(Re)create proxy ``name`` in front of ``upstream``; return it and its listen address.

    An existing proxy of that name (say, left over on a shared server) is
    destroyed first, so the new one starts with no toxics.
    """
    if isinstance(upstream, tuple):
        host, port = upstream
        upstream = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    client = toxiproxy_client(api_url)
    existing = client.get_proxy(name)
    if existing is not None:
        existing.destroy()
    proxy = client.create(upstream=upstream, name=name, listen=listen)
    host, port = split_hostport(proxy.listen)
    return WanProxy(proxy, host or "127.0.0.1", port)


def add_latency(
    proxy: Any,
    rtt_ms: int,
    *,
    jitter_ms: int = 0,
    split: Literal["downstream", "symmetric"] = "downstream",
    name: str = "wan_latency",
) -> list[str]:
    """Add ``rtt_ms`` of round-trip latency to ``proxy``; return the toxic names.

    ``split="downstream"`` (default, as the issue describes the WAN): one latency
    toxic of ``rtt_ms`` on the server→client stream. A request/response exchange
    then takes ``rtt_ms`` longer; the request itself reaches the hub undelayed.
    ``split="symmetric"``: ``rtt_ms // 2`` upstream plus the rest downstream, so each
    direction has half the delay, as on a real link; round trips cost the same.
    Latency toxics act per chunk as a delay line, so streamed data is shifted by
    the delay but not slowed down, and jitter never reorders bytes.
    """
    if split == "downstream":
        parts = [("downstream", rtt_ms)]
    else:
        parts = [("upstream", rtt_ms // 2), ("downstream", rtt_ms - rtt_ms // 2)]
    names = []
    for stream, latency in parts:
        toxic_name = f"{name}_{stream}"
        proxy.add_toxic(
            name=toxic_name,
            type="latency",
            stream=stream,
            attributes={"latency": latency, "jitter": jitter_ms},
        )
        names.append(toxic_name)
    return names


def add_bandwidth(
    proxy: Any,
    rate_kb_s: int,
    *,
    stream: Literal["upstream", "downstream"] = "downstream",
    name: str = "wan_bandwidth",
) -> str:
    """Limit ``stream`` of ``proxy`` to ``rate_kb_s`` KB/s (1 KB = 1000 bytes, per connection)."""
    proxy.add_toxic(name=name, type="bandwidth", stream=stream, attributes={"rate": rate_kb_s})
    return name


@contextlib.contextmanager
def wan_link(
    api_url: str,
    upstream_url: str,
    *,
    latency_ms: int = 60,
    jitter_ms: int = 0,
    split: Literal["downstream", "symmetric"] = "downstream",
    name: str = HUB_PROXY_NAME,
) -> Iterator[str]:
    """Put a WAN in front of ``upstream_url``; yield the URL to use instead of it.

    Creates proxy ``name`` (see :func:`create_hub_proxy`) with ``latency_ms`` of
    round-trip latency (see :func:`add_latency`; 0 = none), yields ``upstream_url``
    with its host:port replaced by the proxy's, and destroys the proxy at exit.
    """
    parts = urlsplit(upstream_url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"upstream URL needs a host and a port: {upstream_url!r}")
    wan = create_hub_proxy(api_url, (parts.hostname, parts.port), name=name)
    try:
        if latency_ms > 0:
            add_latency(wan.proxy, latency_ms, jitter_ms=jitter_ms, split=split)
        yield urlunsplit(parts._replace(netloc=wan.listen))
    finally:
        # The server may already be gone (e.g. stopped first); nothing left to undo then.
        with contextlib.suppress(NotFound, requests.RequestException):
            wan.proxy.destroy()
