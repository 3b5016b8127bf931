"""What a spoke takes from a hub's /healthz answer: its chunk size, or nothing."""

from __future__ import annotations

import pytest

from spoke.upstream.hub import healthz_chunk_size


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"status": "ok", "chunk_size": 4194304}', 4194304),
        (b'{"chunk_size": 1}', 1),
        (b'{"status": "ok"}', None),  # a hub from before the field
        (b'{"status": "ok", "chunk_size": 0}', None),
        (b'{"status": "ok", "chunk_size": -4096}', None),
        (b'{"status": "ok", "chunk_size": 4.5}', None),
        (b'{"status": "ok", "chunk_size": "4MiB"}', None),
        (b'{"status": "ok", "chunk_size": true}', None),
        (b'{"status": "ok", "chunk_size": null}', None),
        (b'[4194304]', None),
        (b'4194304', None),
        (b"ok", None),
        (b"", None),
        (b"\xff\xfe", None),
    ],
)
def test_only_a_positive_integer_is_taken(body: bytes, expected: int | None) -> None:
    assert healthz_chunk_size(body) == expected
