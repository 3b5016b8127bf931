"""Run an aiohttp app in the foreground until SIGINT/SIGTERM.

Prints ``listening on http://HOST:PORT`` (``https://`` when serving TLS) on stderr
once the socket accepts, which is how scripts and tests learn the port chosen for
``--port 0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from protocol.ranges import MAX_RANGE_HEADER_BYTES
from service import limits
from service.settings import setting, settings

logger = logging.getLogger(__name__)

# The soft open files limit when the hard one is unlimited: the kernel's default
# ceiling (fs.nr_open).
MAX_OPEN_FILES = 1 << 20
# Long enough for a 4 MiB chunk to finish on a slow link, short enough that a
# stop does not hang on a stalled client.
SHUTDOWN_TIMEOUT_S = 5.0
# Room for a Range header well past what our parser accepts, so an overlong one
# reaches protocol.ranges and gets a problem+json 400 rather than aiohttp's
# plain-text one; still small enough to bound per-request memory.
MAX_HEADER_FIELD_BYTES = max(32 << 10, 2 * MAX_RANGE_HEADER_BYTES)


async def start_site(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` (HTTPS with ``ssl_context``); returns the runner and the bound
    port. ``reuse_port``: other processes may listen on the same port (SO_REUSEPORT)."""
    runner = limits.make_runner(
        app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        max_field_size=MAX_HEADER_FIELD_BYTES,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context,
                       reuse_port=reuse_port or None)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)


@dataclass(frozen=True, slots=True)
class ExtraSite:
    """Another application served by the same process on a port of its own (the
    spoke's S3 front end), announced as ``{name} listening on URL``."""

    name: str
    app: web.Application
    port: int


@dataclass(frozen=True, slots=True)
class StartedSite:
    """An :class:`ExtraSite` listening: its runner and the port it bound."""

    name: str
    runner: web.AppRunner
    port: int


# Runs alongside a started server: entered once it and its extra sites listen (its
# runner, the bound port, the extra sites), left before they stop. The spoke's reader
# workers live in one.
Companion = Callable[[web.AppRunner, int, Sequence[StartedSite]],
                     AbstractAsyncContextManager[None]]


async def serve_forever(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
    companion: Companion | None = None, extra_sites: Sequence[ExtraSite] = (),
) -> None:
    """Serve until SIGINT/SIGTERM. With a ``companion``, the ports are shared
    (SO_REUSEPORT) and the listening lines wait until the companion has started.
    ``extra_sites`` start after the main one (whose app they may share state with),
    before the companion (which may serve their ports too), and each prints its own
    line after the main ``listening on`` one."""
    shared = companion is not None
    runner, bound = await start_site(app, host, port, ssl_context, reuse_port=shared)
    try:
        async with contextlib.AsyncExitStack() as stack:
            extra = []
            for site in extra_sites:
                extra_runner, extra_port = await start_site(site.app, host, site.port, ssl_context,
                                                            reuse_port=shared)
                stack.push_async_callback(extra_runner.cleanup)
                extra.append(StartedSite(site.name, extra_runner, extra_port))
            if companion is not None:
                await stack.enter_async_context(companion(runner, bound, extra))
            scheme = "https" if ssl_context is not None else "http"
            print(f"listening on {scheme}://{host}:{bound}", file=sys.stderr, flush=True)
            for started in extra:
                print(f"{started.name} listening on {scheme}://{host}:{started.port}",
                      file=sys.stderr, flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            logger.info("stopping")
    finally:
        await runner.cleanup()
    logger.info("stopped")


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard one; returns the soft limit now.

    Every connection is a descriptor, and so is each chunk file a spoke keeps open,
    twice over once it is mapped for batch reads (the map holds a duplicate): at the
    usual soft limit of 1,024, a spoke serving a few hundred loaders would run out.
    The hard limit is the operator's ceiling; going up to it needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else MAX_OPEN_FILES
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            logger.warning("could not raise the open files limit to %d: %s", target, exc)
    return soft


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on uvloop when available (the project's chosen loop), with the open
    files limit raised (:func:`raise_open_file_limit`)."""
    raise_open_file_limit()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(main())
        return
    uvloop.run(main())


@settings
class ListenSettings:
    """The address a server binds (both servers take it; each has its own default port)."""

    host: str = setting("--host", default="127.0.0.1", help="address to bind")
