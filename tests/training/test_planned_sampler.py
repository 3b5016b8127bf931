"""PlannedSampler with real DataLoader workers against a real hub and spoke."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch
from torch.utils.data import DataLoader

from loadtest.procs import Process, start_process
from spoke.client.torch_dataset import PlannedIndex, PlannedSampler, ShardedSamples
from tests.support.servers import write_dataset

TOKENS = 512
SAMPLE_BYTES = TOKENS * 4
CHUNK = 16 * 1024
PER_SHARD = 24
SHARDS = {f"tok/shard-{i:05d}.bin": PER_SHARD * SAMPLE_BYTES for i in range(3)}
N = 3 * PER_SHARD
# Long enough that the plan's cursor window (under half an epoch) takes what a DataLoader's
# workers reorder: one of two workers up to its prefetch ahead of the other, three batches.
# Over ``tok/``'s 72 samples, a lagging worker left the cursor a batch short of the end.
LONG_PER_SHARD = 64
LONG = {f"long/shard-{i:05d}.bin": LONG_PER_SHARD * SAMPLE_BYTES for i in range(3)}


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("hub")
    files = write_dataset(str(root), SHARDS | LONG, seed=8)
    logs = str(tmp_path_factory.mktemp("logs"))
    hub = start_process("hub", ["--root", str(root), "--chunk-size", "16KiB"], log_dir=logs)
    spoke: Process | None = None
    try:
        spoke = start_process("spoke", ["--hub", hub.url, "--cache-dir",
                                        str(tmp_path_factory.mktemp("cache")),
                                        "--capacity", "64MiB"], log_dir=logs)
        yield spoke.url, hub.url, files
    finally:
        if spoke is not None:
            spoke.stop()
        hub.stop()


def sample(files: dict[str, bytes], index: int, prefix: str = "tok/",
           per_shard: int = PER_SHARD) -> torch.Tensor:
    shard, within = divmod(index, per_shard)
    start = within * SAMPLE_BYTES
    data = files[f"{prefix}shard-{shard:05d}.bin"][start:start + SAMPLE_BYTES]
    return torch.frombuffer(bytearray(data), dtype=torch.int32).to(torch.int64)


def plans(url: str) -> dict[str, dict[str, object]]:
    listed = requests.get(f"{url}/plans", timeout=30).json()["plans"]
    return {p["id"]: p for p in listed}


def test_a_planned_index_pickles_with_its_plan() -> None:
    index = pickle.loads(pickle.dumps(PlannedIndex(5, "p1")))
    assert index == 5 and index.plan == "p1" and isinstance(index, PlannedIndex)


def test_persistent_workers_read_each_epoch_under_its_plan(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, files = servers
    n = 3 * LONG_PER_SHARD
    dataset = ShardedSamples(url, prefix="long/", tokens_per_sample=TOKENS)
    sampler = PlannedSampler(dataset, seed=4)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2,
                        persistent_workers=True)
    ids = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sampler.plan_id in plans(url)  # told before the loader asks for a sample
        rows = [row for batch in loader for row in batch]
        order = sampler.order(epoch)
        assert len(rows) == n and sorted(order) == list(range(n))
        for row, index in zip(rows, order, strict=True):  # in the sampler's order, byte-exact
            assert torch.equal(row, sample(files, index, "long/", LONG_PER_SHARD))
        ids.append(sampler.plan_id)
        booked = plans(url)
        # Only this epoch's plan is left, and the workers' reads moved it through the
        # epoch: it covers this epoch and a quarter of the next, and got to this
        # epoch's end (how far past it a late read may throw it is the cursor's
        # business, not the sampler's).
        assert list(booked) == [sampler.plan_id]
        assert booked[sampler.plan_id]["chunk_reads"] == n + n // 4
        assert int(booked[sampler.plan_id]["cursor"]) >= n - 1  # type: ignore[call-overload]
    assert len(set(ids)) == 3
    assert sampler.order(0) != sampler.order(1)
    requests.delete(f"{url}/plans/{sampler.plan_id}", timeout=30)


def test_epoch_0_is_booked_when_the_sampler_is_made(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, _ = servers
    dataset = ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS)
    sampler = PlannedSampler(dataset, seed=5)
    made = sampler.plan_id
    # Before the loader (or set_epoch) asks: the spoke has the epoch and a quarter.
    assert made is not None and plans(url)[made]["chunk_reads"] == N + N // 4
    sampler.set_epoch(0)
    first = list(sampler)
    assert sampler.plan_id == made and first == sampler.order(0)
    assert all(isinstance(i, PlannedIndex) and i.plan == made for i in first)
    requests.delete(f"{url}/plans/{made}", timeout=30)


def test_a_sampler_told_not_to_books_on_set_epoch_or_its_first_pass(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, _ = servers
    dataset = ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS)
    before = plans(url)
    sampler = PlannedSampler(dataset, seed=6, register_now=False)
    assert sampler.plan_id is None and plans(url) == before
    sampler.set_epoch(3)  # a job resuming at epoch 3 books that epoch, and only it
    booked = set(plans(url)) - set(before)
    assert booked == {sampler.plan_id} and list(sampler) == sampler.order(3)
    lazy = PlannedSampler(dataset, seed=7, register_now=False)
    assert lazy.plan_id is None
    assert list(lazy) == lazy.order(0) and lazy.plan_id in plans(url)
    for plan in (sampler.plan_id, lazy.plan_id):
        requests.delete(f"{url}/plans/{plan}", timeout=30)


def test_without_set_epoch_each_pass_is_the_next_epoch(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, _ = servers
    dataset = ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS)
    sampler = PlannedSampler(dataset, seed=1)
    first, second = list(sampler), list(sampler)
    assert first == sampler.order(0) and second == sampler.order(1)
    assert all(isinstance(i, PlannedIndex) and i.plan == sampler.plan_id for i in second)
    requests.delete(f"{url}/plans/{sampler.plan_id}", timeout=30)


def test_ranks_share_one_plan_and_split_the_epoch(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, files = servers
    world = 4
    before = plans(url)
    samplers = [PlannedSampler(ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS),
                               seed=9, rank=r, world_size=world) for r in range(world)]
    shares = [list(s) for s in samplers]
    assert {s.plan_id for s in samplers} == {samplers[0].plan_id}
    assert set(plans(url)) - set(before) == {samplers[0].plan_id}  # one plan for the job
    assert sorted(int(i) for share in shares for i in share) == list(range(N))
    assert {len(s) for s in shares} == {N // world} == {len(s) for s in samplers}
    # Rank r reads every world-th sample of the job's one order.
    order = samplers[0].order(0)
    for rank, share in enumerate(shares):
        assert share == order[rank::world]
    loader = DataLoader(samplers[1].dataset, batch_size=6, sampler=samplers[1], num_workers=2)
    samplers[1].set_epoch(0)
    rows = [row for batch in loader for row in batch]
    assert all(torch.equal(r, sample(files, i)) for r, i in zip(rows, shares[1], strict=True))
    requests.delete(f"{url}/plans/{samplers[0].plan_id}", timeout=30)


def distributed_rank(rank: int, url: str, store: str, out: str) -> None:
    """One rank of a torch.distributed (gloo) job: its sampler, from the group alone."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        sampler = PlannedSampler(ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS),
                                 seed=6)
        share = [int(i) for i in sampler]
        dist.barrier()  # both have registered before either drops anything
        Path(out).write_text(json.dumps({"rank": sampler.rank, "world": sampler.world_size,
                                         "job": sampler.job, "plan": sampler.plan_id,
                                         "share": share, "order": sampler.order(0)}))
    finally:
        dist.destroy_process_group()


def test_under_torch_distributed_the_ranks_find_their_place_and_one_plan(
    servers: tuple[str, str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, _, _ = servers
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=distributed_rank,
                         args=(r, url, str(tmp_path / "store"), str(outs[r])))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    ranks = [json.loads(o.read_text()) for o in outs]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    # The job's name was drawn by rank 0 and sent to rank 1: one plan for both.
    assert ranks[0]["job"] == ranks[1]["job"] and ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["plan"] in plans(url)
    order = ranks[0]["order"]
    assert ranks[0]["share"] == order[0::2] and ranks[1]["share"] == order[1::2]
    requests.delete(f"{url}/plans/{ranks[0]['plan']}", timeout=30)


def test_shard_aware_reads_a_window_of_chunks_at_a_time(
    servers: tuple[str, str, dict[str, bytes]]
) -> None:
    url, _, files = servers
    dataset = ShardedSamples(url, prefix="tok/", tokens_per_sample=TOKENS)
    sampler = PlannedSampler(dataset, seed=2, shard_aware=True, window=2, chunk_size=CHUNK,
                             lookahead=0)
    order = list(sampler)
    per_chunk = CHUNK // SAMPLE_BYTES
    chunks = [(i // PER_SHARD, (i % PER_SHARD) // per_chunk) for i in order]
    assert sorted(int(i) for i in order) == list(range(N))
    # Each run of 2 chunks' samples (16) comes from exactly 2 chunks (of 9: the last, 1).
    runs = [set(chunks[start:start + 2 * per_chunk]) for start in range(0, N, 2 * per_chunk)]
    assert [len(r) for r in runs] == [2, 2, 2, 2, 1]
    assert plans(url)[str(sampler.plan_id)]["chunk_reads"] == N
    rows = [row for batch in DataLoader(dataset, batch_size=8, sampler=sampler) for row in batch]
    second = sampler.order(1)
    assert all(torch.equal(r, sample(files, i)) for r, i in zip(rows, second, strict=True))
    requests.delete(f"{url}/plans/{sampler.plan_id}", timeout=30)


def test_an_endpoint_without_plans_reads_plainly(
    servers: tuple[str, str, dict[str, bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    _, hub, files = servers
    dataset = ShardedSamples(hub, prefix="tok/", tokens_per_sample=TOKENS)
    with caplog.at_level(logging.WARNING):
        sampler = PlannedSampler(dataset, seed=3)
        rows = [row for batch in DataLoader(dataset, batch_size=8, sampler=sampler,
                                            num_workers=2) for row in batch]
    assert sampler.plan_id is None and "reading without one" in caplog.text
    assert all(torch.equal(r, sample(files, i)) for r, i in zip(rows, sampler.order(0),
                                                                 strict=True))
