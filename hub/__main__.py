"""``python -m hub serve --root DIR``: run the hub in the foreground."""

from __future__ import annotations

import logging
import sys

from hub.app import make_app
from hub.config import parse_config
from service.cli import environ, setup_logging
from service.runner import run, serve_forever

logger = logging.getLogger("hub")


def main(argv: list[str] | None = None) -> int:
    _command, config = parse_config(sys.argv[1:] if argv is None else argv, environ())
    setup_logging(config.log_level)
    logger.info("serving %s (chunk size %d, %s digests)", config.root, config.chunk_size,
                config.digest_alg)
    run(lambda: serve_forever(make_app(config), config.host, config.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
