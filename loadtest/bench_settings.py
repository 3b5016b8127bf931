"""What one run of :mod:`loadtest.bench` measures, and with what: sizes, durations, flags."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.nginx import CACHE_VALID_S

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
    # (one per core: its best, 4 workers made 0.95x), the spoke with ``--workers auto``
    # (two per core: its best, spoke.config.WORKERS_PER_CORE). Neither is bound to CPUs:
    # bound, the spoke's warm 64 KiB tail is shorter but the replay's warm phase ~30 %
    # slower (spoke.workers.cpus), and nginx's ``worker_cpu_affinity auto`` was not better.
    spoke_workers: str = "auto"
    spoke_cpu_affinity: str = "off"
    # Like nginx's ``proxy_cache_valid``: both caches serve a cached version this long
    # without asking the hub. With the spoke's default (5 s) each warm run, coming
    # after ~50 s of other runs, starts by revalidating through the 60 ms link, and
    # that lands in its p99; nginx is never asked to.
    spoke_meta_ttl_s: float = CACHE_VALID_S

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
