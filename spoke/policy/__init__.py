"""Eviction policies: ordering hooks over one contract, sized in bytes, standard library only.

The contract is :class:`~spoke.policy.base.EvictionPolicy`; each policy is a module of its
own (``lru``, ``arc``, ``s3fifo``, ``tinylfu``), and ``plan_aware`` wraps whichever one the
spoke runs. This module is the registry: the names ``--policy`` accepts and the factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spoke.policy.arc import ARCPolicy
from spoke.policy.base import EvictionPolicy
from spoke.policy.lru import LRUPolicy
from spoke.policy.plan_aware import PlanAwarePolicy
from spoke.policy.s3fifo import S3FIFOPolicy
from spoke.policy.tinylfu import WTinyLFUPolicy

__all__ = [
    "POLICY_NAMES",
    "ARCPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "PlanAwarePolicy",
    "S3FIFOPolicy",
    "WTinyLFUPolicy",
    "make_policy",
]

_FACTORIES: dict[str, Callable[[int], EvictionPolicy[Any]]] = {
    "arc": ARCPolicy,
    "lru": LRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "wtinylfu": WTinyLFUPolicy,
}

POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_policy(name: str, capacity_bytes: int) -> EvictionPolicy[Any]:
    """A new, empty policy called ``name`` (one of POLICY_NAMES) for ``capacity_bytes``."""
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(POLICY_NAMES)
        raise ValueError(f"unknown eviction policy {name!r}; choose one of {known}")
    return factory(capacity_bytes)
