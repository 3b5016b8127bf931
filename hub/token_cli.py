"""``python -m hub token``: mint a bearer token and print it alone on stdout.

    python -m hub token --secret-file F --tenant T --prefix P [--prefix P2 ...] [--admin] [--ttl 1h]

Only the token goes to stdout (so ``TOKEN=$(python -m hub token ...)`` works); what it
grants and until when goes to stderr, without the token.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TextIO

from protocol.auth import BadTtl, parse_ttl
from protocol.auth import issue as issue_token
from protocol.errors import ProtocolError
from service.auth import load_secret
from service.settings import add_flag

DEFAULT_TTL = "1h"


def ttl_arg(text: str) -> int:
    """argparse ``type=`` for ``30s``, ``15m``, ``1h``, ``7d``."""
    try:
        return parse_ttl(text)
    except BadTtl as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_token_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    add_flag(parser, "--secret-file", env=env, required=True,
             help="file holding the HMAC secret the servers' --auth-secret-file names")
    parser.add_argument("--tenant", required=True, help="tenant the token acts for")
    parser.add_argument("--prefix", action="append", dest="prefixes", required=True,
                        metavar="PREFIX",
                        help="path prefix the token may read, on whole segments "
                             "('' for every path; repeatable)")
    parser.add_argument("--admin", action="store_true",
                        help="admin scope: warm, purge, /stats")
    add_flag(parser, "--ttl", env=env, default=DEFAULT_TTL, type=ttl_arg,
             help="lifetime, with an s, m, h or d suffix")


def run_token(
    args: argparse.Namespace, now: float | None = None, out: TextIO | None = None
) -> int:
    """Print the token ``args`` describe on ``out`` (stdout); 0 on success, 2 on a bad argument."""
    now = time.time() if now is None else now
    try:
        secret = load_secret(args.secret_file)
        token = issue_token(secret, args.tenant, args.prefixes, admin=args.admin,
                            ttl_s=int(args.ttl), now=now)
    except OSError as exc:
        print(f"cannot read the secret file {args.secret_file}: {exc.strerror}", file=sys.stderr)
        return 2
    except ProtocolError as exc:
        print(f"cannot mint a token: {exc}", file=sys.stderr)
        return 2
    expires = datetime.fromtimestamp(int(now) + int(args.ttl), UTC).isoformat(timespec="seconds")
    print(f"token for tenant {args.tenant}, prefixes {args.prefixes}, "
          f"admin {'yes' if args.admin else 'no'}, expires {expires}", file=sys.stderr)
    print(token, file=out or sys.stdout)
    return 0
