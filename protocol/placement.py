"""Where a chunk lives in a tier of spokes: weighted rendezvous (HRW) hashing.

Each member scores every chunk key with a hash of (member, key); the highest score owns
the chunk, the next ones are where it goes while the owner is down. Every spoke that
knows the same members and weights ranks a key the same way, with no coordination, and
a member joining or leaving moves only the keys it wins or held: about 1/(N+1) of them
going from N to N+1 equal members (Thaler and Ravishankar, "Using name-based mappings to
increase hit rates", 1998; weighted as in Schindelhauer and Schomaker's logarithmic
method, which NVIDIA AIStore and Ceph's straw2 also use).

Weights are relative capacities: a member of twice the weight owns about twice the keys.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence

_SCALE = float(1 << 64)


def chunk_key(path: str, version: str, index: int) -> bytes:
    """The bytes a chunk is placed by: its object's path, its version (the ETag) and its
    index, unambiguous for any path (NUL never occurs in one)."""
    return f"{path}\0{version}\0{index}".encode()


def score(member: str, weight: float, key: bytes) -> float:
    """``member``'s claim on ``key``: -weight / ln(u) for u uniform in (0, 1) drawn from a
    hash of both, so that the highest of the members' scores falls on each member with a
    probability proportional to its weight."""
    digest = hashlib.blake2b(member.encode() + b"\0" + key, digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / _SCALE
    return -weight / math.log(u)


def rank(members: Mapping[str, float], key: bytes) -> list[str]:
    """``members`` (name → weight; a weight of 0 or less owns nothing) best first for
    ``key``: the owner, then where the key goes if the owner is gone, and so on."""
    scored = [(score(m, w, key), m) for m, w in members.items() if w > 0]
    scored.sort(reverse=True)
    return [m for _, m in scored]


def owner(members: Mapping[str, float], key: bytes) -> str | None:
    """The member that owns ``key`` (None when there is none of positive weight)."""
    best: tuple[float, str] | None = None
    for m, w in members.items():
        if w > 0:
            s = (score(m, w, key), m)
            if best is None or s > best:
                best = s
    return None if best is None else best[1]


def shares(members: Mapping[str, float], keys: Iterable[bytes]) -> dict[str, float]:
    """The fraction of ``keys`` each member owns."""
    counts = dict.fromkeys(members, 0)
    total = 0
    for key in keys:
        total += 1
        won = owner(members, key)
        if won is not None:
            counts[won] += 1
    return {m: (c / total if total else 0.0) for m, c in counts.items()}


def sample_keys(count: int, prefix: str = "sample") -> Sequence[bytes]:
    """``count`` distinct synthetic chunk keys, for estimating shares."""
    return [chunk_key(f"{prefix}/{i // 64}", "v", i % 64) for i in range(count)]
