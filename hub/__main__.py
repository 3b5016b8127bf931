"""``python -m hub serve --root DIR``: run the hub in the foreground."""

from __future__ import annotations

import logging
import sys

from hub.app import make_app
from hub.config import parse_config
from service.cli import apply_logging_flags, environ
from service.runner import run, serve_forever

logger = logging.getLogger("hub")


def main(argv: list[str] | None = None) -> int:
    _command, config = parse_config(sys.argv[1:] if argv is None else argv, environ())
    apply_logging_flags(config.log_level, config.log_format, config.access_log)
    logger.info("serving %s (chunk size %d, %s digests)", config.root, config.chunk_size,
                config.digest_alg)
    run(lambda: serve_forever(make_app(config), config.host, config.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
