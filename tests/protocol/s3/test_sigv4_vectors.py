"""protocol.s3.sigv4 against AWS's published vectors (tests/protocol/s3/sigv4_vectors.json).

The SigV4 test suite's GET cases pin the canonical request, the string to sign and the
signature; the S3 API Reference's worked examples pin S3's own variant (x-amz-content-sha256,
Range, a bare ``?lifecycle``, a presigned URL).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from protocol.s3.credentials import S3Key
from protocol.s3.sigv4 import (
    EMPTY_SHA256,
    S3AuthError,
    authenticate,
    canonical_request,
    signing_key,
    string_to_sign,
)

DATA = json.loads((Path(__file__).parent / "sigv4_vectors.json").read_text(encoding="utf-8"))
SUITE: dict[str, Any] = DATA["suite"]
S3_DOCS: dict[str, Any] = DATA["s3_docs"]
SUITE_NOW = datetime.datetime.fromisoformat(SUITE["now"])
S3_NOW = datetime.datetime.fromisoformat(S3_DOCS["now"])
SUITE_KEYS = {SUITE["access_key"]: S3Key(SUITE["access_key"], SUITE["secret"], ("",))}
S3_KEYS = {S3_DOCS["access_key"]: S3Key(S3_DOCS["access_key"], S3_DOCS["secret"], ("",))}
SCOPE = "20150830/us-east-1/service/aws4_request"


def _pairs(vector: dict[str, Any]) -> list[tuple[str, str]]:
    return [(name, value) for name, value in vector["headers"]]


def _signed_headers(vector: dict[str, Any]) -> list[str]:
    return vector["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")


@pytest.mark.parametrize("vector", SUITE["vectors"], ids=lambda v: v["name"])
def test_suite_canonical_request(vector: dict[str, Any]) -> None:
    got = canonical_request(
        vector["method"], vector["path"], vector["query"], _pairs(vector),
        _signed_headers(vector), EMPTY_SHA256,
    )
    assert got == vector["canonical_request"]


@pytest.mark.parametrize("vector", SUITE["vectors"], ids=lambda v: v["name"])
def test_suite_string_to_sign_and_signature(vector: dict[str, Any]) -> None:
    sts = string_to_sign("20150830T123600Z", SCOPE, vector["canonical_request"])
    assert sts == vector["string_to_sign"]
    key = signing_key(SUITE["secret"], "20150830", "us-east-1", "service")
    signature = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    assert vector["authorization"].endswith(f"Signature={signature}")


@pytest.mark.parametrize("vector", SUITE["vectors"], ids=lambda v: v["name"])
def test_suite_request_authenticates(vector: dict[str, Any]) -> None:
    headers = [*_pairs(vector), ("Authorization", vector["authorization"])]
    key = authenticate(
        vector["method"], vector["path"], vector["query"], headers, SUITE_KEYS, SUITE_NOW,
        service="service",
    )
    assert key.access_key == "AKIDEXAMPLE"


@pytest.mark.parametrize("vector", SUITE["vectors"], ids=lambda v: v["name"])
def test_suite_request_with_another_signature_is_refused(vector: dict[str, Any]) -> None:
    authorization = vector["authorization"]
    flipped = authorization[:-1] + ("0" if authorization[-1] != "0" else "1")
    headers = [*_pairs(vector), ("Authorization", flipped)]
    with pytest.raises(S3AuthError) as caught:
        authenticate(
            vector["method"], vector["path"], vector["query"], headers, SUITE_KEYS, SUITE_NOW,
            service="service",
        )
    assert caught.value.code == "SignatureDoesNotMatch"
    assert caught.value.canonical_request == vector["canonical_request"]


@pytest.mark.parametrize("vector", SUITE["normalising_not_s3"], ids=lambda v: v["name"])
def test_s3_does_not_normalise_the_path(vector: dict[str, Any]) -> None:
    """The suite's general rules collapse '//', '.' and '..'; S3's sign the path as sent."""
    headers = [*_pairs(vector), ("Authorization", vector["authorization"])]
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", vector["path"], "", headers, SUITE_KEYS, SUITE_NOW, service="service")
    assert caught.value.code == "SignatureDoesNotMatch"
    assert caught.value.canonical_request.split("\n")[1] == vector["path"]


@pytest.mark.parametrize("vector", S3_DOCS["vectors"], ids=lambda v: v["name"])
def test_s3_docs_example_authenticates(vector: dict[str, Any]) -> None:
    key = authenticate("GET", vector["path"], vector["query"], _pairs(vector), S3_KEYS, S3_NOW)
    assert key.access_key == "AKIAIOSFODNN7EXAMPLE"


@pytest.mark.parametrize("vector", S3_DOCS["vectors"], ids=lambda v: v["name"])
def test_s3_docs_example_refused_under_another_secret(vector: dict[str, Any]) -> None:
    keys = {k: S3Key(k, S3_DOCS["secret"].replace("/", "+"), ("",)) for k in S3_KEYS}
    with pytest.raises(S3AuthError) as caught:
        authenticate("GET", vector["path"], vector["query"], _pairs(vector), keys, S3_NOW)
    assert caught.value.code == "SignatureDoesNotMatch"
    assert caught.value.status_hint == 403
