"""aiohttp's own (pure-Python) HTTP/1 parsers, as the reference our readers are checked
against: the first message one of them makes of a head, or None if it refuses it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp.http_parser import HttpParser, RawRequestMessage, RawResponseMessage

M = TypeVar("M", RawRequestMessage, RawResponseMessage)


class _Protocol:
    def set_response_params(self, *a: object, **k: object) -> None: ...


def first_message(
    make: Callable[[Any, asyncio.AbstractEventLoop], HttpParser[M]], head: bytes
) -> M | None:
    """What the parser ``make(protocol, loop)`` builds reads in ``head`` (a head
    without its blank line, which this adds)."""
    loop = asyncio.new_event_loop()
    try:
        parser = make(_Protocol(), loop)
        try:
            messages, _, _ = parser.feed_data(head + b"\r\n\r\n")
        except Exception:
            return None
    finally:
        loop.close()
    return messages[0][0] if messages else None
