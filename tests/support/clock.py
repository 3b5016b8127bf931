"""FakeClock: time that moves only when a test says so, for a spoke's cache.

Handed to ``ChunkCache`` (or to ``start_spoke``), it lets a test step past a manifest's
TTL or a chunk's max age at once instead of sleeping through it on a loaded machine.
"""

from __future__ import annotations

from spoke.cache.clock import Clock

# The wall clock's reading at the fake monotonic clock's zero: a recent date, so that
# times written down (chunks' stored_at) look like real ones.
WALL_AT_ZERO = 1.7e9


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL_AT_ZERO + self.now

    def clock(self) -> Clock:
        return Clock(monotonic=self.monotonic, wall=self.wall)
