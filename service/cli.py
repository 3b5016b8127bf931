"""Command-line plumbing shared by ``python -m hub`` and ``python -m spoke``.

Every flag also reads ``HUBSPOKE_<FLAG>`` from the environment; the flag wins,
because argparse only falls back to a default when the flag is absent.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from protocol.errors import BadSize
from protocol.sizes import parse_size
from service.logs import access_logger, setup_logging


def env_name(flag: str) -> str:
    """``--cache-dir`` → ``HUBSPOKE_CACHE_DIR``."""
    return "HUBSPOKE_" + flag.lstrip("-").replace("-", "_").upper()


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    env: Mapping[str, str],
    default: Any = None,
    required: bool = False,
    help: str,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from its environment variable when set."""
    name = env_name(flag)
    from_env = env.get(name)
    value = from_env if from_env is not None else default
    needed = required and value is None
    suffix = f" [env {name}]" + (f" (default: {default})" if default is not None else "")
    parser.add_argument(flag, default=value, required=needed, help=help + suffix, **kwargs)


def size_arg(text: str) -> int:
    """argparse ``type=`` for sizes such as ``4MiB``."""
    try:
        return parse_size(str(text))
    except BadSize as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap an argparse ``type=`` so zero and negative values are refused."""

    def checked(text: str) -> Any:
        value = convert(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return checked


def add_logging_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_flag(parser, "--log-level", env=env, default="info",
             choices=["debug", "info", "warning", "error"], help="log verbosity")
    add_flag(parser, "--log-format", env=env, default="text", choices=["text", "json"],
             help="log lines as text or as JSON objects")
    add_flag(parser, "--access-log", env=env, default="on", choices=["on", "off"],
             help="one log line per request (with its X-Request-Id)")


def apply_logging_flags(level: str, fmt: str, access_log: str) -> None:
    setup_logging(level, fmt)
    if access_log == "off":
        access_logger.setLevel(logging.WARNING)


def environ() -> Mapping[str, str]:
    return os.environ
