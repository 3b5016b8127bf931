"""Space: the cache's bytes against its capacity, the tenants' quota and the pinned share.

Pure and synchronous (no disk, no event loop, no clock), so that its rule holds by
construction and a property test can check it: bytes on disk never exceed the
capacity. A fill reserves its size before its file is written, evicting as needed
(the victims' files are deleted first, by the caller); what is on disk plus what is
reserved never passes the capacity, and a fill that finds no room is served uncached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from spoke.cache.resident import Resident, ResidentSet
from spoke.policy.base import EvictionPolicy


class SpaceCounts(Protocol):
    """The counters :class:`Space` bumps (:class:`spoke.cache.counters.SpokeStats` has them)."""

    evictions: int
    quota_evictions: int


class _Sized(Protocol):
    @property
    def size(self) -> int: ...


R = TypeVar("R", bound=_Sized)


def _nothing(name: str) -> None:
    return None


class Space:
    def __init__(
        self,
        policy: EvictionPolicy[Any],
        capacity_bytes: int,
        counts: SpaceCounts,
        *,
        tenant_quota_bytes: int = 0,
        pinned_prefixes: tuple[str, ...] = (),
        pin_fraction: float = 0.5,
        on_drop: Callable[[str], None] = _nothing,
    ) -> None:
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self.counts = counts
        self.tenant_quota_bytes = tenant_quota_bytes
        # Chunks under these prefixes stay (out of the policy's reach) while they fit
        # in pin_fraction of the capacity: a dataset that must not be evicted.
        self.pinned_prefixes = pinned_prefixes
        self.pin_fraction = pin_fraction
        # Told of every chunk let go, before it leaves the resident set (open files,
        # integrity, watchers hold things by chunk name).
        self.on_drop = on_drop
        self.resident = ResidentSet()
        self.reserved_bytes = 0
        self.tenant_reserved: dict[str, int] = {}
        self._pinned: dict[str, int] = {}
        self.pinned_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self.resident.used_bytes

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit without evicting anything."""
        return self.resident.used_bytes + self.reserved_bytes + size <= self.capacity_bytes

    def keep_within(self, rows: Sequence[R]) -> tuple[Sequence[R], Sequence[R]]:
        """Split rows (oldest access first) into the most recent that fit, and the rest."""
        room = self.capacity_bytes
        cut = len(rows)
        while cut > 0 and rows[cut - 1].size <= room:
            room -= rows[cut - 1].size
            cut -= 1
        return rows[cut:], rows[:cut]

    def reserve(self, name: str, size: int, tenant: str) -> tuple[list[str], bool]:
        """Make room for ``size`` bytes; returns the victims and whether room was found.

        A tenant at its quota makes room among its own chunks first, so one job
        cannot evict everyone else's.
        """
        self.policy.admit(name)
        victims, within_quota = self._over_quota_victims(tenant, size)
        if not within_quota:
            return victims, False  # its own fills in flight already use its quota
        while not self.fits(size):
            victim = self.policy.evict(name)
            if victim is None:
                break
            if self.drop(victim) is not None:
                self.counts.evictions += 1
                victims.append(victim)
        if not self.fits(size):
            return victims, False  # everything left is being filled: serve, don't store
        self.reserved_bytes += size
        self.tenant_reserved[tenant] = self.tenant_reserved.get(tenant, 0) + size
        return victims, True

    def release(self, tenant: str, size: int) -> None:
        """Give back a reservation (its chunk was published, or not)."""
        self.reserved_bytes -= size
        left = self.tenant_reserved[tenant] - size
        if left:
            self.tenant_reserved[tenant] = left
        else:
            del self.tenant_reserved[tenant]

    def _over_quota_victims(self, tenant: str, size: int) -> tuple[list[str], bool]:
        """Evict ``tenant``'s own oldest chunks until ``size`` more fits its quota."""
        victims: list[str] = []
        if not self.tenant_quota_bytes:
            return victims, True
        reserved = self.tenant_reserved.get(tenant, 0)
        quota = self.tenant_quota_bytes
        while self.resident.tenant_bytes.get(tenant, 0) + reserved + size > quota:
            victim = self.resident.oldest_of(tenant)
            if victim is None:
                return victims, False
            self.remove(victim)
            self.counts.quota_evictions += 1
            victims.append(victim)
        return victims, True

    def add(self, name: str, resident: Resident) -> None:
        """``name`` is on disk now: handed to the policy, unless it is pinned (never
        evicted while the pinned share has room for it)."""
        self.resident.add(name, resident)
        pinned = any(resident.path.startswith(prefix) for prefix in self.pinned_prefixes)
        if pinned and self.pinned_bytes + resident.size <= self.pin_fraction * self.capacity_bytes:
            self._pinned[name] = resident.size
            self.pinned_bytes += resident.size
        else:
            self.policy.insert(name, resident.size)

    def drop(self, name: str) -> Resident | None:
        """Forget ``name`` as resident, not telling the policy (it chose the victim);
        its file is deleted by the caller."""
        self.on_drop(name)
        self.pinned_bytes -= self._pinned.pop(name, 0)
        return self.resident.remove(name)

    def remove(self, name: str) -> Resident | None:
        """Forget ``name`` as resident, and the policy with it."""
        resident = self.drop(name)
        self.policy.remove(name)
        return resident
