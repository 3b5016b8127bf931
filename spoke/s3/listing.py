"""Bucket operations over the hub's listing (what the spoke's ``/list`` relays).

The hub lists every object under a path prefix; S3's pages, delimiters and markers
are cut from that here (:func:`protocol.s3.requests.list_page`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack
from aiohttp import web

from protocol.s3 import xml
from protocol.s3.credentials import S3Key
from protocol.s3.errors import AccessDenied, NoSuchBucket
from protocol.s3.requests import Entry, ListParams, buckets, list_page
from service.listing import MSGPACK
from spoke.s3.access import check_listing, sees_bucket
from spoke.serve import handlers
from spoke.upstream.errors import BadGateway

REGION = "us-east-1"
# How long a bucket's existence is taken as known: it only decides whether a 404 says
# NoSuchBucket or NoSuchKey, and buckets come and go far more rarely than objects.
BUCKET_TTL_S = 300.0
REGION_HEADER = "x-amz-bucket-region"


class RecentListings:
    """The hub's last few listings, each kept ``ttl_s``: a client paging through a
    bucket a thousand keys at a time asks for the same listing once per page, and each
    would otherwise cross the WAN in full."""

    MAX_KEPT = 4

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._kept: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    async def get(self, main: web.Application, prefix: str) -> list[dict[str, Any]]:
        kept = self._kept.get(prefix)
        if kept is not None and kept[0] > self._clock():
            return kept[1]
        entries = await hub_listing(main, prefix)
        self._kept.pop(prefix, None)
        while len(self._kept) >= self.MAX_KEPT:
            del self._kept[next(iter(self._kept))]
        self._kept[prefix] = (self._clock() + self.ttl_s, entries)
        return entries



async def hub_listing(main: web.Application, prefix: str) -> list[dict[str, Any]]:
    """The hub's entries under object path ``prefix`` (``path``, ``size``, ``etag``)."""
    body, content_type = await main[handlers.CACHE].hub.fetch_list(prefix, MSGPACK)
    try:
        doc = msgpack.unpackb(body, raw=False) if content_type == MSGPACK else None
    except Exception:  # msgpack raises many types for bad input
        doc = None
    objects = doc.get("objects") if isinstance(doc, dict) else None
    if not isinstance(objects, list):
        raise BadGateway("the hub's listing is not a msgpack map of objects")
    # Entries that are not what a hub lists are left out, never a 500.
    return [o for o in objects if isinstance(o, dict) and isinstance(o.get("path"), str)
            and type(o.get("size")) is int]


class KnownBuckets:
    """Whether a bucket exists, as the hub's listing said at most ``ttl_s`` ago: a 404
    tells NoSuchBucket from NoSuchKey, and a flood of them lists each bucket once."""

    MAX_REMEMBERED = 1024

    def __init__(
        self, ttl_s: float, listings: RecentListings, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.listings = listings
        self._clock = clock
        self._seen: dict[str, tuple[float, bool]] = {}

    def known(self, bucket: str) -> bool:
        """Whether ``bucket`` was seen to exist, ``ttl_s`` ago at most."""
        known = self._seen.get(bucket)
        return known is not None and known[1] and known[0] > self._clock()

    async def exists(self, main: web.Application, bucket: str) -> bool:
        known = self._seen.get(bucket)
        if known is not None and known[0] > self._clock():
            return known[1]
        found = bool(await self.listings.get(main, f"{bucket}/"))
        self.saw(bucket, found)
        return found

    def saw(self, bucket: str, exists: bool = True) -> None:
        """A listing showed whether ``bucket`` exists."""
        if len(self._seen) >= self.MAX_REMEMBERED:
            self._seen.clear()
        self._seen[bucket] = (self._clock() + self.ttl_s, exists)


BUCKETS = web.AppKey("s3_buckets", KnownBuckets)


def _xml(body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, content_type=xml.XML_TYPE, charset="utf-8",
                        headers=headers or {})


def _check_bucket(key: S3Key | None, bucket: str) -> None:
    if not sees_bucket(key, bucket):
        raise AccessDenied(f"the key's prefixes do not reach into bucket {bucket!r}")


async def list_objects(
    main: web.Application, known: KnownBuckets, bucket: str, params: ListParams,
    key: S3Key | None,
) -> web.Response:
    base = f"{bucket}/"
    check_listing(key, base + params.prefix)
    found = await known.listings.get(main, base + params.prefix)
    if found:
        known.saw(bucket)
    elif not await known.exists(main, bucket):
        raise NoSuchBucket(f"no bucket {bucket!r}")
    entries = (
        Entry(o["path"][len(base):], o["size"], str(o.get("etag", "")))
        for o in found if o["path"].startswith(base) and (key is None or key.allows(o["path"]))
    )
    page = list_page(entries, params)
    return _xml(xml.list_bucket_result(bucket, params, page))


async def list_buckets(
    main: web.Application, known: KnownBuckets, key: S3Key | None
) -> web.Response:
    found = await known.listings.get(main, "")
    names = [b for b in buckets([o["path"] for o in found]) if sees_bucket(key, b)]
    return _xml(xml.list_all_my_buckets(names))


async def head_bucket(
    main: web.Application, known: KnownBuckets, bucket: str, key: S3Key | None
) -> web.Response:
    _check_bucket(key, bucket)
    if not await known.exists(main, bucket):
        raise NoSuchBucket(f"no bucket {bucket!r}")
    return web.Response(headers={REGION_HEADER: REGION})


async def bucket_location(
    main: web.Application, known: KnownBuckets, bucket: str, key: S3Key | None
) -> web.Response:
    _check_bucket(key, bucket)
    if not await known.exists(main, bucket):
        raise NoSuchBucket(f"no bucket {bucket!r}")
    return _xml(xml.location_constraint(REGION))
