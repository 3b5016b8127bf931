"""Route tables: both servers add their routes the same way, with our Expect handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from service.problem import expect_handler

Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


def add_routes(app: web.Application, routes: Sequence[Route]) -> None:
    """Add ``(method, path, handler)`` routes; a GET route answers HEAD too."""
    adders = {"GET": app.router.add_get, "POST": app.router.add_post,
              "DELETE": app.router.add_delete}
    for method, path, handler in routes:
        adders[method](path, handler, expect_handler=expect_handler)
