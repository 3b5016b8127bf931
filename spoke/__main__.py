"""``python -m spoke serve|verify``."""

from __future__ import annotations

import json
import logging
import sys

from service.cli import apply_logging_flags, environ
from service.logs import setup_logging
from service.memory import fix_malloc_thresholds
from service.runner import ExtraSite, run, serve_forever
from service.tls import server_context_for
from spoke.app import make_app
from spoke.cache.scrub import open_index, scrub
from spoke.cache.store import ChunkStore
from spoke.client.warm_cli import run_warm
from spoke.config import config_from_args, parse_args, with_workers_chosen
from spoke.s3.access import load_keys
from spoke.s3.app import make_s3_app
from spoke.serve import handlers
from spoke.workers import cpus
from spoke.workers.pool import readers_companion
from spoke.workers.worker import run_reader

logger = logging.getLogger("spoke")


def main(argv: list[str] | None = None) -> int:
    fix_malloc_thresholds()
    args = parse_args(sys.argv[1:] if argv is None else argv, environ())
    if args.command == "verify":
        setup_logging("info", "text")
        store = ChunkStore(args.cache_dir)
        index = open_index(store, args.cache_dir)
        try:
            report = scrub(store, index)
        finally:
            index.close()
        print(json.dumps({"checked": report.checked, "bad": report.bad,
                          "missing": report.missing}))
        return 1 if report.bad else 0
    if args.command == "warm":
        return run_warm(args.spoke, args.paths, args.prefix, args.quiet, args.token_file)
    config, workers_chosen = with_workers_chosen(config_from_args(args))
    apply_logging_flags(config.log_level, config.log_format, config.access_log)
    if config.reader_channel_fd is not None:
        if config.reader_cpu is not None:
            cpus.bind_to(config.reader_cpu)  # before the loop starts any thread
        run(lambda: run_reader(config, config.reader_channel_fd or 0))
        return 0
    logger.info("caching %s in %s (capacity %d bytes, %s, admission %s, %d worker%s)",
                config.hub_url, config.cache_dir, config.capacity_bytes, config.policy,
                config.admission, config.workers, "" if config.workers == 1 else "s")
    # What the defaults came to on this machine, for whoever reads the log first.
    logger.info("chosen: %d worker%s (%s), meta-ttl %g s, access log %s", config.workers,
                "" if config.workers == 1 else "s", workers_chosen, config.meta_ttl_s,
                config.access_log)
    placement = (cpus.spread(cpus.allowed_cpus(), config.workers)
                 if config.cpu_affinity == "spread" else None)
    if placement is not None:
        # Before anything starts a thread: the cache's threads share the spoke's CPU.
        cpus.bind_to(placement[0])
        logger.info("bound to CPU %d; reader workers to CPUs %s", placement[0], placement[1:])
    tls = server_context_for(config.tls_cert, config.tls_key)
    app = make_app(config)
    companion = None
    if config.workers > 1:
        companion = readers_companion(
            app, config.workers - 1, sys.argv[1:] if argv is None else argv,
            handlers.CACHE, handlers.READ_LATENCY,
            cpus=None if placement is None else placement[1:],
        )
    # The S3 front end: reader workers serve its port too (spoke.workers.s3).
    extra: list[ExtraSite] = []
    if config.s3_port is not None:
        keys = None
        if config.s3_credentials:
            try:
                keys = load_keys(config.s3_credentials)
            except (OSError, ValueError) as exc:
                print(f"spoke: --s3-credentials: {exc}", file=sys.stderr)
                return 2
        extra.append(ExtraSite("s3", make_s3_app(app, config.s3_domain, keys), config.s3_port))
    run(lambda: serve_forever(app, config.host, config.port, tls, companion, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
