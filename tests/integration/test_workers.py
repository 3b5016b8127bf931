"""``--workers``: reader workers on the spoke's port, as separate processes over real
sockets. They answer plain hits from the owner's files, hand everything else over with
its connection, are counted by the owner, never fetch, and never outlive a purge."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loadtest.bench import process_tree
from loadtest.procs import Process, start_process
from spoke.workers.channel import MAX_MESSAGE_BYTES
from spoke.workers.cpus import spread
from tests.conftest import CHUNK
from tests.support.http import blocking_stats
from tests.support.raw_http import connect, exchange, raw_get, request
from tests.support.servers import GatedBackend, RunningServer

Dataset = tuple[Path, dict[str, bytes]]
BIG = "ds/big.bin"
CONNECTIONS = 24  # all landing on one of two processes by chance: 2 ** -23


@pytest.fixture
async def workers(hub: RunningServer, tmp_path: Path) -> AsyncIterator[Process]:
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "2", "--meta-ttl", "1", "--access-log", "off", "--log-level", "warning",
    ])
    yield spoke
    await asyncio.to_thread(spoke.stop)


async def warm(server: Process) -> str:
    """Read all of BIG (not a plain read: the owner answers); the owner's id prefix."""
    [answer] = await exchange(server.url, request(f"/objects/{BIG}"))
    assert answer[0] == 200
    return process_of(answer)


def process_of(answer: tuple[int, dict[str, str], bytes]) -> str:
    return answer[1]["x-request-id"][:8]  # request ids start with a per-process prefix


async def test_hits_are_served_by_both_processes_and_counted_once_by_the_owner(
    workers: Process, dataset: Dataset
) -> None:
    data = dataset[1][BIG]
    await warm(workers)
    before = await asyncio.to_thread(blocking_stats, workers.url)
    assert before["reader_workers"] == 1
    reads = [(i * 1000, i * 1000 + 99) for i in range(CONNECTIONS)]
    answers = await asyncio.gather(*(
        exchange(workers.url, request(f"/objects/{BIG}", f"Range: bytes={a}-{b}"))
        for a, b in reads))
    for (a, b), [answer] in zip(reads, answers, strict=True):
        assert (answer[0], answer[1]["x-cache"], answer[2]) == (206, "HIT", data[a:b + 1])
    assert len({process_of(answer) for [answer] in answers}) == 2
    # Reader workers report every 50 ms: the owner counts every hit, fetches nothing.
    for _ in range(100):
        after = await asyncio.to_thread(blocking_stats, workers.url)
        if after["hits"] - before["hits"] == CONNECTIONS:
            break
        await asyncio.sleep(0.05)
    assert after["hits"] - before["hits"] == CONNECTIONS
    assert after["bytes_served_hit"] - before["bytes_served_hit"] == 100 * CONNECTIONS
    assert after["hub_fetches"] == before["hub_fetches"]


async def test_what_a_reader_declines_the_owner_answers_on_the_same_connection(
    workers: Process, dataset: Dataset
) -> None:
    data = dataset[1][BIG]
    # Cold reads (misses) pipelined with a plain read and a management route: the
    # reader passes the connection and the bytes it read; the owner answers all three.
    requests = [
        request(f"/objects/{BIG}", f"Range: bytes={5 * CHUNK}-{5 * CHUNK + 9}"),
        request(f"/objects/{BIG}", f"Range: bytes={5 * CHUNK + 10}-{5 * CHUNK + 19}"),
        request("/healthz"),
    ]
    answers = await asyncio.gather(*(exchange(workers.url, *requests) for _ in range(CONNECTIONS)))
    for first, second, health in answers:
        assert (first[0], first[2]) == (206, data[5 * CHUNK:5 * CHUNK + 10])
        assert (second[0], second[2]) == (206, data[5 * CHUNK + 10:5 * CHUNK + 20])
        assert health[0] == 200
    counts = await asyncio.to_thread(blocking_stats, workers.url)
    assert counts["handed_over_connections"] >= 1
    assert counts["hub_fetches"] == 1  # one chunk, fetched once for every connection


async def test_no_process_serves_a_purged_chunk_once_the_purge_has_answered(
    workers: Process, gated: GatedBackend
) -> None:
    owner = await warm(workers)
    plain = request(f"/objects/{BIG}", "Range: bytes=0-99")
    streams = await asyncio.gather(
        *(connect(workers.url) for _ in range(CONNECTIONS)))

    async def read_on_each() -> list[tuple[int, str]]:
        answers = []
        for reader, writer in streams:
            writer.write(plain)
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
            length = int(head.split("Content-Length: ")[1].split("\r\n")[0])
            await reader.readexactly(length)
            answers.append((int(head.split()[1]), head.split("X-Request-Id: ")[1][:8]))
        return answers

    try:
        before = await read_on_each()
        assert {status for status, _ in before} == {206}
        assert {prefix for _, prefix in before} - {owner}  # readers hold open chunk files
        # By prefix: manifests stay fresh, only the chunks go (what readers must drop).
        purge = urllib.request.Request(f"{workers.url}/cache/ds/", method="DELETE")
        await asyncio.to_thread(urllib.request.urlopen, purge, timeout=10)
        gated.fail_reads = True  # the hub cannot give the bytes back: a 206 now is purged bytes
        after = await read_on_each()
    finally:
        for _, writer in streams:
            writer.close()
    assert all(status >= 500 for status, _ in after), after


async def test_readers_keep_serving_past_the_manifest_ttl(workers: Process) -> None:
    # --meta-ttl 1, and only connections a reader accepted: the owner sees none of
    # these reads, yet revalidates what readers read before their copy expires, so a
    # reader never finds it stale and hands its connection over mid-stream.
    owner = await warm(workers)
    before = await asyncio.to_thread(blocking_stats, workers.url)
    plain = request(f"/objects/{BIG}", "Range: bytes=0-99")

    async def read(stream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> str:
        reader, writer = stream
        writer.write(plain)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"X-Cache: HIT" in head
        await reader.readexactly(100)
        return head.split(b"X-Request-Id: ")[1][:8].decode()

    streams = await asyncio.gather(
        *(connect(workers.url) for _ in range(CONNECTIONS)))
    ours = []
    for stream in streams:
        if await read(stream) != owner:
            ours.append(stream)
        else:
            stream[1].close()
    assert ours
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.5
    try:
        while loop.time() < until:
            assert owner not in [await read(stream) for stream in ours]  # nobody moved
            await asyncio.sleep(0.05)
    finally:
        for _, writer in ours:
            writer.close()
    after = await asyncio.to_thread(blocking_stats, workers.url)
    assert after["manifest_fetches"] > before["manifest_fetches"]  # revalidated meanwhile


async def test_reader_workers_stop_with_the_spoke(hub: RunningServer, tmp_path: Path) -> None:
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "3",
    ])
    try:
        readers = [pid for pid in process_tree(spoke.pid) if pid != spoke.pid]
        assert len(readers) == 2
        assert (await asyncio.to_thread(blocking_stats, spoke.url))["reader_workers"] == 2
    finally:
        assert await asyncio.to_thread(spoke.stop) == 0
    for pid in readers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def open_files_limit(pid: int) -> tuple[str, str]:
    """The soft and hard "Max open files" of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError(f"no open files limit for {pid}")


async def test_the_spoke_and_its_readers_lift_their_open_files_limit(
    hub: RunningServer, tmp_path: Path
) -> None:
    # Started under a low soft limit (children inherit it), every process of the spoke
    # raises it to the hard one: connections, open chunks and their maps all need fds.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Below the hard limit, whatever it is here, so there is always something to raise.
    low = 512 if hard == resource.RLIM_INFINITY else min(512, hard // 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        spoke = await asyncio.to_thread(start_process, "spoke", [
            "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
            "--workers", "2",
        ])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        pids = process_tree(spoke.pid)
        assert len(pids) == 2
        expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        for pid in pids:
            got_soft, got_hard = open_files_limit(pid)
            assert got_hard == expected
            assert got_soft == (str(1 << 20) if expected == "unlimited" else expected)
    finally:
        await asyncio.to_thread(spoke.stop)


async def test_after_a_restart_readers_ask_the_owner_what_they_do_not_know(
    hub: RunningServer, tmp_path: Path, dataset: Dataset
) -> None:
    # The chunks are on disk from the last run but no manifest is fresh: a reader asks
    # the owner for it (the owner asks the hub) and answers, keeping its connection.
    data = dataset[1][BIG]
    args = ["--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
            "--workers", "2", "--access-log", "off"]
    first = await asyncio.to_thread(start_process, "spoke", args)
    try:
        await warm(first)
    finally:
        await asyncio.to_thread(first.stop)
    again = await asyncio.to_thread(start_process, "spoke", args)
    try:
        plain = request(f"/objects/{BIG}", "Range: bytes=10-19")
        answers = await asyncio.gather(*(exchange(again.url, plain) for _ in range(CONNECTIONS)))
        assert {(a[0], a[1]["x-cache"], a[2]) for [a] in answers} == {(206, "HIT", data[10:20])}
        owner = await warm(again)
        assert {process_of(a) for [a] in answers} - {owner}  # readers answered some
        assert (await asyncio.to_thread(blocking_stats, again.url))["hub_fetches"] == 0
    finally:
        await asyncio.to_thread(again.stop)


async def test_a_read_the_owner_cannot_place_is_handed_over_whole(
    workers: Process, dataset: Dataset
) -> None:
    # A reader asks about a path the hub does not have; told "unknown", it hands the
    # connection over with the request it was holding and the one pipelined after it.
    data = dataset[1][BIG]
    requests = [request("/objects/ds/nope.bin", "Range: bytes=0-9"),
                request(f"/objects/{BIG}", "Range: bytes=0-9")]
    answers = await asyncio.gather(*(exchange(workers.url, *requests) for _ in range(CONNECTIONS)))
    for missing, found in answers:
        assert missing[0] == 404
        assert missing[1]["content-type"].startswith("application/problem+json")
        assert (found[0], found[2]) == (206, data[0:10])
    assert (await asyncio.to_thread(blocking_stats, workers.url))["handed_over_connections"] >= 1


async def test_a_large_range_is_answered_alike_by_either_process(
    workers: Process, dataset: Dataset
) -> None:
    # Large enough for sendfile: a reader sends it from the chunk files itself; the
    # owner through its general path. A loader cannot tell which answered.
    data = dataset[1][BIG]
    owner = await warm(workers)
    a, b = CHUNK + 11, 6 * CHUNK + 5  # 6 chunks, ~320 KiB
    heads: dict[bool, list[dict[str, str]]] = {}
    # Rounds until both have answered some: on a loaded machine the metadata's 1 s TTL
    # can lapse within a round, and a reader then hands its reads to the owner.
    for _ in range(10):
        answers = await asyncio.gather(*(
            exchange(workers.url, request(f"/objects/{BIG}", f"Range: bytes={a}-{b}"))
            for _ in range(CONNECTIONS)))
        for [(status, fields, body)] in answers:
            assert (status, fields["x-cache"], body) == (206, "HIT", data[a:b + 1])
            same = {k: v for k, v in fields.items() if k not in ("date", "x-request-id")}
            heads.setdefault(fields["x-request-id"][:8] == owner, []).append(same)
        if set(heads) == {True, False}:
            break
    assert set(heads) == {True, False}  # both answered some
    assert all(h == heads[True][0] for group in heads.values() for h in group)


async def test_a_reader_that_dies_is_replaced(workers: Process, dataset: Dataset) -> None:
    data = dataset[1][BIG]
    owner = await warm(workers)
    [reader] = [pid for pid in process_tree(workers.pid) if pid != workers.pid]
    os.kill(reader, signal.SIGKILL)
    counts: dict[str, int] = {}
    for _ in range(100):  # replaced after a 1 s pause
        try:
            counts = await asyncio.to_thread(blocking_stats, workers.url)
        except OSError:  # a connection the kernel gave the dying reader: reset
            continue
        if counts["reader_restarts"] == 1 and counts["reader_workers"] == 1:
            break
        await asyncio.sleep(0.1)
    assert (counts["reader_restarts"], counts["reader_workers"]) == (1, 1)
    [replacement] = [pid for pid in process_tree(workers.pid) if pid != workers.pid]
    assert replacement != reader
    plain = request(f"/objects/{BIG}", "Range: bytes=0-99")
    answers = await asyncio.gather(*(exchange(workers.url, plain) for _ in range(CONNECTIONS)))
    assert {(a[0], a[2]) for [a] in answers} == {(206, data[:100])}
    assert {process_of(a) for [a] in answers} - {owner}  # the new reader serves


async def test_a_cold_read_on_either_process_asks_for_its_first_chunk_with_the_manifest(
    workers: Process, dataset: Dataset
) -> None:
    [learned] = await exchange(workers.url, request("/objects/ds/one-byte.bin"))  # the chunk size
    assert learned[0] == 200
    before = await asyncio.to_thread(blocking_stats, workers.url)
    paths = ["ds/small.bin", "ds/exact.bin", "ds/partial.bin", "other/notes.csv", BIG]
    answers = await asyncio.gather(*(
        exchange(workers.url, request(f"/objects/{path}", "Range: bytes=0-99")) for path in paths))
    for path, [answer] in zip(paths, answers, strict=True):
        assert (answer[0], answer[2]) == (206, dataset[1][path][:100])
    # A reader that knows nothing of the object tells the owner where the read starts,
    # and the owner's fetch of that chunk goes with the manifest's, as for its own reads.
    after = await asyncio.to_thread(blocking_stats, workers.url)
    grew = {k: after[k] - before[k] for k in ("early_fetches", "early_fetches_used", "hub_fetches")}
    assert grew == {"early_fetches": 5, "early_fetches_used": 5, "hub_fetches": 5}


def cpus_of(pid: int) -> set[str]:
    """The CPUs each thread of process ``pid`` may run on, as the kernel lists them."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.add(line.split(":", 1)[1].strip())
    return found


async def test_cpu_affinity_spread_binds_every_process_and_its_replacement(
    hub: RunningServer, tmp_path: Path
) -> None:
    placement = [str(cpu) for cpu in spread(os.sched_getaffinity(0), 4)]
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "4", "--cpu-affinity", "spread", "--access-log", "off",
    ])
    try:
        # The spoke on the first CPU, its threads with it; each reader on the next.
        assert cpus_of(spoke.pid) == {placement[0]}
        readers = [pid for pid in process_tree(spoke.pid) if pid != spoke.pid]
        assert sorted(cpu for pid in readers for cpu in cpus_of(pid)) == sorted(placement[1:])

        gone = readers[0]
        cpu_of_gone = cpus_of(gone)
        os.kill(gone, signal.SIGKILL)
        counts: dict[str, int] = {}
        for _ in range(200):  # the owner waits RESTART_PAUSE_S (1 s) before replacing it
            await asyncio.sleep(0.05)
            try:
                counts = await asyncio.to_thread(blocking_stats, spoke.url)
            except OSError:  # queued on the killed reader's socket as it died: reset
                continue
            if counts["reader_restarts"] == 1 and counts["reader_workers"] == 3:
                break
        else:
            raise AssertionError(f"no replacement reader: {counts}")
        (new,) = set(process_tree(spoke.pid)) - set(readers) - {spoke.pid}
        assert cpus_of(new) == cpu_of_gone
    finally:
        await asyncio.to_thread(spoke.stop)


async def test_without_cpu_affinity_the_processes_keep_every_cpu(
    hub: RunningServer, tmp_path: Path
) -> None:
    allowed = os.sched_getaffinity(0)
    spoke = await asyncio.to_thread(start_process, "spoke", [
        "--hub", hub.url, "--cache-dir", str(tmp_path / "cache"), "--capacity", "64MiB",
        "--workers", "2", "--access-log", "off",
    ])
    try:
        for pid in process_tree(spoke.pid):
            assert os.sched_getaffinity(pid) == allowed
    finally:
        await asyncio.to_thread(spoke.stop)


async def test_a_partly_cached_read_during_an_outage_gets_503_from_either_process(
    workers: Process, hub: RunningServer
) -> None:
    # Chunk 0 cached, chunk 1 not; then the hub goes. A reader worker hands the read
    # over (it holds no hub), and the owner must answer it a 503, not cut it.
    [answer] = await exchange(workers.url, request(f"/objects/{BIG}", "Range: bytes=0-99"))
    assert answer[0] == 206
    before = await asyncio.to_thread(blocking_stats, workers.url)
    await hub.stop()
    answers = await asyncio.gather(*(
        raw_get(workers.url, f"/objects/{BIG}", f"Range: bytes=100-{2 * CHUNK - 1}")
        for _ in range(CONNECTIONS)))
    for reply in answers:
        assert (reply.status, reply.complete) == (503, True), reply.describe()
        assert int(reply.headers["retry-after"]) >= 1
    after = await asyncio.to_thread(blocking_stats, workers.url)
    assert after["handed_over_connections"] > before["handed_over_connections"]


async def test_a_request_body_a_reader_read_with_its_head_goes_over_whole(
    workers: Process, dataset: Dataset
) -> None:
    # A plan of thousands of reads is one large POST: a reader that received its head and
    # much of its body in one read hands both over, however many bytes that is.
    # Whitespace, which JSON allows, makes it large: planning tens of thousands of reads
    # on each of the connections took the owner past the client's timeout under load.
    reads = [[BIG, offset, 100] for offset in range(0, len(dataset[1][BIG]) - 100, 2_600)]
    body = json.dumps({"reads": reads}).encode() + b" " * (4 * MAX_MESSAGE_BYTES)
    assert len(body) > 4 * MAX_MESSAGE_BYTES
    post = request("/plans", "Content-Type: application/json",
                   f"Content-Length: {len(body)}", method="POST") + body
    answers = await asyncio.gather(*(
        exchange(workers.url, post, request("/healthz")) for _ in range(CONNECTIONS)))
    for planned, health in answers:
        assert planned[0] == 201, planned
        assert json.loads(planned[2])["chunk_reads"] == len(reads)
        assert health[0] == 200
    counts = await asyncio.to_thread(blocking_stats, workers.url)
    assert counts["handed_over_connections"] >= 1
