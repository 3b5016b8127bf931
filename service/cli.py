"""Command-line plumbing shared by ``python -m hub`` and ``python -m spoke``.

Every flag also reads ``HUBSPOKE_<FLAG>`` from the environment; the flag wins,
because argparse only falls back to a default when the flag is absent.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from protocol.errors import BadSize
from protocol.sizes import parse_size


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


def setup_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def environ() -> Mapping[str, str]:
    return os.environ
