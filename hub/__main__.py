"""``python -m hub serve --root DIR|s3://BUCKET[/PREFIX]``: run the hub in the foreground;
``python -m hub token``; ``python -m hub index``."""

from __future__ import annotations

import logging
import signal
import socket
import sys

from hub.app import make_app
from hub.backend import FilesystemBackend
from hub.config import config_from_args, index_config_from_args, parse_args
from hub.roots import RootError, check_index_dir, open_backend
from hub.stats import HubStats, SharedCounts
from hub.token_cli import run_token
from hub.workers import SiblingError, serve_sibling, sibling_stats, siblings
from service.cli import apply_logging_flags, environ
from service.memory import fix_malloc_thresholds
from service.runner import run, serve_forever
from service.tls import server_context_for

logger = logging.getLogger("hub")


def main(argv: list[str] | None = None) -> int:
    fix_malloc_thresholds()
    args = parse_args(sys.argv[1:] if argv is None else argv, environ())
    if args.command == "token":
        return run_token(args)
    if args.command == "index":
        from hub.index_cli import run_index

        index_config = index_config_from_args(args)
        apply_logging_flags(index_config.log_level, index_config.log_format, "off")
        return run_index(index_config, environ())
    config = config_from_args(args)
    apply_logging_flags(config.log_level, config.log_format, config.access_log)
    try:
        backend = open_backend(config.root, config.s3_endpoint, config.s3_timeout, environ())
        check_index_dir(backend, config.index_dir)
    except RootError as exc:
        print(f"hub: {exc}", file=sys.stderr)  # one line, no traceback: the operator's to fix
        return 2
    tls = server_context_for(config.tls_cert, config.tls_key)
    if config.lifeline_fd is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first process stops us
        lifeline = socket.socket(fileno=config.lifeline_fd)
        stats = sibling_stats(lifeline)
        run(lambda: serve_sibling(make_app(config, backend, stats), config.host, config.port,
                                  tls, lifeline))
        return 0
    workers = config.workers
    if workers > 1 and not isinstance(backend, FilesystemBackend):
        logger.info("an s3:// root is served by one process (--workers counts for a directory)")
        workers = 1
    logger.info("serving %s (chunk size %d, %s digests) in %d process%s", config.root,
                config.chunk_size, config.digest_alg, workers, "" if workers == 1 else "es")
    counts = SharedCounts(workers) if workers == 1 else SharedCounts.create(workers)
    companion = (None if workers == 1
                 else siblings(workers - 1, sys.argv[1:] if argv is None else argv, counts))
    try:
        run(lambda: serve_forever(make_app(config, backend, HubStats(counts)), config.host,
                                  config.port, tls, companion=companion))
    except SiblingError as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
