"""The Toxiproxy stand-in's old address, kept for the commands and imports that use it.

``python -m loadtest.toxiproxy_server`` runs the stand-in as ``python -m
loadtest.toxiproxy_standin`` does; the code lives in that package.
"""

from __future__ import annotations

import sys

from loadtest.toxiproxy_standin import (
    ToxiproxyServer,
    main,
    run_in_subprocess,
    serve,
    split_hostport,
)

__all__ = ["ToxiproxyServer", "main", "run_in_subprocess", "serve", "split_hostport"]

if __name__ == "__main__":
    sys.exit(main())
