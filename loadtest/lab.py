"""The lab every load tool runs in: a hub, WAN links (Toxiproxy) and spokes on 127.0.0.1.

    with Lab(log_dir=logs) as lab:
        hub = lab.hub(root, "--chunk-size", "4MiB")
        link = lab.link(hub.url, latency_ms=60)
        spoke = lab.spoke(link.url, cache_dir, "--capacity", str(capacity))

Toxiproxy (real or the project's stand-in, see :func:`loadtest.wan.start_toxiproxy`)
is started by the first :meth:`Lab.link`. On exit, error or not, everything is undone
in the reverse order it was made: spokes and the hub stopped by PID, proxies destroyed,
Toxiproxy stopped, temp directories removed. A tool that restarts a server calls
:meth:`Lab.stop` on it and starts another; stopping twice is harmless.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import requests
from toxiproxy.exceptions import NotFound

from loadtest.procs import Process, start_process
from loadtest.wan import (
    HUB_PROXY_NAME,
    add_bandwidth,
    add_latency,
    create_hub_proxy,
    start_toxiproxy,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Link:
    """A WAN in front of an upstream: the URL to dial instead, and its Toxiproxy proxy."""

    url: str
    proxy: Any  # a toxiproxy.Proxy: the soak's faults toggle it
    host: str  # where the proxy listens
    port: int


class Lab:
    """Servers and links started for one run, all undone on exit (see the module doc)."""

    def __init__(self, log_dir: str | None = None) -> None:
        self.log_dir = log_dir
        self.processes: list[Process] = []
        self._stack = ExitStack()
        self._api: str | None = None

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.close()

    @property
    def pids(self) -> list[int]:
        """PIDs of the servers still running."""
        return [p.pid for p in self.processes if p.proc.poll() is None]

    def hub(self, root: str, *flags: str) -> Process:
        """``python -m hub serve --root ROOT FLAGS``; stopped at exit."""
        return self.start("hub", "--root", root, *flags)

    def spoke(self, hub_url: str, cache_dir: str, *flags: str) -> Process:
        """``python -m spoke serve --hub HUB_URL --cache-dir CACHE_DIR FLAGS``; stopped at exit."""
        return self.start("spoke", "--hub", hub_url, "--cache-dir", cache_dir, *flags)

    def start(self, module: str, *args: str) -> Process:
        process = start_process(module, args, log_dir=self.log_dir)
        self.processes.append(process)
        self._stack.callback(self.stop, process)
        return process

    def stop(self, process: Process) -> None:
        """Stop ``process`` now (by PID) and forget it."""
        process.stop()
        with contextlib.suppress(ValueError):
            self.processes.remove(process)

    def link(self, upstream_url: str, *, latency_ms: int = 60, bandwidth_kb_s: int = 0,
             name: str = HUB_PROXY_NAME) -> Link:
        """Proxy ``name`` in front of ``upstream_url`` with ``latency_ms`` of round trip.

        ``bandwidth_kb_s`` (0 = unlimited) caps the downstream per connection. The
        proxy is destroyed at exit (on a shared ``$TOXIPROXY_URL`` it would outlive us).
        """
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL needs a host and a port: {upstream_url!r}")
        if self._api is None:
            self._api = self._stack.enter_context(start_toxiproxy())
        wan = create_hub_proxy(self._api, (parts.hostname, parts.port), name=name)
        self._stack.callback(_destroy_quietly, wan.proxy)
        if latency_ms > 0:
            add_latency(wan.proxy, latency_ms)
        if bandwidth_kb_s > 0:
            add_bandwidth(wan.proxy, bandwidth_kb_s)
        return Link(urlunsplit(parts._replace(netloc=wan.listen)), wan.proxy, wan.host, wan.port)

    def temp_dir(self, prefix: str) -> str:
        """A new temp directory, removed at exit."""
        path = tempfile.mkdtemp(prefix=prefix)
        self._stack.callback(shutil.rmtree, path, ignore_errors=True)
        return path

    def callback(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` at exit, in order with the rest."""
        self._stack.callback(fn, *args)

    def enter(self, cm: contextlib.AbstractContextManager[T]) -> T:
        """Enter ``cm`` now and exit it at exit, in order with the rest."""
        return self._stack.enter_context(cm)


def _destroy_quietly(proxy: Any) -> None:
    # The server may already be gone (stopped first, or a shared one restarted).
    with contextlib.suppress(NotFound, requests.RequestException):
        proxy.destroy()
