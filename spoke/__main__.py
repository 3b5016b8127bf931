"""``python -m spoke serve|verify``."""

from __future__ import annotations

import json
import logging
import sys

from service.cli import apply_logging_flags, environ
from service.logs import setup_logging
from service.runner import run, serve_forever
from service.tls import server_context_for
from spoke.app import make_app
from spoke.config import config_from_args, parse_args
from spoke.index import ChunkIndex
from spoke.scrub import scrub
from spoke.store import ChunkStore
from spoke.warm_cli import run_warm

logger = logging.getLogger("spoke")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, environ())
    if args.command == "verify":
        setup_logging("info", "text")
        index = ChunkIndex(args.cache_dir)
        try:
            report = scrub(ChunkStore(args.cache_dir), index)
        finally:
            index.close()
        print(json.dumps({"checked": report.checked, "bad": report.bad,
                          "missing": report.missing}))
        return 1 if report.bad else 0
    if args.command == "warm":
        return run_warm(args.spoke, args.paths, args.prefix, args.quiet, args.token_file)
    config = config_from_args(args)
    apply_logging_flags(config.log_level, config.log_format, config.access_log)
    logger.info("caching %s in %s (capacity %d bytes, %s)", config.hub_url, config.cache_dir,
                config.capacity_bytes, config.policy)
    tls = server_context_for(config.tls_cert, config.tls_key)
    run(lambda: serve_forever(make_app(config), config.host, config.port, tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
