"""Command-line plumbing shared by ``python -m hub`` and ``python -m spoke``.

Every flag also reads ``HUBSPOKE_<FLAG>`` from the environment; the flag wins,
because argparse only falls back to a default when the flag is absent
(:mod:`service.settings`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from protocol.errors import BadSize
from protocol.sizes import parse_size
from service.logs import access_logger, buffer_access_log, setup_logging
from service.settings import setting, settings

N = TypeVar("N", bound=float)


def size_arg(text: str) -> int:
    """argparse ``type=`` for sizes such as ``4MiB``."""
    try:
        return parse_size(str(text))
    except BadSize as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(convert: Callable[[str], N]) -> Callable[[str], N]:
    """Wrap an argparse ``type=`` so zero and negative values are refused."""

    def checked(text: str) -> N:
        value = convert(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return checked


# --access-log: "buffered" (service.access_buffer) costs small reads a fraction of what
# "on", a logging record a request, does (docs/operations.md).
ACCESS_LOG_MODES = ("buffered", "on", "off")


@settings
class LoggingSettings:
    """How a server logs (both servers take these)."""

    log_level: str = setting("--log-level", default="info",
                             choices=("debug", "info", "warning", "error"), help="log verbosity")
    log_format: str = setting("--log-format", default="text", choices=("text", "json"),
                              help="log lines as text or as JSON objects")
    access_log: str = setting(
        "--access-log", default="buffered", choices=ACCESS_LOG_MODES,
        help="one log line per request (with its X-Request-Id): 'buffered' writes them "
             "in batches, a fraction of a second late; 'on' one by one, through Python's "
             "logging; 'off' none")


def apply_logging_flags(level: str, fmt: str, access_log: str) -> None:
    setup_logging(level, fmt)
    if access_log == "off":
        access_logger.setLevel(logging.WARNING)
    elif access_log == "buffered":
        buffer_access_log(fmt)


def environ() -> Mapping[str, str]:
    return os.environ
