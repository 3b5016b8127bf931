"""A hub over a store reached by HTTPS answers a spoke's chunk fills on the fast path
from a store thread, byte for byte as aiohttp's handler answers them: the loop's own
store connections are plain HTTP only, and a TLS body cannot be spliced, so the thread
relays it through its buffer."""

from __future__ import annotations

from pathlib import Path

from hub.handlers import BACKEND
from hub.store.s3 import S3Backend
from loadtest.s3_stores import S3Store
from tests.hub_s3.conftest import CHUNK, Bucket, noted_store_hub
from tests.hub_s3.test_s3_fills import BIG, etag_of, fill, head_and_body


async def test_fills_from_a_store_over_tls_are_answered_on_the_fast_path_from_a_thread(
    tls_store: S3Store, bucket: Bucket, tmp_path: Path
) -> None:
    assert tls_store.url.startswith("https://")
    data = bucket.contents[BIG]
    async with noted_store_hub(tls_store.url, tls_store, tmp_path) as hub:
        backend = hub.server.app[BACKEND]
        assert isinstance(backend, S3Backend) and backend.loop_gets is None
        etag = await etag_of(hub, BIG)
        for start, stop in [(0, 1), (CHUNK, 2 * CHUNK), (1000, len(data)),
                            (len(data) - 5, len(data) + 100)]:
            fast = await head_and_body(hub.url, fill(BIG, etag, start, stop))
            assert await hub.took() == [True], (start, stop)
            slow = await head_and_body(hub.url, fill(BIG, etag, start, stop, "X-Not: 1"))
            assert await hub.took() == [False]
            assert fast == slow, (start, stop)
            assert fast[0][0] == "HTTP/1.1 206 Partial Content"
            assert fast[1] == data[start:stop], (start, stop)
