"""The cold stream cell alone runs end to end: the bare link, a spoke, CPU per GB per part."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from loadtest.bench_cold_cpu import main, parse_side
from loadtest.meter import disk_of

SHARD_MIB = 32
# The kernel counts CPU time in ticks of 10 ms, and the loop thread is read just after
# its process: the two can differ by a tick at each end of a run.
TICKS_SLACK_PER_GB = 2 * 0.01 / (2 * SHARD_MIB * (1 << 20) / 1e9)


def test_the_cold_stream_cell_reports_each_part_of_the_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--rounds", "1", "--readers", "2", "--shards", "2", "--shard-mib", str(SHARD_MIB),
                 "--side", "defaults=.", "--side", "readahead 8=.:--readahead,8"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[2].startswith("| side | flags | ÷ bare link")
    rows = [row.strip("| ").split(" | ") for row in table[4:]]
    assert [row[0] for row in rows] == ["bare link", "defaults", "readahead 8"]
    assert rows[2][1] == "`--readahead 8`"
    bare, *spokes = rows
    assert float(bare[4]) > 0 and bare[-1] == "0"  # no spoke, no fetches
    for row in spokes:
        client, hub, link, spoke, loop, total = (float(v) for v in row[5:11])
        assert float(row[2]) > 0 and spoke > 0 and 0 < loop <= spoke + TICKS_SLACK_PER_GB
        assert total == pytest.approx(client + hub + link + spoke, abs=0.02)
        assert row[-1] == str(2 * SHARD_MIB // 4)  # in 4 MiB chunks, each fetched once
        write_mb_s, busy = row[11], row[13]
        if disk_of(tempfile.gettempdir()) is None:
            assert (write_mb_s, busy) == ("-", "-")
        else:  # a spoke stores every chunk it fetched: its device was written
            assert float(write_mb_s) > 0 and busy.endswith("%")


def test_the_cold_random_cell_reads_every_range_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--rounds", "1", "--readers", "4", "--shards", "2", "--shard-mib", "8",
                 "--pattern", "random"]) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].startswith("Cold random: 4 readers, 2 4 MiB ranges at random of 8 MiB")
    rows = [row.strip("| ").split(" | ") for row in table[4:]]
    assert [row[0] for row in rows] == ["bare link", "spoke"]
    assert float(rows[1][2]) > 0
    assert rows[1][-1] == "4"  # 2 shards of two 4 MiB chunks, each fetched once


def test_a_side_names_a_checkout_and_its_flags() -> None:
    side = parse_side("ra8=/tmp/tree:--readahead,8")
    assert (side.name, side.tree, side.flags) == ("ra8", "/tmp/tree", ("--readahead", "8"))
    with pytest.raises(Exception, match="NAME=TREE"):
        parse_side("no-tree")


def test_a_relay_side_puts_nginx_in_the_spokes_place(capsys: pytest.CaptureFixture[str]) -> None:
    # 256 MiB: nginx's ~0.1 s of CPU is about ten of the kernel's 10 ms ticks (it is charged
    # by the tick), so none at all would mean the bytes did not go through it.
    assert main(["--rounds", "1", "--readers", "2", "--shards", "4", "--shard-mib", "64",
                 "--relay"]) == 0
    rows = [row.strip("| ").split(" | ") for row in capsys.readouterr().out.strip()
            .splitlines()[4:]]
    assert [row[0] for row in rows] == ["bare link", "spoke", "nginx relay"]
    relay = rows[2]
    nginx, loop = float(relay[8]), float(relay[9])
    # Every byte went through it (the tool stops on a short read), costing nginx CPU, no
    # spoke's loop, and no chunk was fetched: nothing was cached.
    assert float(relay[2]) > 0 and nginx > 0 and loop == 0 and relay[-1] == "0"


def test_the_caches_go_where_asked_and_are_removed(capsys: pytest.CaptureFixture[str]) -> None:
    # Linux mounts a tmpfs at /dev/shm: a directory with no disk under it.
    assert os.path.isdir("/dev/shm") and disk_of("/dev/shm") is None
    root = tempfile.mkdtemp(prefix="bench-cold-cpu-test-", dir="/dev/shm")
    try:
        assert main(["--rounds", "1", "--readers", "2", "--shards", "1", "--shard-mib", "8",
                     "--cache-root", root]) == 0
        rows = [row.strip("| ").split(" | ") for row in capsys.readouterr().out.strip()
                .splitlines()[4:]]
        spoke = rows[1]
        assert spoke[0] == "spoke" and spoke[-1] == "2"  # it fetched and cached both chunks...
        assert spoke[11:14] == ["-", "-", "-"]  # ...on tmpfs, no disk under them
        assert os.listdir(root) == []  # and the cache is gone once the run is over
    finally:
        shutil.rmtree(root, ignore_errors=True)
