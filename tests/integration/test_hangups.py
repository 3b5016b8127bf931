"""A loader that hangs up the moment it has its whole answer (``Connection: close``, then
its own close): every such answer is logged and counted once, on the hub's fast path
(large ranges sent from a thread) and on the spoke's (warm, by sendfile).

The hang-up used to race the answer's end: a reply sent whole from the hub's sendfile
thread reached the client, which closed, and the close cancelled the answer before its
coroutine resumed to log and count it. To make that order likely rather than lucky, the
servers run on uvloop, as in production, and the loop is held up (a callback that
sleeps) while the thread sends and the client (a process of its own) reads and closes:
uvloop then sees the thread's result and the close in the same turn, and runs the
close's callback before the answer's coroutine resumes. (asyncio's own loop resumes the
coroutine first: on it the race needs a thread late to report.)
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import uvloop

from hub.config import HubConfig
from hub.handlers import SENDFILE_THREADS
from spoke.config import SpokeConfig
from tests.conftest import CHUNK
from tests.support.hangups import (
    CUT_AT,
    CUTS,
    HUGE,
    HUGE_BYTES,
    ROUNDS,
    AccessLines,
    changed,
    count_once_back,
    hang_up_after_reading,
    hangups_reach,
    huge,
    logged,
    metrics,
    open_fds,
    stalled_client,
)
from tests.support.servers import start_hub, start_spoke
from tests.support.waits import settled_stats

BIG = "ds/big.bin"  # 2.5 MiB: a range of all of it goes by sendfile on both servers
HUGE_CHUNK = 4 << 20


def test_the_hub_logs_and_counts_each_answer_its_client_hung_up_on_at_once(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(hub_answers_hung_up_on(dataset, access_log, tmp_path))


async def hub_answers_hung_up_on(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    size = len(dataset[1][BIG])
    # The filesystem backend of the hub's own: its fast path answers.
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK))
    try:
        async with aiohttp.ClientSession() as http:
            before, since = await metrics(http, hub.url), len(access_log())
            target = f"/objects/{BIG}"
            read = await hang_up_after_reading(hub.url, target, f"bytes=0-{size - 1}", tmp_path)
            assert read == [(206, size)] * ROUNDS
            assert await logged(access_log, target, since) == [(206, size)] * ROUNDS
            after = await metrics(http, hub.url)
        # Every answer, and the first /metrics request (counted as it came in).
        assert changed(before, after, "hub_requests_total", "hub_bytes_sent_total",
                       "hub_client_hangups_total") == [ROUNDS + 1, ROUNDS * size, 0]
    finally:
        await hub.stop()


def test_a_hub_answer_cut_short_by_its_client_is_a_hang_up_and_not_logged(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(hub_answers_cut_short(dataset, access_log, tmp_path))


async def hub_answers_cut_short(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    try:
        async with aiohttp.ClientSession() as http:
            before, since = await metrics(http, hub.url), len(access_log())
            target = f"/objects/{HUGE}"
            read = await hang_up_after_reading(
                hub.url, target, f"bytes=0-{HUGE_BYTES - 1}", tmp_path, CUTS, CUT_AT)
            assert read == [(206, CUT_AT)] * CUTS
            name = "hub_client_hangups_total"
            after = await hangups_reach(http, hub.url, name, before.get(name, 0.0) + CUTS)
            assert changed(before, after, name) == [CUTS]
            assert [line for line in access_log()[since:] if line["path"] == target] == []
    finally:
        await hub.stop()


def test_the_spoke_logs_and_counts_each_warm_answer_its_client_hung_up_on_at_once(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(spoke_answers_hung_up_on(dataset, access_log, tmp_path))


async def spoke_answers_hung_up_on(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    size = len(dataset[1][BIG])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=CHUNK))
    spoke = None
    try:
        spoke = await start_spoke(SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=64 << 20,
        ))
        target = f"/objects/{BIG}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{spoke.url}{target}") as resp:
                assert await resp.read() == dataset[1][BIG]
            await settled_stats(http, spoke.url)  # every chunk on disk: the reads are warm
            before, since = await metrics(http, spoke.url), len(access_log())
            read = await hang_up_after_reading(
                spoke.url, target, f"bytes=0-{size - 1}", tmp_path)
            assert read == [(206, size)] * ROUNDS
            assert await logged(access_log, target, since) == [(206, size)] * ROUNDS
            after = await metrics(http, spoke.url)
        hits = 'spoke_read_seconds_count{cache="hit",front="http"}'
        assert changed(before, after, "spoke_served_hit_bytes_total", hits,
                       "spoke_client_hangups_total") == [ROUNDS * size, ROUNDS, 0]
    finally:
        if spoke is not None:
            await spoke.stop()
        await hub.stop()


def test_a_warm_spoke_answer_cut_short_by_its_client_is_a_hang_up_and_not_logged(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    uvloop.run(spoke_answers_cut_short(dataset, access_log, tmp_path))


async def spoke_answers_cut_short(
    dataset: tuple[Path, dict[str, bytes]], access_log: AccessLines, tmp_path: Path,
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    spoke = None
    try:
        spoke = await start_spoke(SpokeConfig(
            hub_url=hub.url, cache_dir=str(tmp_path / "cache"), capacity_bytes=2 * HUGE_BYTES,
        ))
        target = f"/objects/{HUGE}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{spoke.url}{target}") as resp:
                assert len(await resp.read()) == HUGE_BYTES
            await settled_stats(http, spoke.url)
            before, since = await metrics(http, spoke.url), len(access_log())
            read = await hang_up_after_reading(
                spoke.url, target, f"bytes=0-{HUGE_BYTES - 1}", tmp_path, CUTS, CUT_AT)
            assert read == [(206, CUT_AT)] * CUTS
            name = "spoke_client_hangups_total"
            after = await hangups_reach(http, spoke.url, name, before.get(name, 0.0) + CUTS)
            assert changed(before, after, name) == [CUTS]
            assert [line for line in access_log()[since:] if line["path"] == target] == []
    finally:
        if spoke is not None:
            await spoke.stop()
        await hub.stop()


async def test_a_hub_answer_waiting_for_a_sendfile_thread_lets_go_of_its_files_on_a_hang_up(
    dataset: tuple[Path, dict[str, bytes]],
) -> None:
    huge(dataset[0])
    hub = await start_hub(HubConfig(root=str(dataset[0]), chunk_size=HUGE_CHUNK))
    target = f"/objects/{HUGE}"
    stalled = []
    try:
        # Every sendfile thread busy with a client that does not read.
        for _ in range(SENDFILE_THREADS):
            stalled.append(await stalled_client(hub.url, target))
        before = open_fds()
        _, writer = await stalled_client(hub.url, target)  # its answer waits for a thread
        writer.close()
        await writer.wait_closed()
        now = await count_once_back(open_fds, before)
        # Its socket, and the copies of socket and file its thread would have closed.
        assert now == before
    finally:
        for _, w in stalled:
            w.close()
        await hub.stop()
