"""A hub over a store reached by HTTPS (rclone with a certificate of a test CA) answers
a spoke's chunk fills on the fast path from a store thread, byte for byte as aiohttp's
handler answers them: the loop's own store connections are plain HTTP only, and a TLS
body cannot be spliced, so the thread relays it through its buffer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from hub.handlers import BACKEND
from hub.store.s3 import S3Backend
from loadtest.s3_stores import S3Store, start_rclone_s3
from tests.hub_s3.conftest import BUCKET, PREFIX, noted_store_hub
from tests.hub_s3.test_s3_fills import etag_of, fill, head_and_body
from tests.security.test_tls import issue

PATH = "ds/tls.bin"
DATA = bytes(range(251)) * 12_000  # about 3 MiB, several relay buffers


@pytest.fixture
def tls_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    pki = issue(trustme.CA(), tmp_path / "pki", "127.0.0.1")
    objects = tmp_path / "store" / BUCKET / PREFIX / "ds"
    objects.mkdir(parents=True)
    (objects / "tls.bin").write_bytes(DATA)
    # The standard variable botocore trusts a private CA by.
    monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca_file))
    store = start_rclone_s3(str(tmp_path / "store"), log_dir=str(tmp_path),
                            tls=(str(pki.cert_file), str(pki.key_file)))
    yield store
    store.stop()


async def test_fills_from_a_store_over_tls_are_answered_on_the_fast_path_from_a_thread(
    tls_store: S3Store, tmp_path: Path
) -> None:
    assert tls_store.url.startswith("https://")
    async with noted_store_hub(tls_store.url, tls_store, tmp_path) as hub:
        backend = hub.server.app[BACKEND]
        assert isinstance(backend, S3Backend) and backend.loop_gets is None
        etag = await etag_of(hub, PATH)
        for start, stop in [(0, 1), (65_536, 131_072), (1000, len(DATA)),
                            (len(DATA) - 5, len(DATA) + 100)]:
            fast = await head_and_body(hub.url, fill(PATH, etag, start, stop))
            assert await hub.took() == [True], (start, stop)
            slow = await head_and_body(hub.url, fill(PATH, etag, start, stop, "X-Not: 1"))
            assert await hub.took() == [False]
            assert fast == slow, (start, stop)
            assert fast[0][0] == "HTTP/1.1 206 Partial Content"
            assert fast[1] == DATA[start:stop], (start, stop)
