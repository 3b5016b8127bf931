"""Route tables: both servers add their routes the same way, with our Expect handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from service.problem import expect_handler

Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


def add_routes(app: web.Application, routes: Sequence[Route]) -> None:
    """Add ``(method, path, handler)`` routes; a GET route answers HEAD too.

    Then a catch-all route answers 404, or 405 with ``Allow``, itself: a request no
    route matches would otherwise get aiohttp's default ``Expect`` handler, which
    answers 500 to an ``Expect`` value that is not valid UTF-8.
    """
    adders = {"GET": app.router.add_get, "POST": app.router.add_post,
              "DELETE": app.router.add_delete}
    for method, path, handler in routes:
        adders[method](path, handler, expect_handler=expect_handler)

    async def unmatched(request: web.Request) -> web.StreamResponse:
        methods = [m for m in ("GET", "HEAD", "POST", "DELETE")
                   if await _routed(app, request.clone(method=m), unmatched)]
        if methods:
            raise web.HTTPMethodNotAllowed(request.method, methods)
        raise web.HTTPNotFound()

    app.router.add_route("*", "/{tail:.*}", unmatched, expect_handler=expect_handler)


async def _routed(app: web.Application, request: web.Request, fallback: object) -> bool:
    """Whether one of the real routes (not the catch-all) takes ``request``."""
    match = await app.router.resolve(request)
    return match.http_exception is None and match.handler is not fallback
