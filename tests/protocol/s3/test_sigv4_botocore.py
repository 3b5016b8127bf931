"""protocol.s3.sigv4 verifies what real botocore signs, and refuses every mutation of it.

botocore's S3 client signs GetObject, HeadObject and ListObjectsV2 (header SigV4) and presigns
GetObject URLs, over keys that exercise the encoding rules: unicode, spaces, '+', '=', '~',
'%', deep paths, '//' and names that look like '..'. Each signed request verifies; each
mutation (the signature, the path, a signed header, the date, the key id, the clock) is
refused with S3's exact error code.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from protocol.s3.credentials import S3Key
from protocol.s3.sigv4 import EMPTY_SHA256, S3AuthError, authenticate, is_signed
from tests.protocol.s3.botocore_signed import Wire, client, presigned, signed

AK = "AKIAHUBSPOKETEST0001"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
OTHER_AK = "AKIAHUBSPOKETEST0002"
KEYS = {
    AK: S3Key(AK, SECRET, ("",)),
    OTHER_AK: S3Key(OTHER_AK, "another-secret-of-enough-bytes", ("",)),
}
OBJECT_KEYS = [
    "a.bin",
    "train/shard-0001.tar",
    "deep/" * 12 + "leaf.bin",
    "with space/and more  spaces.bin",
    "plus+sign/a+b.bin",
    "equals=/k=v.bin",
    "tilde~/~a~.bin",
    "percent%/100%25.bin",
    "données/日本語/🦀.bin",
    "reserved !$&'()*,;:@[]/q?#.bin",
    "double//slash.bin",
    "dots/.../..a/a...bin",
]
BUCKET = "ds"


def verify(wire: Wire, now: datetime.datetime | None = None, **kw: Any) -> S3Key:
    return authenticate(
        wire.method, wire.path, wire.query, wire.headers, KEYS, now or wire.signed_at(), **kw
    )


def refused(wire: Wire, now: datetime.datetime | None = None) -> S3AuthError:
    with pytest.raises(S3AuthError) as caught:
        verify(wire, now)
    return caught.value


def header_requests(key: str) -> list[Wire]:
    c = client(AK, SECRET)
    return [
        signed(lambda: c.get_object(Bucket=BUCKET, Key=key)),
        signed(lambda: c.get_object(Bucket=BUCKET, Key=key, Range="bytes=0-1023")),
        signed(lambda: c.head_object(Bucket=BUCKET, Key=key)),
        signed(lambda: c.list_objects_v2(Bucket=BUCKET, Prefix=key)),
        signed(lambda: c.list_objects_v2(
            Bucket=BUCKET, Prefix=key, Delimiter="/", ContinuationToken=key + "+/=", MaxKeys=7,
        )),
    ]


def presigned_requests(key: str) -> list[Wire]:
    c = client(AK, SECRET)
    return [
        presigned(c.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=600,
        )),
        presigned(c.generate_presigned_url(
            "list_objects_v2", Params={"Bucket": BUCKET, "Prefix": key}, ExpiresIn=60,
        )),
    ]


@pytest.mark.parametrize("key", OBJECT_KEYS)
def test_header_signed_requests_verify(key: str) -> None:
    for wire in header_requests(key):
        assert is_signed(wire.query, wire.headers)
        assert verify(wire).access_key == AK


@pytest.mark.parametrize("key", OBJECT_KEYS)
def test_presigned_urls_verify(key: str) -> None:
    for wire in presigned_requests(key):
        assert is_signed(wire.query, wire.headers)
        assert verify(wire).access_key == AK


def _auth_signed(url: str, headers: dict[str, str], *, sign_payload: bool = True) -> Wire:
    """``url`` signed by botocore's S3SigV4Auth itself (for what the client will not build)."""
    request = AWSRequest(method="GET", url=url, headers=headers)
    # botocore's own switch: with payload signing off it declares UNSIGNED-PAYLOAD.
    request.context["client_config"] = Config(s3={"payload_signing_enabled": sign_payload})
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    parts = urlsplit(url)
    items = ((k, v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items())
    return Wire("GET", parts.path, parts.query, (("Host", parts.netloc), *items))


def test_virtual_hosted_requests_verify() -> None:
    wire = _auth_signed("http://ds.s3.hubspoke.test:9000/donn%C3%A9es/a%20b%2Bc.bin", {})
    assert verify(wire).access_key == AK
    moved = wire.with_header("Host", "other.s3.hubspoke.test:9000")
    assert refused(moved).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize(
    ("sign_payload", "declared"), [(False, "UNSIGNED-PAYLOAD"), (True, EMPTY_SHA256)]
)
def test_s3sigv4auth_with_a_declared_payload_verifies(sign_payload: bool, declared: str) -> None:
    wire = _auth_signed(
        "https://127.0.0.1:9443/ds/a%20b%2Bc.bin?versionId=v%2B1", {"Range": "bytes=0-0"},
        sign_payload=sign_payload,
    )
    assert wire.header("X-Amz-Content-SHA256") == declared
    assert verify(wire).access_key == AK


def test_a_payload_hash_other_than_empty_is_refused() -> None:
    wire = _auth_signed("https://127.0.0.1:9443/ds/a.bin", {})
    error = refused(wire.with_header("X-Amz-Content-SHA256", "ab" * 32))
    assert error.code == "XAmzContentSHA256Mismatch"
    assert error.status_hint == 400


def _flip_hex(text: str, at: int) -> str:
    return text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:]


def _flip_signature(wire: Wire) -> Wire:
    if "X-Amz-Signature=" in wire.query:
        return replace(wire, query=_flip_hex(wire.query, len(wire.query) - 1))
    authorization = wire.header("Authorization")
    return wire.with_header("Authorization", _flip_hex(authorization, len(authorization) - 7))


def _change_date(wire: Wire, seconds: int) -> Wire:
    at = wire.signed_at() + datetime.timedelta(seconds=seconds)
    stamp = at.strftime("%Y%m%dT%H%M%SZ")
    if "X-Amz-Date=" in wire.query:
        old = wire.query.split("X-Amz-Date=")[1].split("&")[0]
        return replace(wire, query=wire.query.replace(f"X-Amz-Date={old}", f"X-Amz-Date={stamp}"))
    return wire.with_header("X-Amz-Date", stamp)


def _replace_key_id(wire: Wire, new: str) -> Wire:
    if "X-Amz-Credential=" in wire.query:
        query = wire.query.replace(f"X-Amz-Credential={AK}", f"X-Amz-Credential={new}")
        return replace(wire, query=query)
    return wire.with_header("Authorization", wire.header("Authorization").replace(AK, new))


def _other_path(wire: Wire) -> Wire:
    return replace(wire, path=wire.path[:-1] + ("x" if wire.path[-1] != "x" else "y"))


def _other_host(wire: Wire) -> Wire:
    return wire.with_header("Host", "evil.example:9000")


def _extra_query(wire: Wire) -> Wire:
    return replace(wire, query=f"{wire.query}&prefix=z" if wire.query else "prefix=z")


MUTATIONS: dict[str, tuple[Callable[[Wire], Wire], str]] = {
    "signature": (_flip_signature, "SignatureDoesNotMatch"),
    "path": (_other_path, "SignatureDoesNotMatch"),
    "host (a signed header)": (_other_host, "SignatureDoesNotMatch"),
    "query": (_extra_query, "SignatureDoesNotMatch"),
    "date by a second": (lambda w: _change_date(w, 1), "SignatureDoesNotMatch"),
    "unknown key id": (lambda w: _replace_key_id(w, "AKIANOBODYKNOWS00000"), "InvalidAccessKeyId"),
    "another key's id": (lambda w: _replace_key_id(w, OTHER_AK), "SignatureDoesNotMatch"),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=str)
@pytest.mark.parametrize("key", ["a.bin", "données/a b+c=~.bin", "deep/" * 8 + "x"])
def test_each_mutation_is_refused_with_its_code(mutation: str, key: str) -> None:
    mutate, code = MUTATIONS[mutation]
    for wire in header_requests(key) + presigned_requests(key):
        assert verify(wire).access_key == AK
        error = refused(mutate(wire), wire.signed_at())
        assert error.code == code, (wire, error)
        assert error.status_hint == 403


def test_a_changed_range_is_refused_when_signed() -> None:
    c = client(AK, SECRET)
    wire = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin", Range="bytes=0-9"))
    assert refused(wire.with_header("Range", "bytes=0-99")).code == "SignatureDoesNotMatch"


def test_a_signed_header_missing_from_the_request_is_refused() -> None:
    c = client(AK, SECRET)
    wire = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin", Range="bytes=0-9"))
    without = replace(wire, headers=tuple(h for h in wire.headers if h[0] != "Range"))
    assert refused(without).code == "AccessDenied"


@pytest.mark.parametrize("offset_s", [-901, 901, -3600, 86400 * 3])
def test_header_signature_outside_the_skew_is_too_skewed(offset_s: int) -> None:
    c = client(AK, SECRET)
    wire = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin"))
    now = wire.signed_at() + datetime.timedelta(seconds=offset_s)
    error = refused(wire, now)
    assert error.code == "RequestTimeTooSkewed"
    assert error.status_hint == 403


@pytest.mark.parametrize("offset_s", [-900, -1, 0, 899, 900])
def test_header_signature_inside_the_skew_verifies(offset_s: int) -> None:
    c = client(AK, SECRET)
    wire = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin"))
    assert verify(wire, wire.signed_at() + datetime.timedelta(seconds=offset_s)).access_key == AK


def test_max_skew_is_a_parameter() -> None:
    c = client(AK, SECRET)
    wire = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin"))
    later = wire.signed_at() + datetime.timedelta(seconds=120)
    assert verify(wire, later).access_key == AK
    with pytest.raises(S3AuthError) as caught:
        verify(wire, later, max_skew_s=60)
    assert caught.value.code == "RequestTimeTooSkewed"


@pytest.mark.parametrize(
    ("offset_s", "ok"), [(0, True), (600, True), (601, False), (-899, True), (-901, False)]
)
def test_presigned_url_honours_its_expiry(offset_s: int, ok: bool) -> None:
    c = client(AK, SECRET)
    url = c.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "a.bin"}, ExpiresIn=600
    )
    wire = presigned(url)
    now = wire.signed_at() + datetime.timedelta(seconds=offset_s)
    if ok:
        assert verify(wire, now).access_key == AK
    else:
        error = refused(wire, now)
        assert error.code == "AccessDenied"
        assert "expired" in str(error) if offset_s > 0 else "not valid yet" in str(error)


@pytest.mark.parametrize("expires", ["0", "604801", "-5", "1e3", "abc", "99999999999"])
def test_presigned_expiry_out_of_bounds_is_a_query_error(expires: str) -> None:
    c = client(AK, SECRET)
    wire = presigned(c.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "a"}))
    query = wire.query.replace("X-Amz-Expires=3600", f"X-Amz-Expires={expires}")
    assert query != wire.query
    error = refused(replace(wire, query=query))
    assert error.code == "AuthorizationQueryParametersError"
    assert error.status_hint == 400


def test_presigned_a_week_is_allowed() -> None:
    c = client(AK, SECRET)
    wire = presigned(c.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "a"}, ExpiresIn=604800,
    ))
    assert verify(wire, wire.signed_at() + datetime.timedelta(days=6)).access_key == AK


def test_both_carriers_at_once_are_refused() -> None:
    c = client(AK, SECRET)
    header = signed(lambda: c.get_object(Bucket=BUCKET, Key="a.bin"))
    params = {"Bucket": BUCKET, "Key": "a.bin"}
    query = presigned(c.generate_presigned_url("get_object", Params=params))
    both = replace(header, query=query.query)
    assert refused(both).code == "InvalidArgument"


@pytest.mark.parametrize(
    ("signed_path", "sent_path"),
    [
        ("/ds/a%3Db.bin", "/ds/a=b.bin"),
        ("/ds/%C3%A9.bin", "/ds/%c3%a9.bin"),
        ("/ds/a%21", "/ds/a!"),
    ],
)
def test_a_path_sent_in_another_encoding_of_the_same_key_verifies(
    signed_path: str, sent_path: str
) -> None:
    """A client that signed the canonical encoding but sent the key in another form."""
    wire = _auth_signed(f"http://127.0.0.1:9000{signed_path}", {})
    assert verify(replace(wire, path=sent_path)).access_key == AK
    # ... but only another form of the same key.
    other = sent_path[:-1] + ("x" if sent_path[-1] != "x" else "y")
    assert refused(replace(wire, path=other)).code == "SignatureDoesNotMatch"


def test_a_repeated_request_is_checked_again_against_the_keys_and_the_clock() -> None:
    """Verified requests are remembered; a repeat still answers to today's keys and clock."""
    c = client(AK, SECRET)
    wire = presigned(c.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": "again.bin"}, ExpiresIn=600,
    ))
    at = wire.signed_at()
    assert verify(wire).access_key == AK
    assert verify(wire).access_key == AK

    def check(keys: dict[str, S3Key], now: datetime.datetime) -> S3Key:
        return authenticate(wire.method, wire.path, wire.query, wire.headers, keys, now)

    with pytest.raises(S3AuthError) as caught:
        check({AK: S3Key(AK, "a-rotated-secret-of-enough-bytes", ("",))}, at)
    assert caught.value.code == "SignatureDoesNotMatch"
    with pytest.raises(S3AuthError) as caught:
        check({}, at)
    assert caught.value.code == "InvalidAccessKeyId"
    narrowed = S3Key(AK, SECRET, ("ds/only",))
    assert check({AK: narrowed}, at).prefixes == ("ds/only",)
    with pytest.raises(S3AuthError) as caught:
        check(KEYS, at + datetime.timedelta(seconds=601))
    assert caught.value.code == "AccessDenied"
    assert verify(wire).access_key == AK
