"""The memo of verified requests changes no answer: only how often a signature is computed.

A presigned URL read again and again is verified once; every later read is the clock and
a comparison. These tests hold the memo to that: a remembered URL still expires to the
second, a remembered URL with any byte changed is judged as if never seen, and what it
does not sign (a Range, an SDK's invocation id) does not cost a verification.
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import pytest

from protocol.http1 import Headers
from protocol.s3 import sigv4
from protocol.s3.credentials import S3Key
from protocol.s3.sigv4 import S3AuthError, authenticate
from tests.protocol.s3.botocore_signed import Wire, client, presigned, signed

AK = "AKIAHUBSPOKETEST0001"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
KEYS = {AK: S3Key(AK, SECRET, ("",))}
EXPIRES_S = 600


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing remembered, whatever ran before."""
    monkeypatch.setattr(sigv4, "_VERIFIED", {})


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests whose signature was computed (memo misses)."""
    seen: list[str] = []
    real = sigv4._verify

    def counting(method: str, path: str, *args: Any) -> Any:
        seen.append(path)
        return real(method, path, *args)

    monkeypatch.setattr(sigv4, "_verify", counting)
    return seen


def url_wire(key: str = "ds/a.bin", expires_s: int = EXPIRES_S) -> Wire:
    bucket, name = key.split("/", 1)
    return presigned(client(AK, SECRET).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": name}, ExpiresIn=expires_s))


def check(wire: Wire, now: datetime.datetime) -> S3Key:
    return authenticate(wire.method, wire.path, wire.query, wire.headers, KEYS, now)


def outcome(wire: Wire, now: datetime.datetime) -> str:
    try:
        return check(wire, now).access_key
    except S3AuthError as exc:
        return exc.code


def test_a_remembered_url_still_expires_to_the_second(verifications: list[str]) -> None:
    wire = url_wire()
    at = wire.signed_at()
    assert check(wire, at).access_key == AK
    # Remembered from here on: the last second of its life still reads...
    assert check(wire, at + datetime.timedelta(seconds=EXPIRES_S)).access_key == AK
    assert len(verifications) == 1
    # ... and the next one, a fraction of it included, does not.
    for late_s in (EXPIRES_S + 0.001, EXPIRES_S + 1, 7 * 86400):
        with pytest.raises(S3AuthError) as caught:
            check(wire, at + datetime.timedelta(seconds=late_s))
        assert caught.value.code == "AccessDenied"
        assert "expired" in str(caught.value)
    # Before its date (past the skew) it is not valid yet, remembered or not.
    with pytest.raises(S3AuthError) as caught:
        check(wire, at - datetime.timedelta(seconds=sigv4.DEFAULT_MAX_SKEW_S + 1))
    assert "not valid yet" in str(caught.value)
    assert len(verifications) == 1  # all of it from the memo: only the clock said no
    assert check(wire, at).access_key == AK


def test_a_remembered_header_signature_still_goes_stale() -> None:
    wire = signed(lambda: client(AK, SECRET).get_object(Bucket="ds", Key="a.bin"))
    at = wire.signed_at()
    assert check(wire, at).access_key == AK
    skew = datetime.timedelta(seconds=sigv4.DEFAULT_MAX_SKEW_S + 1)
    for now in (at + skew, at - skew):
        with pytest.raises(S3AuthError) as caught:
            check(wire, now)
        assert caught.value.code == "RequestTimeTooSkewed"


def test_a_naive_clock_reads_as_utc() -> None:
    wire = url_wire(expires_s=60)
    naive = wire.signed_at().replace(tzinfo=None)
    assert check(wire, naive + datetime.timedelta(seconds=60)).access_key == AK
    with pytest.raises(S3AuthError):
        check(wire, naive + datetime.timedelta(seconds=61))


def _mutations(text: str) -> list[str]:
    """``text`` with each character in turn replaced by another that could be there."""
    out = []
    for at, char in enumerate(text):
        other = "0" if char != "0" else "1"
        if char in "&=%":  # the query's structure: another structure character
            other = {"&": "=", "=": "&", "%": "A"}[char]
        out.append(text[:at] + other + text[at + 1:])
    return out


def test_every_changed_byte_of_a_remembered_url_is_judged_afresh() -> None:
    wire = url_wire("ds/train/shard-0001.tar")
    at = wire.signed_at()
    assert check(wire, at).access_key == AK  # remembered
    mutated = [replace(wire, query=q) for q in _mutations(wire.query)]
    mutated += [replace(wire, path=p) for p in _mutations(wire.path)[1:]]
    mutated += [replace(wire, method="HEAD"), wire.with_header("Host", "127.0.0.1:9001")]
    warm = [outcome(w, at) for w in mutated]
    sigv4._VERIFIED.clear()
    cold = [outcome(w, at) for w in mutated]
    assert warm == cold
    assert AK not in warm  # (no escape to write another way: every change is another request)
    assert check(wire, at).access_key == AK


def test_a_second_carrier_on_a_remembered_url_is_refused() -> None:
    wire = url_wire()
    at = wire.signed_at()
    assert check(wire, at).access_key == AK
    header = signed(lambda: client(AK, SECRET).get_object(Bucket="ds", Key="a.bin"))
    both = wire.with_header("Authorization", header.header("Authorization"))
    with pytest.raises(S3AuthError) as caught:
        check(both, at)
    assert caught.value.code == "InvalidArgument"


def test_unsigned_fields_cost_no_second_verification(verifications: list[str]) -> None:
    wire = url_wire()
    at = wire.signed_at()
    for first in range(0, 64 << 10, 4096):
        read = wire.with_header("Range", f"bytes={first}-{first + 4095}")
        read = read.with_header("amz-sdk-invocation-id", f"id-{first}")
        assert check(read, at).access_key == AK
    assert verifications == [wire.path]
    # Another URL, and the first one again: one more verification, then none.
    other = url_wire("ds/b.bin")
    for w in (other, wire, other):
        assert check(w, at).access_key == AK
    assert verifications == [wire.path, other.path]


def test_a_signed_header_that_changes_is_verified_again(verifications: list[str]) -> None:
    wire = signed(lambda: client(AK, SECRET).get_object(
        Bucket="ds", Key="a.bin", Range="bytes=0-9"))
    at = wire.signed_at()
    assert check(wire, at).access_key == AK
    assert check(wire, at).access_key == AK
    assert len(verifications) == 1
    with pytest.raises(S3AuthError) as caught:
        check(wire.with_header("Range", "bytes=0-99"), at)  # signed: a new request
    assert caught.value.code == "SignatureDoesNotMatch"
    assert len(verifications) == 2
    assert check(wire, at).access_key == AK


def _fast_fields(wire: Wire) -> Headers:
    """``wire``'s fields as a fast path's head reader gives them: by lower-case name."""
    return Headers({name.lower(): value for name, value in wire.headers})


def test_a_kept_verdict_holds_for_the_same_request_in_date_only(
    verifications: list[str],
) -> None:
    wire = url_wire()
    at = wire.signed_at().timestamp()
    seen = sigv4.verified(wire.method, wire.path, wire.query, wire.headers, KEYS, at)
    fields = _fast_fields(wire)
    skew = sigv4.DEFAULT_MAX_SKEW_S
    assert seen.key is KEYS[AK]
    # In date: from a skew before its date to its last second, exactly.
    for now in (at, at + EXPIRES_S, at - skew):
        assert seen.holds("GET", fields, KEYS, now)
    for now in (at + EXPIRES_S + 0.001, at + EXPIRES_S + 1, at - skew - 0.001):
        assert not seen.holds("GET", fields, KEYS, now)
    # What it does not sign changes nothing; what it signs, or reads, is another request.
    assert seen.holds("GET", Headers({**fields, "range": "bytes=0-9"}), KEYS, at)
    for method, other in (
        ("HEAD", fields),
        ("GET", Headers({**fields, "host": "127.0.0.1:9001"})),
        ("GET", Headers({k: v for k, v in fields.items() if k != "host"})),
        ("GET", Headers({**fields, "authorization": "AWS4-HMAC-SHA256 Credential=x"})),
        ("GET", Headers({**fields, "x-amz-date": "20261201T000000Z"})),
        ("GET", Headers({**fields, "x-amz-content-sha256": sigv4.EMPTY_SHA256})),
    ):
        assert not seen.holds(method, other, KEYS, at), (method, other)
    # The same key (equal, or the very one) and no other: not another secret, nor none.
    assert seen.holds("GET", fields, {AK: S3Key(AK, SECRET, ("",))}, at)
    assert not seen.holds("GET", fields, {AK: S3Key(AK, SECRET + "x", ("",))}, at)
    assert not seen.holds("GET", fields, {AK: S3Key(AK, SECRET, ("ds/other",))}, at)
    assert not seen.holds("GET", fields, {}, at)
    assert len(verifications) == 1  # holds() computes no signature


def test_a_kept_header_verdict_holds_within_the_skew_both_ways() -> None:
    wire = signed(lambda: client(AK, SECRET).get_object(Bucket="ds", Key="a.bin"))
    at = wire.signed_at().timestamp()
    seen = sigv4.verified(wire.method, wire.path, wire.query, wire.headers, KEYS, at)
    fields = _fast_fields(wire)
    skew = sigv4.DEFAULT_MAX_SKEW_S
    for now in (at - skew, at, at + skew):
        assert seen.holds("GET", fields, KEYS, now)
    for now in (at - skew - 0.001, at + skew + 0.001):
        assert not seen.holds("GET", fields, KEYS, now)
    # A field botocore does not sign: no matter.
    assert seen.holds("GET", Headers({**fields, "amz-sdk-request": "attempt=2"}), KEYS, at)


def test_a_kept_verdict_never_holds_where_authenticate_refuses() -> None:
    """Whatever holds() lets by, authenticate() lets by too: clocks about the edges,
    each field changed, another method."""
    wire = url_wire(expires_s=60)
    at = wire.signed_at().timestamp()
    seen = sigv4.verified(wire.method, wire.path, wire.query, wire.headers, KEYS, at)
    skew = sigv4.DEFAULT_MAX_SKEW_S
    clocks = [at + d for d in (-skew - 1, -skew, -1, 0, 59.5, 60, 60.001, 61, 3600)]
    variants = [("GET", wire), ("HEAD", replace(wire, method="HEAD"))]
    variants += [("GET", wire.with_header(name, value)) for name, value in (
        ("Host", "evil.example"), ("Range", "bytes=0-0"), ("X-Amz-Date", "20261201T000000Z"),
    )]
    held = 0
    for now in clocks:
        for method, variant in variants:
            try:
                authenticate(variant.method, variant.path, variant.query, variant.headers,
                             KEYS, now)
                good = True
            except S3AuthError:
                good = False
            if seen.holds(method, _fast_fields(variant), KEYS, now):
                assert good, (now - at, method, variant.headers)
                held += 1
    assert held == 5 * 2  # in date (5 clocks), as signed or with a Range (2 variants)
