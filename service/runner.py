"""Run an aiohttp app in the foreground until SIGINT/SIGTERM.

Prints ``listening on http://HOST:PORT`` (``https://`` when serving TLS) on stderr
once the socket accepts, which is how scripts and tests learn the port chosen for
``--port 0``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from protocol.ranges import MAX_RANGE_HEADER_BYTES
from service import limits

logger = logging.getLogger(__name__)

# Long enough for a 4 MiB chunk to finish on a slow link, short enough that a
# stop does not hang on a stalled client.
SHUTDOWN_TIMEOUT_S = 5.0
# Room for a Range header well past what our parser accepts, so an overlong one
# reaches protocol.ranges and gets a problem+json 400 rather than aiohttp's
# plain-text one; still small enough to bound per-request memory.
MAX_HEADER_FIELD_BYTES = max(32 << 10, 2 * MAX_RANGE_HEADER_BYTES)


async def start_site(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` (HTTPS with ``ssl_context``); returns the runner and the bound port."""
    runner = limits.make_runner(
        app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        max_field_size=MAX_HEADER_FIELD_BYTES,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)


async def serve_forever(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> None:
    runner, bound = await start_site(app, host, port, ssl_context)
    scheme = "https" if ssl_context is not None else "http"
    print(f"listening on {scheme}://{host}:{bound}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("stopping")
    await runner.cleanup()
    logger.info("stopped")


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on uvloop when available (the project's chosen loop)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(main())
        return
    uvloop.run(main())
