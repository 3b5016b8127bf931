"""``python -m spoke serve`` with no tuning flags: the worker count it picks (bounded, one
with TLS), the line saying what it chose, and the buffered access log that still writes
every request's line."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import pytest
import trustme

from loadtest.procs import Process, start_process
from service.workers import machine_cpus, usable_cpus
from spoke.config import (
    MAX_AUTO_WORKERS,
    WORKERS_PER_CORE,
    choose_workers,
    config_from_args,
    parse_args,
    with_workers_chosen,
)
from tests.support.http import blocking_stats
from tests.support.raw_http import exchange, request
from tests.support.servers import RunningServer

Dataset = tuple[Path, dict[str, bytes]]
BIG = "ds/big.bin"
BASE = ["--hub", "http://127.0.0.1:9", "--cache-dir", "/nonexistent", "--capacity", "1GiB"]
CHOSEN = re.compile(r"chosen: (\d+) workers? \((.*)\), meta-ttl (\S+) s, access log (\w+)$")


@pytest.mark.parametrize(("cpus", "count"), [
    (1, 2), (2, 4), (3, 6), (4, MAX_AUTO_WORKERS), (5, MAX_AUTO_WORKERS),
    (96, MAX_AUTO_WORKERS), (0, 2),
])
def test_auto_is_two_per_cpu_up_to_the_cap(cpus: int, count: int) -> None:
    assert choose_workers(cpus)[0] == count == min(WORKERS_PER_CORE * max(1, cpus),
                                                    MAX_AUTO_WORKERS)


def test_the_cap_is_said_and_tls_wins() -> None:
    assert choose_workers(96) == (8, "auto: 2 per CPU for 96 CPUs, capped at 8")
    assert choose_workers(1) == (2, "auto: 2 per CPU for 1 CPU")
    assert choose_workers(96, "--tls-cert") == (1, "auto: 1 (--tls-cert needs one process)")


@pytest.mark.parametrize(("allowed", "cpu_max", "usable"), [
    (96, None, 96), (96, "max 100000\n", 96), (96, "200000 100000\n", 2),
    (96, "150000 100000", 2), (96, "50000 100000", 1), (2, "800000 100000", 2),
    (4, "garbage", 4), (0, None, 1),
])
def test_a_cgroup_quota_bounds_the_usable_cpus(allowed: int, cpu_max: str | None,
                                               usable: int) -> None:
    assert usable_cpus(allowed, cpu_max) == usable


def test_the_default_is_auto_and_a_count_given_stays() -> None:
    config, why = with_workers_chosen(config_from_args(parse_args(["serve", *BASE], {})))
    assert (config.workers, why) == choose_workers(machine_cpus())
    for given in ("1", "3", "auto"):
        argv = ["serve", *BASE, "--workers", given]
        config, why = with_workers_chosen(config_from_args(parse_args(argv, {})))
        assert config.workers == (int(given) if given != "auto" else choose_workers(
            machine_cpus())[0])
        assert why == ("given" if given != "auto" else choose_workers(machine_cpus())[1])


def tls_files(tmp_path: Path) -> list[str]:
    cert = trustme.CA().issue_cert("127.0.0.1")
    chain, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return ["--tls-cert", str(chain), "--tls-key", str(key)]


def test_with_tls_the_default_is_one_process_and_a_count_above_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = tls_files(tmp_path)
    config, why = with_workers_chosen(config_from_args(parse_args(["serve", *BASE, *tls], {})))
    assert (config.workers, why) == (1, "auto: 1 (--tls-cert needs one process)")
    with pytest.raises(SystemExit):
        parse_args(["serve", *BASE, *tls, "--workers", "4"], {})
    assert "--workers above 1 needs plain HTTP" in capsys.readouterr().err


def chosen_line(spoke: Process) -> re.Match[str]:
    found = [m for m in map(CHOSEN.search, spoke.log) if m]
    assert len(found) == 1, spoke.log
    return found[0]


async def test_a_spoke_started_without_flags_runs_the_chosen_workers_and_says_so(
    hub: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HUBSPOKE_WORKERS", raising=False)
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB"])
    try:
        count, why = choose_workers(machine_cpus())
        line = chosen_line(spoke)
        assert line.groups() == (str(count), why, "3600", "buffered")
        doc = await asyncio.to_thread(blocking_stats, spoke.url)
        assert doc["reader_workers"] == count - 1
        # After the listening line's: start-up parsing anchors on it, and it stays first.
        assert spoke.log.index(line.string) < next(
            i for i, text in enumerate(spoke.log) if text.startswith("listening on"))
    finally:
        await asyncio.to_thread(spoke.stop)


async def test_a_tls_spoke_started_without_flags_is_one_process(
    hub: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HUBSPOKE_WORKERS", raising=False)
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        *tls_files(tmp_path)])
    try:
        assert spoke.url.startswith("https://")
        assert chosen_line(spoke).groups()[:2] == ("1", "auto: 1 (--tls-cert needs one process)")
        assert not any("reader workers listening" in text for text in spoke.log)
    finally:
        await asyncio.to_thread(spoke.stop)


CONNECTIONS = 16
PER_CONNECTION = 25  # requests pipelined on each


async def test_the_buffered_access_log_writes_every_line_by_sigterm_and_soon_before(
    hub: RunningServer, dataset: Dataset, tmp_path: Path
) -> None:
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "2", "--log-format", "json"], log_dir=str(tmp_path))
    try:
        assert chosen_line_json(spoke)["msg"].endswith("access log buffered")
        await exchange(spoke.url, request(f"/objects/{BIG}"))  # warm: readers answer hits
        rounds = [[request(f"/objects/{BIG}", f"Range: bytes={i}-{i + 99}")
                   for i in range(PER_CONNECTION)] for _ in range(CONNECTIONS)]
        answers = [a for batch in await asyncio.gather(*(exchange(spoke.url, *r)
                                                          for r in rounds)) for a in batch]
        assert all(a[0] == 206 and a[1]["x-cache"] == "HIT" for a in answers)
        ids = {a[1]["x-request-id"] for a in answers}
        assert len(ids) == CONNECTIONS * PER_CONNECTION
        # Both processes answered (ids start with a per-process prefix): the reader
        # worker's lines are its own to write.
        assert len({rid[:8] for rid in ids}) == 2
        # A fraction of a second late while the spoke runs (polled, not timed).
        for _ in range(600):
            if ids <= logged_ids(spoke):
                break
            await asyncio.sleep(0.05)
        assert ids <= logged_ids(spoke)
        more = {f"late{i:03d}" for i in range(40)}
        await exchange(spoke.url, *(request(f"/objects/{BIG}", "Range: bytes=0-9",
                                            f"X-Request-Id: {rid}") for rid in sorted(more)))
    finally:
        code = await asyncio.to_thread(spoke.stop, signal.SIGTERM)
    assert code == 0
    # The ones answered just before SIGTERM too: all of them, once each.
    counts = logged_id_counts(spoke)
    assert {rid: counts.get(rid) for rid in ids | more} == dict.fromkeys(ids | more, 1)
    # Written as each process stops, not after: the spoke says "stopped" once its reader
    # workers have exited, and every access line comes before.
    stopped = next(i for i, e in enumerate(json_entries(spoke)) if e.get("msg") == "stopped")
    last_access = max(i for i, e in enumerate(json_entries(spoke))
                      if e.get("logger") == "hubspoke.access")
    assert last_access < stopped


def json_entries(spoke: Process) -> list[dict[str, object]]:
    return [json.loads(text) for text in spoke.log if text.startswith("{")]


def chosen_line_json(spoke: Process) -> dict[str, object]:
    [entry] = [e for e in json_entries(spoke) if str(e.get("msg", "")).startswith("chosen: ")]
    return entry


def logged_id_counts(spoke: Process) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in json_entries(spoke):
        if entry.get("logger") == "hubspoke.access":
            rid = str(entry["request_id"])
            counts[rid] = counts.get(rid, 0) + 1
    return counts


def logged_ids(spoke: Process) -> set[str]:
    return set(logged_id_counts(spoke))

