"""ResidentSet: what is on disk, by chunk, and the byte tallies kept from it.

The one place that knows which chunks are published, how many bytes they take,
which tenant's read brought each in, and when each was stored: the capacity,
the per-tenant quota and ``--max-age`` are all read off it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resident:
    size: int
    path: str
    tenant: str = ""
    stored_at: float = 0.0
    # What its file must hash to (spoke.cache.integrity checks it before serving it).
    digest_alg: str = ""
    digest: bytes = b""


class ResidentSet:
    def __init__(self) -> None:
        self._chunks: dict[str, Resident] = {}
        self.used_bytes = 0
        self.tenant_bytes: dict[str, int] = {}
        # Each tenant's chunks, least recently read first: a tenant over its quota
        # makes room among its own.
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        self._per_path: dict[str, int] = {}  # chunks held of each object

    def __contains__(self, name: object) -> bool:
        return name in self._chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def get(self, name: str) -> Resident | None:
        return self._chunks.get(name)

    def items(self) -> Iterator[tuple[str, Resident]]:
        return iter(list(self._chunks.items()))

    def add(self, name: str, resident: Resident) -> None:
        self.remove(name)
        self._chunks[name] = resident
        self.used_bytes += resident.size
        self.tenant_bytes[resident.tenant] = (
            self.tenant_bytes.get(resident.tenant, 0) + resident.size
        )
        self._by_tenant.setdefault(resident.tenant, OrderedDict())[name] = None
        self._per_path[resident.path] = self._per_path.get(resident.path, 0) + 1

    def remove(self, name: str) -> Resident | None:
        resident = self._chunks.pop(name, None)
        if resident is None:
            return None
        self.used_bytes -= resident.size
        left = self.tenant_bytes[resident.tenant] - resident.size
        order = self._by_tenant[resident.tenant]
        del order[name]
        if order:
            self.tenant_bytes[resident.tenant] = left
        else:
            del self.tenant_bytes[resident.tenant], self._by_tenant[resident.tenant]
        held = self._per_path.pop(resident.path) - 1
        if held:
            self._per_path[resident.path] = held
        return resident

    def tenant_bytes_under(self, covered: Callable[[str], bool]) -> dict[str, int]:
        """Bytes per tenant of the chunks whose object path ``covered`` accepts."""
        tally: dict[str, int] = {}
        for resident in self._chunks.values():
            if covered(resident.path):
                tally[resident.tenant] = tally.get(resident.tenant, 0) + resident.size
        return tally

    def holds_any_of(self, path: str) -> bool:
        """Whether any chunk of object ``path`` (of any version) is on disk."""
        return path in self._per_path

    def touched(self, name: str) -> None:
        resident = self._chunks.get(name)
        if resident is not None:
            self._by_tenant[resident.tenant].move_to_end(name)

    def oldest_of(self, tenant: str) -> str | None:
        """The chunk of ``tenant`` read least recently, if it has any."""
        order = self._by_tenant.get(tenant)
        return next(iter(order)) if order else None

    def stored_before(self, deadline: float) -> list[str]:
        return [n for n, r in self._chunks.items() if r.stored_at < deadline]

    def matching(self, path: str | None, prefix: str | None) -> list[str]:
        return [n for n, r in self._chunks.items() if covers(path, prefix, r.path)]


def covers(path: str | None, prefix: str | None, object_path: str) -> bool:
    """Whether a purge of ``path`` or ``prefix`` covers the chunks of ``object_path``."""
    return (path is not None and object_path == path) or (
        prefix is not None and object_path.startswith(prefix)
    )
