"""One request to a hub or spoke through aiohttp, and what tests read back from it.

Each returns what came and asserts only what every caller needs (a JSON or text
answer where one is asked for), so that a test's own asserts say what it checks.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families

Response = tuple[int, CIMultiDictProxy[str], bytes]


async def fetch(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
    method: str = "GET",
) -> Response:
    """Status, fields and the whole body of one request."""
    async with http.request(method, url, headers=headers or {}) as resp:
        return resp.status, resp.headers, await resp.read()


def assert_problem(response: Response, code: int) -> dict[str, object]:
    """The problem+json body of ``response``, after checking its status and its fields."""
    status, headers, body = response
    assert status == code, body
    assert headers["Content-Type"].split(";")[0] == "application/problem+json"
    problem = json.loads(body)
    assert problem["status"] == code
    assert isinstance(problem["title"], str) and problem["title"]
    assert isinstance(problem["detail"], str) and problem["detail"]
    assert isinstance(problem, dict)
    return problem


async def stats(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The spoke's ``/stats`` as it is now (see ``tests.support.waits`` to wait for a state)."""
    status, fields, body = await fetch(http, f"{url}/stats", headers)
    assert status == 200, body
    assert fields["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert isinstance(doc, dict)
    return doc


def blocking_stats(url: str) -> dict[str, Any]:
    """:func:`stats` without an aiohttp session (for ``asyncio.to_thread``)."""
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as reply:
        doc = json.loads(reply.read())
    assert isinstance(doc, dict)
    return doc


async def scrape(http: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """Every sample of ``/metrics``, by sample name (counters keep their ``_total``)."""
    status, headers, body = await fetch(http, f"{base_url}/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[sample.name] = sample.value
    return samples


async def metric_samples(http: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
    """Every ``/metrics`` sample, by name and labels (``name{label="value"}``)."""
    async with http.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    return {
        s.name + "".join(f'{{{k}="{v}"}}' for k, v in sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


async def metric(http: aiohttp.ClientSession, base_url: str, sample: str) -> float:
    """The first sample named ``sample`` of ``/metrics`` (e.g. ``hub_bytes_sent_total``)."""
    async with http.get(f"{base_url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample:
                return s.value
    raise AssertionError(f"{sample} missing from {base_url}/metrics")
