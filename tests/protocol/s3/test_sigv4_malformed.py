"""Malformed SigV4 gets S3's 4xx codes, and nothing but S3AuthError escapes, whatever the input."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.s3.credentials import S3Key
from protocol.s3.sigv4 import MAX_AUTH_BYTES, S3AuthError, authenticate, is_signed

AK = "AKIAHUBSPOKETEST0001"
KEYS = {AK: S3Key(AK, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ("",))}
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
STAMP = "20260102T030405Z"
CRED = f"{AK}/20260102/us-east-1/s3/aws4_request"
SIG = "0" * 64
GOOD_AUTH = f"AWS4-HMAC-SHA256 Credential={CRED}, SignedHeaders=host;x-amz-date, Signature={SIG}"
BASE = [("Host", "127.0.0.1:9000"), ("x-amz-date", STAMP)]
QERR = "AuthorizationQueryParametersError"
PRESIGN = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + CRED.replace("/", "%2F")
    + f"&X-Amz-Date={STAMP}&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature={SIG}"
)


def code_of(query: str = "", headers: list[tuple[str, str]] | None = None) -> tuple[str, int]:
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", "/ds/a.bin", query, headers if headers is not None else BASE, KEYS, NOW)
    return caught.value.code, caught.value.status_hint


def with_auth(value: str, extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    return [*BASE, *(extra or []), ("Authorization", value)]


def test_a_wellformed_request_with_a_wrong_signature_does_not_match() -> None:
    assert code_of(headers=with_auth(GOOD_AUTH)) == ("SignatureDoesNotMatch", 403)
    assert code_of(PRESIGN) == ("SignatureDoesNotMatch", 403)


def test_anonymous_is_denied() -> None:
    assert code_of() == ("AccessDenied", 403)
    assert code_of("list-type=2&prefix=a") == ("AccessDenied", 403)
    assert not is_signed("list-type=2&prefix=a", BASE)


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        ("", "AuthorizationHeaderMalformed"),
        ("Bearer abc", "AuthorizationHeaderMalformed"),
        ("AWS4-HMAC-SHA512 Credential=x", "AuthorizationHeaderMalformed"),
        (f"AWS {AK}:c2lnbmF0dXJl", "InvalidArgument"),
        ("AWS4-HMAC-SHA256", "AuthorizationHeaderMalformed"),
        ("AWS4-HMAC-SHA256 garbage", "AuthorizationHeaderMalformed"),
        (f"AWS4-HMAC-SHA256 Credential={CRED}, Signature={SIG}", "AuthorizationHeaderMalformed"),
        (GOOD_AUTH + ", Extra=1", "AuthorizationHeaderMalformed"),
        (GOOD_AUTH + f", Signature={SIG}", "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace(CRED, AK), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/s3/", "/ec2/"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("aws4_request", "aws5_request"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("20260102", "20260103"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("20260102", "2026010x"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("us-east-1", "us east/1"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;x-amz-date", "x-amz-date"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;x-amz-date", "x-amz-date;host"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;x-amz-date", "Host;x-amz-date"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;x-amz-date", "host;host"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;x-amz-date", ";".join(["host"] + [f"h{i:03}" for i in range(80)])),
         "AuthorizationHeaderMalformed"),
        (GOOD_AUTH + " " * MAX_AUTH_BYTES, "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace(AK, "AKIAUNKNOWN"), "InvalidAccessKeyId"),
        (GOOD_AUTH.replace("host;x-amz-date", "host;range;x-amz-date"), "AccessDenied"),
    ],
)
def test_bad_authorization_headers(authorization: str, code: str) -> None:
    got, status = code_of(headers=with_auth(authorization))
    assert got == code
    assert status == (403 if code in ("AccessDenied", "InvalidAccessKeyId") else 400)


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ([("Host", "h")], "AccessDenied"),
        ([("Host", "h"), ("x-amz-date", "2026-01-02T03:04:05Z")], "AccessDenied"),
        ([("Host", "h"), ("x-amz-date", "20260102T250405Z")], "AccessDenied"),
        ([("Host", "h"), ("Date", "not a date")], "AccessDenied"),
        ([("Host", "h"), ("Date", "Fri, 02 Jan 2026 03:20:06 GMT")], "RequestTimeTooSkewed"),
        ([("Host", "h"), ("x-amz-date", "20260102T032006Z")], "RequestTimeTooSkewed"),
        ([("Host", "h"), ("x-amz-date", "20260102T024804Z")], "RequestTimeTooSkewed"),
        ([("Host", "h"), ("Date", "Fri, 02 Jan 2026 03:04:05 GMT")], "SignatureDoesNotMatch"),
        ([*BASE, ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")],
         "XAmzContentSHA256Mismatch"),
    ],
)
def test_bad_dates_and_payloads(headers: list[tuple[str, str]], code: str) -> None:
    authorization = GOOD_AUTH
    if not any(k == "x-amz-date" for k, _ in headers):
        authorization = authorization.replace("host;x-amz-date", "host")
    assert code_of(headers=[*headers, ("Authorization", authorization)])[0] == code


@pytest.mark.parametrize(
    ("query", "code"),
    [
        (PRESIGN.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1"), QERR),
        (PRESIGN.replace("X-Amz-Expires=60&", ""), QERR),
        (PRESIGN.replace("X-Amz-Algorithm", "X-Amz-Algo"), QERR),
        (PRESIGN + f"&X-Amz-Signature={SIG}", QERR),
        (PRESIGN.replace(STAMP, "yesterday"), QERR),
        (PRESIGN.replace(STAMP, "20261302T030405Z"), QERR),
        (PRESIGN.replace("X-Amz-Expires=60", "X-Amz-Expires=%36%30"), "SignatureDoesNotMatch"),
        (PRESIGN.replace("X-Amz-Expires=60", "X-Amz-Expires=６０"), QERR),
        (PRESIGN.replace("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=x-amz-date"),
         QERR),
        (PRESIGN.replace("%2Fs3%2F", "%2Fsts%2F"), QERR),
        (PRESIGN.replace("20260102%2F", "20260101%2F"), QERR),
        (PRESIGN.replace(AK, "AKIAUNKNOWN"), "InvalidAccessKeyId"),
        (PRESIGN.replace(STAMP, "20260102T025000Z").replace("Expires=60", "Expires=600"),
         "AccessDenied"),
        (PRESIGN.replace(STAMP, "20260102T032000Z"), "AccessDenied"),
        (f"AWSAccessKeyId={AK}&Expires=1767323045&Signature=abc", "InvalidArgument"),
    ],
)
def test_bad_presigned_queries(query: str, code: str) -> None:
    assert is_signed(query, BASE)
    assert code_of(query)[0] == code


def test_header_and_query_together_are_refused() -> None:
    assert code_of(PRESIGN, with_auth(GOOD_AUTH)) == ("InvalidArgument", 400)


def test_a_query_left_on_the_path_is_split_off() -> None:
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", "/ds/a.bin?" + PRESIGN, "", BASE, KEYS, NOW)
    assert caught.value.code == "SignatureDoesNotMatch"
    assert caught.value.canonical_request.split("\n")[1] == "/ds/a.bin"


def test_headers_as_a_mapping_are_accepted() -> None:
    headers = {"Host": "127.0.0.1:9000", "X-Amz-Date": STAMP, "Authorization": GOOD_AUTH}
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", "/ds/a.bin", "", headers, KEYS, NOW)
    assert caught.value.code == "SignatureDoesNotMatch"


junk = st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
auth_like = st.builds(
    lambda a, b, c, d: f"AWS4-HMAC-SHA256 Credential={a}, SignedHeaders={b}, Signature={c}{d}",
    junk, junk, junk, junk,
)
query_like = st.lists(
    st.tuples(st.sampled_from([
        "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
        "X-Amz-SignedHeaders", "X-Amz-Signature", "prefix", "%ZZ", "",
    ]), junk),
    max_size=8,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))


@settings(max_examples=400, deadline=None, database=None)
@given(
    path=junk, query=junk | query_like, authorization=st.none() | junk | auth_like,
    date=st.none() | junk, now_s=st.integers(min_value=0, max_value=4_000_000_000),
)
def test_garbage_raises_only_s3autherror(
    path: str, query: str, authorization: str | None, date: str | None, now_s: int
) -> None:
    headers = [("Host", "h")]
    if authorization is not None:
        headers.append(("Authorization", authorization))
    if date is not None:
        headers.append(("x-amz-date", date))
    now = datetime.datetime.fromtimestamp(now_s, tz=datetime.UTC)
    is_signed(query, headers)
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", path, query, headers, KEYS, now)
    assert caught.value.status_hint in (400, 403)
