"""Hypothesis: any GET botocore signs on any key verifies, and any single mutation fails."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.s3.sigv4 import S3AuthError
from tests.protocol.s3.botocore_signed import Wire, client, presigned, signed
from tests.protocol.s3.test_sigv4_botocore import AK, BUCKET, MUTATIONS, SECRET, verify

SETTINGS = settings(max_examples=150, deadline=None, database=None)

# Any Unicode but lone surrogates (not encodable, so no client can send them) and NUL.
characters = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
segments = st.text(characters, min_size=1, max_size=12)
object_keys = st.lists(segments, min_size=1, max_size=6).map("/".join)
query_text = st.text(characters, max_size=16)


def _build(kind: str, key: str, extra: str) -> Wire:
    c = client(AK, SECRET)
    if kind == "get":
        return signed(lambda: c.get_object(Bucket=BUCKET, Key=key, Range="bytes=0-9"))
    if kind == "head":
        return signed(lambda: c.head_object(Bucket=BUCKET, Key=key))
    if kind == "list":
        return signed(lambda: c.list_objects_v2(
            Bucket=BUCKET, Prefix=key, StartAfter=extra, ContinuationToken=extra or "t",
        ))
    return presigned(c.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=900,
    ))


kinds = st.sampled_from(["get", "head", "list", "presigned"])


@SETTINGS
@given(kind=kinds, key=object_keys, extra=query_text)
def test_any_signed_request_verifies(kind: str, key: str, extra: str) -> None:
    wire = _build(kind, key, extra)
    assert verify(wire).access_key == AK


@SETTINGS
@given(kind=kinds, key=object_keys, extra=query_text, mutation=st.sampled_from(sorted(MUTATIONS)))
def test_any_single_mutation_fails(kind: str, key: str, extra: str, mutation: str) -> None:
    wire = _build(kind, key, extra)
    mutate, code = MUTATIONS[mutation]
    with pytest.raises(S3AuthError) as caught:
        verify(mutate(wire), wire.signed_at())
    assert caught.value.code == code


@SETTINGS
@given(kind=kinds, key=object_keys, offset_s=st.integers(min_value=901, max_value=10**7))
def test_a_clock_far_ahead_fails(kind: str, key: str, offset_s: int) -> None:
    wire = _build(kind, key, "")
    with pytest.raises(S3AuthError) as caught:
        verify(wire, wire.signed_at() + datetime.timedelta(seconds=offset_s))
    assert caught.value.code == ("AccessDenied" if kind == "presigned" else "RequestTimeTooSkewed")
