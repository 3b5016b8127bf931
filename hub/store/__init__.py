"""Object-store roots: the hub serving an S3-compatible bucket instead of a directory.

``url`` parses ``s3://BUCKET[/PREFIX]``; ``s3`` is the :class:`hub.backend.Backend` over a
bucket (botocore's sync client, called from the hub's executor threads); ``index`` keeps
each version's per-chunk digests in SQLite so a restarted hub does not re-read the
bucket. ``fills`` answers a spoke's chunk fill on the fast path (one store thread, no
aiohttp); ``plain`` sends a fill's presigned GET to a plain-HTTP store on connections
of the hub's own.
"""
