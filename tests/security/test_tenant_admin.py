"""Tenant boundaries on the spoke's admin and plan endpoints.

Warm prefixes match whole segments and warmed bytes count against the warming tenant's
quota; ``/stats`` shows an admin only the bytes of objects its token covers; a read plan
(and a warm job) belongs to the tenant that made it, and is a 404 to anyone else.
"""

from __future__ import annotations

import json

import aiohttp

from tests.conftest import CHUNK, FILES
from tests.security.conftest import AuthSpokeFactory, Dataset, Mint, call, problem
from tests.support.waits import settled_stats, wait_warm

DS_BYTES = sum(size for path, size in FILES.items() if path.startswith("ds/"))


async def test_warm_prefix_matches_whole_segments_and_books_the_warming_tenant(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession,
    dataset: Dataset,
) -> None:
    root, _ = dataset
    (root / "dsbank").mkdir()
    (root / "dsbank" / "vault.bin").write_bytes(b"v" * 5000)  # "ds" as a string prefix
    spoke = await make_auth_spoke(tenant_quota_bytes=8 * CHUNK)
    admin = mint("team-d", ["ds/"], admin=True)
    status, _, body = await call(http, f"{spoke.url}/warm", admin, "POST", json={"prefix": "ds"})
    assert status == 202, body
    job = await wait_warm(http, spoke.url, json.loads(body)["id"], admin)
    assert job["bytes_total"] == DS_BYTES, job  # not dsbank/vault.bin
    everything = mint("ops", [""], admin=True)
    stats = await settled_stats(http, spoke.url, headers={"Authorization": f"Bearer {everything}"})
    # Booked to the tenant that warmed, and so held to its quota; nothing to tenant "".
    assert set(stats["tenant_bytes"]) == {"team-d"}, stats["tenant_bytes"]
    assert 0 < stats["tenant_bytes"]["team-d"] <= 8 * CHUNK
    assert stats["quota_evictions"] > 0


async def test_stats_shows_an_admin_only_the_bytes_under_its_prefixes(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_auth_spoke()
    assert (await call(http, f"{spoke.url}/objects/ds/small.bin", mint("a", ["ds/"])))[0] == 200
    assert (await call(http, f"{spoke.url}/objects/other/notes.csv",
                       mint("b", ["other/"])))[0] == 200
    b_admin = mint("b", ["other/"], admin=True)
    stats = await settled_stats(http, spoke.url, headers={"Authorization": f"Bearer {b_admin}"})
    assert stats["tenant_bytes"] == {"b": 3000}
    everything = mint("ops", [""], admin=True)
    stats = await settled_stats(http, spoke.url, headers={"Authorization": f"Bearer {everything}"})
    assert stats["tenant_bytes"] == {"a": 1000, "b": 3000}


async def test_a_plan_is_a_404_to_every_other_tenant(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_auth_spoke()
    # Both read ds/: only the tenant differs.
    owner, other = mint("a", ["ds/"], admin=True), mint("b", ["ds/"], admin=True)
    reads = [["ds/big.bin", i * CHUNK, 100] for i in range(10)]
    status, _, body = await call(http, f"{spoke.url}/plans", owner, "POST", json={"reads": reads})
    assert status == 201, body
    plan_id = json.loads(body)["id"]
    await assert_hidden(http, f"{spoke.url}/plans", plan_id, other)
    # Another tenant's reads naming the plan do not move its cursor.
    status, _, _ = await call(http, f"{spoke.url}/objects/ds/big.bin", other,
                              headers={"Range": f"bytes={5 * CHUNK}-{5 * CHUNK + 99}",
                                       "X-Hubspoke-Plan": plan_id})
    assert status == 206
    status, _, body = await call(http, f"{spoke.url}/plans/{plan_id}", owner)
    assert status == 200 and json.loads(body)["cursor"] == 0
    status, _, body = await call(http, f"{spoke.url}/plans", owner)
    assert [p["id"] for p in json.loads(body)["plans"]] == [plan_id]
    assert (await call(http, f"{spoke.url}/plans/{plan_id}", owner, "DELETE"))[0] == 200


async def test_a_warm_job_is_a_404_to_every_other_tenant(
    make_auth_spoke: AuthSpokeFactory, mint: Mint, http: aiohttp.ClientSession,
) -> None:
    spoke = await make_auth_spoke()
    owner, other = mint("a", ["ds/"], admin=True), mint("b", ["ds/"], admin=True)
    status, _, body = await call(http, f"{spoke.url}/warm", owner, "POST",
                                 json={"paths": ["ds/small.bin"]})
    assert status == 202, body
    job_id = json.loads(body)["id"]
    await assert_hidden(http, f"{spoke.url}/warm", job_id, other)
    assert (await wait_warm(http, spoke.url, job_id, owner))["state"] == "done"


async def assert_hidden(
    http: aiohttp.ClientSession, collection: str, item_id: str, other: str
) -> None:
    """To ``other``'s token item ``item_id`` of ``collection`` does not exist: 404 to
    reads and deletes, and absent from the listing."""
    for method in ("GET", "DELETE"):
        problem(await call(http, f"{collection}/{item_id}", other, method), 404)
    status, _, body = await call(http, collection, other)
    listed = json.loads(body)
    assert status == 200 and [v for v in listed.values() if v] == [], listed
