"""POST /plans with a job name: the ranks of one job share one plan."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import CHUNK, SpokeFactory
from tests.support.servers import write_dataset

SAMPLE = 16 * 1024
SHARDS = {f"jobs/shard-{i}.bin": 4 * CHUNK for i in range(2)}


@pytest.fixture
def shards(dataset: tuple[Path, dict[str, bytes]]) -> dict[str, bytes]:
    return write_dataset(str(dataset[0]), SHARDS, seed=3)


def reads() -> list[list[object]]:
    return [[path, i * SAMPLE, SAMPLE] for path, size in SHARDS.items()
            for i in range(size // SAMPLE)]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, object],
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    async with http.post(f"{url}/plans", json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_ranks_naming_one_job_share_one_plan(
    make_spoke: SpokeFactory, shards: dict[str, bytes], http: aiohttp.ClientSession
) -> None:
    spoke = await make_spoke()
    # Four ranks register at once: one plan is made, every rank gets its id.
    answers = await asyncio.gather(*(post(http, spoke.url, {"reads": reads(), "job": "run-7/e0"})
                                     for _ in range(4)))
    assert {a[1]["id"] for a in answers} == {answers[0][1]["id"]}
    assert 201 in {a[0] for a in answers} and {a[0] for a in answers} <= {200, 201}
    async with http.get(f"{spoke.url}/plans") as resp:
        assert [p["id"] for p in (await resp.json())["plans"]] == [answers[0][1]["id"]]
    # Once made, a rank's registration is answered with the plan as it stands.
    assert await post(http, spoke.url, {"reads": reads(), "job": "run-7/e0"}) \
        == (200, answers[0][1])
    # Another job, or no job at all, is another plan.
    other = await post(http, spoke.url, {"reads": reads(), "job": "run-7/e1"})
    anonymous = await post(http, spoke.url, {"reads": reads()})
    assert other[0] == anonymous[0] == 201
    assert len({answers[0][1]["id"], other[1]["id"], anonymous[1]["id"]}) == 3
    async with http.delete(f"{spoke.url}/plans/{answers[0][1]['id']}") as resp:
        assert resp.status == 200
    again = await post(http, spoke.url, {"reads": reads(), "job": "run-7/e0"})
    assert again[0] == 201 and again[1]["id"] == answers[0][1]["id"]  # made afresh


@pytest.mark.parametrize("job", ["", "x" * 201, "a b", "é", 7, ["run"], "run\n"])
async def test_a_bad_job_name_is_400(make_spoke: SpokeFactory, shards: dict[str, bytes],
                                     http: aiohttp.ClientSession, job: object) -> None:
    spoke = await make_spoke()
    async with http.post(f"{spoke.url}/plans", json={"reads": reads(), "job": job}) as resp:
        assert resp.status == 400
        assert resp.content_type == "application/problem+json"
        assert "job" in (await resp.json())["detail"]


def test_a_jobs_epochs_are_one_series_of_plans() -> None:
    from protocol.plan_request import job_series

    assert job_series("run-42/e3") == job_series("run-42/e4") == "run-42"
    assert job_series("a/b/e0") == "a/b"
    assert job_series("solo") == "solo"
    assert job_series("/e1") == "/e1"  # nothing before the slash: not a series name
