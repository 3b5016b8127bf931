"""Header names of hubspoke's own protocol extensions."""

from __future__ import annotations

# On a read: the id of the read plan (POST /plans) this read follows.
PLAN_HEADER = "X-Hubspoke-Plan"
# On any request and its answer: ties a loader's request to the spoke's and hub's logs.
REQUEST_ID_HEADER = "X-Request-Id"
# On a spoke's answer: HIT, MISS or PARTIAL.
CACHE_HEADER = "X-Cache"
# On a spoke's answer from its cache while the hub is unreachable.
STALE_HEADER = "X-Cache-Stale"
# On every answer of both servers: one name, so a loader cannot tell them apart by it.
SERVER = "hubspoke"
