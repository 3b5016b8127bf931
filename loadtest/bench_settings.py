"""What one run of :mod:`loadtest.bench` measures, and with what: sizes, durations, flags."""

from __future__ import annotations

from dataclasses import dataclass

from spoke.config import SpokeConfig

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Settings:
    mode: str
    file_bytes: int  # the big file read at random by wrk
    stream_shards: int
    stream_shard_bytes: int
    stream_readers: int
    replay_shards: int
    replay_shard_bytes: int
    replay_workers: int
    replay_epochs: int
    wrk_seconds: float
    rounds: int
    latency_ms: int = 60
    big_range: int = 4 * MiB
    big_conns: int = 16
    small_range: int = 64 * 1024
    small_conns: int = 64
    batch: int = 32
    batch_conns: int = 16
    cold_random_conns: int = 16
    cold_rounds: int = 1
    wrk_threads: int = 2
    # Each cache as its operator would run it here: nginx with ``worker_processes auto``
    # (one per core: its best, 4 workers made 0.95x), the spoke with no tuning flags at
    # all (hub, cache directory, capacity, port: its defaults, ``--workers auto``, the
    # buffered access log, an hour's ``--meta-ttl`` like nginx's ``proxy_cache_valid``,
    # spoke.config). ``spoke_flags`` adds a user's tuning, to measure it side by side.
    spoke_flags: tuple[str, ...] = ()

    @property
    def spoke_meta_ttl_s(self) -> float:
        """How long the spoke serves a cached version without asking the hub."""
        flags = list(self.spoke_flags)
        if "--meta-ttl" in flags[:-1]:
            return float(flags[flags.index("--meta-ttl") + 1])
        return float(SpokeConfig.__dataclass_fields__["meta_ttl_s"].default)

    @property
    def spoke_described(self) -> str:
        """The spoke's flags, for the report."""
        return f"`{' '.join(self.spoke_flags)}`" if self.spoke_flags else "its defaults"

    @property
    def data_bytes(self) -> int:
        return (self.file_bytes + self.stream_shards * self.stream_shard_bytes
                + self.replay_shards * self.replay_shard_bytes)


FULL = Settings(
    mode="full", file_bytes=1 * GiB, stream_shards=8, stream_shard_bytes=128 * MiB,
    stream_readers=4, replay_shards=24, replay_shard_bytes=16 * MiB, replay_workers=32,
    replay_epochs=3, wrk_seconds=5, rounds=4, cold_rounds=2,
)
QUICK = Settings(
    mode="quick", file_bytes=64 * MiB, stream_shards=4, stream_shard_bytes=16 * MiB,
    stream_readers=2, replay_shards=8, replay_shard_bytes=2 * MiB, replay_workers=8,
    replay_epochs=3, wrk_seconds=1, rounds=1,
)
