"""Eviction policies: ordering hooks over one contract, sized in bytes, standard library only.

The contract is :class:`~spoke.policy.base.EvictionPolicy`; each policy is a module of its
own (``lru``, ``arc``, ``s3fifo``, ``tinylfu``); ``admission`` gates what any of them admits
(``--admission reuse``, the spoke's default) and ``plan_aware`` wraps whichever one the spoke
runs. This module is the registry: the names ``--policy`` and ``--admission`` accept and the
factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spoke.policy.admission import ReuseAdmission
from spoke.policy.arc import ARCPolicy
from spoke.policy.base import EvictionPolicy
from spoke.policy.lru import LRUPolicy
from spoke.policy.plan_aware import PlanAwarePolicy
from spoke.policy.s3fifo import S3FIFOPolicy
from spoke.policy.tinylfu import WTinyLFUPolicy

__all__ = [
    "ADMISSIONS",
    "DEFAULT_ADMISSION",
    "POLICY_NAMES",
    "ARCPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "PlanAwarePolicy",
    "ReuseAdmission",
    "S3FIFOPolicy",
    "WTinyLFUPolicy",
    "gate_of",
    "make_policy",
]

_FACTORIES: dict[str, Callable[[int], EvictionPolicy[Any]]] = {
    "arc": ARCPolicy,
    "lru": LRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "wtinylfu": WTinyLFUPolicy,
}

POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)

# "reuse": misses that do not come back soon wait in a small window instead of pushing out
# residents, and residents no job reads any more give way (ReuseAdmission; W-TinyLFU, which
# filters its own admissions, gets only the latter); "all": the textbook policies.
ADMISSIONS: tuple[str, ...] = ("reuse", "all")
DEFAULT_ADMISSION = "reuse"  # what --admission defaults to


def make_policy(name: str, capacity_bytes: int, admission: str = "all") -> EvictionPolicy[Any]:
    """A new, empty policy called ``name`` (one of POLICY_NAMES) for ``capacity_bytes``,
    admitting as ``admission`` says (one of ADMISSIONS; the bare policy by default)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(POLICY_NAMES)
        raise ValueError(f"unknown eviction policy {name!r}; choose one of {known}")
    if admission not in ADMISSIONS:
        raise ValueError(f"unknown admission {admission!r}; choose one of "
                         f"{', '.join(ADMISSIONS)}")
    policy = factory(capacity_bytes)
    return ReuseAdmission(policy) if admission == "reuse" else policy


def gate_of(policy: EvictionPolicy[Any]) -> ReuseAdmission[Any] | None:
    """The reuse gate in ``policy`` (as made by make_policy, plan-aware or not), if any."""
    base = policy.base if isinstance(policy, PlanAwarePolicy) else policy
    return base if isinstance(base, ReuseAdmission) else None
