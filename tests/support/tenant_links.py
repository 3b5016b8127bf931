"""A hub root where tenant B's prefix holds symlinks to tenant A's object.

Shared by the tenant-link tests and the live fuzz test: every route a ``b/``- or
``c/``-scoped token could take to A's bytes (a file link, a directory link, chains
of both, an absolute link, a tenant directory that is itself a link).
"""

from __future__ import annotations

import os
from pathlib import Path

# Any window of 31 or more bytes of tenant A's object holds the whole marker.
MARKER = b"TENANT-A-SECRET!"
SECRET = MARKER * ((3 << 16) // len(MARKER))
OWN = b"b's own bytes\n" * 100
LINKS = {  # link -> target ({root}: the hub's root)
    "b/link-to-a.bin": "../a/secret.bin",
    "b/dir-to-a": "../a",
    "b/chain-1.bin": "chain-2.bin",
    "b/chain-2.bin": "../a/secret.bin",
    "b/dir-chain": "dir-to-a",
    "b/abs-to-a.bin": "{root}/a/secret.bin",
    "b/alias.bin": "own.bin",  # inside b/: still not an object, as no link is
    "c": "a",  # a tenant directory that is a link to a sibling tenant's
}
# Names a b/- or c/-scoped token may ask for that lead to A's bytes.
TO_A = ["b/link-to-a.bin", "b/dir-to-a/secret.bin", "b/chain-1.bin", "b/chain-2.bin",
        "b/dir-chain/secret.bin", "b/abs-to-a.bin", "c/secret.bin"]


def plant_tenant_links(root: Path) -> None:
    """Tenant A's secret, tenant B's own object, and B's links to A (see ``LINKS``)."""
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "secret.bin").write_bytes(SECRET)
    (root / "b" / "own.bin").write_bytes(OWN)
    for link, target in LINKS.items():
        (root / link).symlink_to(target.format(root=root))
    for path in TO_A:
        assert (root / path).read_bytes() == SECRET


def leaks(body: bytes) -> bool:
    """Whether ``body`` holds any 31 bytes in a row of tenant A's object."""
    return MARKER in body


def files_holding_a(directory: Path) -> list[str]:
    """The files under ``directory`` (a spoke's cache) holding any of A's bytes."""
    found = []
    for dirpath, _, names in os.walk(directory):
        for name in names:
            if leaks((Path(dirpath) / name).read_bytes()):
                found.append(os.path.join(dirpath, name))
    return found
