"""Live fuzzing of the spoke's S3 front end over raw sockets (the S3 part of test_fuzz).

A real hub and spoke, the S3 front end on its own port, without credentials (anonymous
reads) and with a credentials file (SigV4 required). Requests go out byte for byte:

- crafted: bad Authorization headers, broken presigned queries, garbage and huge list
  parameters, invalid percent-encodings, keys with ``..`` in every encoding, buckets that
  are not a segment, unknown operations and methods, bad ranges;
- a seeded generator mutating valid requests (signed by botocore where SigV4 is on) in
  their target and their signature headers (``MUTATED_PER_FRONT`` each).

Every error answer is S3's: a 4xx (or 501 ``NotImplemented``) with ``application/xml``,
``<Error><Code>`` and ``x-amz-request-id``; never a 5xx, a cut body or a hang, and no
request left in a handler. With credentials, no forged or unsigned request reads a byte.
Afterwards the spoke still serves the right bytes through S3 and ``/objects``.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import aiohttp
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from service.runner import start_site
from spoke.s3.access import load_keys
from spoke.s3.app import make_s3_app
from tests.conftest import SpokeFactory
from tests.security.test_fuzz import (
    DOTDOT,
    HOST,
    Exchange,
    Reply,
    check_invariants,
    exchange,
    mutate,
    no_request_left_in_a_handler_of,
    plant_hostile_files,
    server_errors,
)
from tests.support.servers import RunningServer

__all__ = ["server_errors"]  # a fixture, used by name

Dataset = tuple[Path, dict[str, bytes]]

ACCESS_KEY = "AKIDFUZZ"
SECRET_KEY = "fuzz-secret-key-of-the-s3-front"
REGION = "us-east-1"
MUTATED_PER_FRONT = 600
SEED = 20261201
S3_ERRORS = frozenset({*range(400, 500), 501})
OK = frozenset({200, 206, 304})
READ_OK = frozenset({200, 206})


@dataclass
class Front:
    kind: str  # "anonymous" | "sigv4"
    spoke: RunningServer
    port: int
    files: dict[str, bytes]
    root: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def signed(self) -> bool:
        return self.kind == "sigv4"


@pytest.fixture(params=["anonymous", "sigv4"])
async def front(request: pytest.FixtureRequest, dataset: Dataset, make_spoke: SpokeFactory,
                tmp_path: Path) -> AsyncIterator[Front]:
    root, files = dataset
    keys = None
    if request.param == "sigv4":
        creds = tmp_path / "s3-credentials"
        creds.write_text(f"{ACCESS_KEY} {SECRET_KEY} ''\n")
        creds.chmod(0o600)
        keys = load_keys(str(creds))
    spoke = await make_spoke()
    plant_hostile_files(root)
    runner, port = await start_site(make_s3_app(spoke.app, None, keys), HOST, 0)
    try:
        yield Front(request.param, spoke, port, files, root)
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------------------
# requests, signed as botocore signs them


class _SignedAt(S3SigV4Auth):
    """botocore's S3 SigV4 signer, signing as of a given time (botocore takes the clock)."""

    def __init__(self, secret: str, when: datetime.datetime) -> None:
        super().__init__(Credentials(ACCESS_KEY, secret), "s3", REGION)
        self.when = when

    def add_auth(self, request: AWSRequest) -> None:
        request.context["timestamp"] = self.when.strftime("%Y%m%dT%H%M%SZ")
        self._modify_request_before_signing(request)
        canonical = self.canonical_request(request)
        signature = self.signature(self.string_to_sign(request, canonical), request)
        self._inject_signature_to_request(request, signature)


def sign_headers(url: str, method: str = "GET", headers: dict[str, str] | None = None,
                 secret: str = SECRET_KEY, when: datetime.datetime | None = None) -> bytes:
    """The ``X-Amz-*`` and ``Authorization`` lines botocore signs for ``url``."""
    req = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    _SignedAt(secret, when or datetime.datetime.now(datetime.UTC)).add_auth(req)
    return b"".join(f"{name}: {value}\r\n".encode() for name, value in req.headers.items()
                    if name.lower() != "host")


def presign(url: str, expires: int = 3600, secret: str = SECRET_KEY) -> str:
    req = AWSRequest(method="GET", url=url)
    S3SigV4QueryAuth(Credentials(ACCESS_KEY, secret), "s3", REGION, expires=expires).add_auth(req)
    return str(req.url)


def target_of(url: str) -> bytes:
    parts = urlsplit(url)
    return (parts.path + (f"?{parts.query}" if parts.query else "")).encode()


def raw(target: bytes, *, method: bytes = b"GET", headers: bytes = b"",
        body: bytes = b"") -> bytes:
    """One request, byte for byte, asking the server to close after it."""
    return (method + b" " + target + b" HTTP/1.1\r\nHost: " + HOST.encode() + b"\r\n"
            + headers + b"Connection: close\r\n\r\n" + body)


def signed_get(front: Front, target: bytes, extra: dict[str, str] | None = None) -> bytes:
    """A GET of ``target`` signed for ``front`` (as is, for an anonymous one)."""
    headers = dict(extra or {})
    lines = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    if front.signed:
        lines = sign_headers(f"http://{HOST}{target.decode('latin-1')}", headers=headers)
        lines += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()
                          if f"{k}:".encode() not in lines)
    return raw(target, headers=lines)


# ---------------------------------------------------------------------------
# what every answer must be


def headers_of(reply: Reply) -> dict[bytes, bytes]:
    out = {}
    for line in reply.head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        out[name.strip().lower()] = value.strip()
    return out


def s3_problems(ex: Exchange, head: bool) -> list[str]:
    """What is wrong with the S3 answers in ``ex``, whatever was asked."""
    problems = check_invariants(ex)
    for reply in ex.replies:
        if reply.status < 200:
            continue
        headers = headers_of(reply)
        if b"x-amz-request-id" not in headers:
            problems.append(f"{reply.status} without x-amz-request-id")
        if reply.status >= 500 and reply.status != 501:
            problems.append(f"{reply.status}: {reply.body[:300]!r}")
        if reply.status < 400:
            continue
        if not headers.get(b"content-type", b"").startswith(b"application/xml"):
            problems.append(f"{reply.status} as {headers.get(b'content-type')!r}: "
                            f"{reply.body[:200]!r}")
        if not head and not re.search(rb"<Error>.*<Code>\w+</Code>", reply.body, re.S):
            problems.append(f"{reply.status} without <Error><Code>: {reply.body[:200]!r}")
    return problems


@dataclass(frozen=True)
class Case:
    name: str
    payload: bytes
    allowed: frozenset[int] = S3_ERRORS
    body: bytes | None = None  # the only body a 2xx answer may carry


async def run_cases(front: Front, cases: list[Case]) -> list[str]:
    gate = asyncio.Semaphore(16)

    async def one(case: Case) -> list[str]:
        async with gate:
            try:
                ex = await exchange(front.port, case.payload)
            except AssertionError as exc:
                return [f"{case.name}: {exc}"]
        head = case.payload.startswith(b"HEAD ")
        problems = s3_problems(ex, head)
        finals = [r for r in ex.replies if r.status >= 200]
        if not finals:
            problems.append(f"no answer (closed={ex.closed}, timed out={ex.timed_out})")
        problems += [f"answered {r.status}" for r in finals if r.status not in case.allowed]
        if case.body is not None and not head:
            problems += [f"{r.status} with {len(r.body)} wrong bytes" for r in finals
                         if r.status in READ_OK and r.body != case.body]
        return [f"{case.name}: {p}" for p in problems]

    results = await asyncio.gather(*(one(c) for c in cases))
    return [p for found in results for p in found]


# ---------------------------------------------------------------------------
# crafted cases

BAD_AUTHORIZATION = [
    b"AWS4-HMAC-SHA256",
    b"AWS4-HMAC-SHA256 ",
    b"AWS4-HMAC-SHA256 Credential=",
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ, SignedHeaders=host, Signature=00",
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request",
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/2026/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host, Signature=" + b"0" * 64,
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=, Signature=" + b"0" * 64,
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=zz" + b"z" * 62,
    b"AWS4-HMAC-SHA256 Credential=NOBODY/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=" + b"a" * 64,
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/iam/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=" + b"a" * 64,
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host;x-amz-date, Signature=" + b"a" * 64 + b", Signature=" + b"b" * 64,
    b"AWS4-HMAC-SHA256 Credential=" + b"A" * 20000 + b"/x/y/s3/aws4_request, "
    b"SignedHeaders=host, Signature=" + b"a" * 64,
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=" + b"h;" * 5000 + b"host, Signature=" + b"a" * 64,
    b"AWS4-HMAC-SHA512 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host, Signature=" + b"a" * 64,
    b"AWS AKIDFUZZ:c2lnbmF0dXJl",
    b"AWS AKIDFUZZ",
    b"Bearer abc.def.ghi",
    b"Basic QUtJREZVWlo6ZnV6eg==",
    b"\xff\xfe\xfd",
    b"AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request,,,,,,",
    b"AWS4-HMAC-SHA256 Credential=%ZZ/20261201/us-east-1/s3/aws4_request, "
    b"SignedHeaders=host, Signature=" + b"a" * 64,
    b"aws4-hmac-sha256 credential=AKIDFUZZ/20261201/us-east-1/s3/aws4_request",
]

PRESIGN_BREAKS = [
    ("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-HMAC-MD5"),
    ("X-Amz-Algorithm=AWS4-HMAC-SHA256", ""),
    ("X-Amz-Expires=3600", "X-Amz-Expires=-1"),
    ("X-Amz-Expires=3600", "X-Amz-Expires=0"),
    ("X-Amz-Expires=3600", "X-Amz-Expires=99999999999999999999999"),
    ("X-Amz-Expires=3600", "X-Amz-Expires=abc"),
    ("X-Amz-Expires=3600", "X-Amz-Expires=604801"),
    ("X-Amz-Expires=3600", "X-Amz-Expires=3600&X-Amz-Expires=3600"),
    ("X-Amz-Expires=3600", ""),
    ("X-Amz-Signature=", "X-Amz-Signature=00"),
    ("X-Amz-Signature=", "X-Amz-Signature=%zz"),
    ("X-Amz-Signature=", "X-Amz-Nothing="),
    ("X-Amz-Credential=AKIDFUZZ", "X-Amz-Credential=NOBODY"),
    ("X-Amz-Credential=AKIDFUZZ", "X-Amz-Credential="),
    ("X-Amz-Credential=AKIDFUZZ%2F", "X-Amz-Credential=AKIDFUZZ%2F%2F"),
    ("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders="),
    ("X-Amz-SignedHeaders=host", "X-Amz-SignedHeaders=host%3Brange"),
    ("X-Amz-Date=", "X-Amz-Date=1999"),
    ("X-Amz-Date=", "X-Amz-Date=garbage"),
    ("X-Amz-Date=", "X-Amz-Date=%ff%fe"),
]

LIST_PARAMS = [
    "max-keys=-1", "max-keys=abc", "max-keys=99999999999999999999999999", "max-keys=1e3",
    "max-keys=", "max-keys=%00", "max-keys=0x10", "max-keys=%2B5",
    "continuation-token=garbage", "continuation-token=" + "A" * 7000,
    "continuation-token=aHMxOnRyYWluL21hbnkv", "continuation-token=%ff%fe",
    "continuation-token=", "start-after=" + "z" * 7000, "start-after=%00",
    "prefix=" + "p" * 7000, "prefix=%ff", "prefix=../", "prefix=%2e%2e%2f",
    "prefix=/", "prefix=%00", "delimiter=%00", "delimiter=" + "d" * 3000,
    "delimiter=/&delimiter=/", "encoding-type=bogus", "encoding-type=", "list-type=3",
    "list-type=", "list-type=2&list-type=1", "marker=%ff", "fetch-owner=maybe",
    "&".join(f"p{i}=1" for i in range(500)),
]

UNKNOWN_OPS = [
    "acl", "tagging", "uploads", "versioning", "policy", "torrent", "cors", "lifecycle",
    "select&select-type=2", "versionId=abc", "partNumber=1", "uploadId=u", "versions",
    "website", "restore", "delete", "attributes", "object-lock", "session",
]

NOT_A_SEGMENT = [
    b"//big.bin", b"/./ds/small.bin", b"/../ds/small.bin", b"/%2e%2e/ds/small.bin",
    b"/%2e/ds/small.bin", b"/ds%2fsmall.bin", b"/ds%2Fsmall.bin", b"/ds%5csmall.bin",
    b"/Ds/small.bin", b"/d$/small.bin", b"/" + b"b" * 300 + b"/x.bin", b"/-ds-/x",
    b"/ds./small.bin", b"/%00/small.bin", b"/%ff/small.bin", b"/ds%00/small.bin",
    b"/ds%20/small.bin", b"/escape-dir/secret.txt", b"/%2e%2e%2fsecret.txt", b"/..",
    b"/.", b"/%2e%2e", b"/ds/..", b"/ds/.",
]

BAD_ENCODINGS = [
    b"/ds/%zz", b"/ds/%", b"/ds/small.bin%", b"/ds/small.bin%2", b"/ds/%c3", b"/ds/%ff%fe.bin",
    b"/ds/%ed%a0%80.bin", b"/ds/%c0%af.bin", b"/ds/%e0%80%af", b"/ds/small.bin%00",
    b"/ds/%00", b"/ds/small%01.bin", b"/ds/small.bin%0d%0aSet-Cookie:%20x=1",
    b"/ds/small.bin%0d%0aX-Injected:%201", b"/ds/" + b"%41" * 2000, b"/ds/\xff\xfe.bin",
    b"/ds/\xc3.bin", b"/ds/small.bin?x-id=%ff",
]

METHODS = [b"PUT", b"POST", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"BREW", b"PROPFIND",
           b"MKCOL", b"COPY", b"get", b"Get"]

BAD_RANGES = [b"bytes=abc", b"bytes=5-1", b"bytes=99999999999999999999-", b"bytes=-0",
              b"bytes=1000000000-", b"bytes=0-1,5-6", b"pages=0-1", b"bytes=--1",
              b"bytes=0-" + b"9" * 40, b"bytes=" + b"0-0," * 3000 + b"0-0"]


def dotdot_paths() -> list[bytes]:
    """``..`` and escapes in every encoding, as S3 keys of bucket ``ds``."""
    out = []
    for path in DOTDOT:  # (``ds/...`` object paths of the HTTP fuzz)
        out.append(b"/" + path)
    out += [b"/ds/..%2f..%2fsecret.txt", b"/ds/%2e%2e%2f%2e%2e%2fsecret.txt",
            b"/ds/%252e%252e/%252e%252e/secret.txt", b"/ds/..%5c..%5csecret.txt",
            b"/ds/%c0%ae%c0%ae/secret.txt", b"/ds/link-out.bin", b"/ds/abs-out.bin",
            b"/ds/etc-passwd", b"/ds/fifo.bin", b"/ds/nested/../../../../etc/passwd"]
    return out


def crafted_cases(front: Front) -> list[Case]:
    small, big = front.files["ds/small.bin"], front.files["ds/big.bin"]
    cases: list[Case] = []
    add = cases.append
    signed = front.signed

    for i, auth in enumerate(BAD_AUTHORIZATION):
        # Without credentials, signatures are not checked: the object, or an S3 error.
        allowed = S3_ERRORS if signed else S3_ERRORS | READ_OK
        add(Case(f"Authorization #{i}", raw(b"/ds/small.bin", headers=b"Authorization: " + auth
                                            + b"\r\nX-Amz-Date: 20261201T000000Z\r\n"),
                 allowed, body=small))
    good = sign_headers(f"http://{HOST}/ds/small.bin")
    for name, line in [
        ("x-amz-date garbage", re.sub(rb"X-Amz-Date: \S+", b"X-Amz-Date: garbage", good)),
        ("x-amz-date missing", re.sub(rb"X-Amz-Date: \S+\r\n", b"", good)),
        ("x-amz-content-sha256 garbage",
         re.sub(rb"X-Amz-Content-SHA256: \S+", b"X-Amz-Content-SHA256: zz", good)),
        ("x-amz-content-sha256 of a body",
         re.sub(rb"X-Amz-Content-SHA256: \S+", b"X-Amz-Content-SHA256: " + b"a" * 64, good)),
        ("Authorization for another key", raw(b"/ds/big.bin", headers=good)),
    ]:
        payload = line if line.startswith(b"GET") else raw(b"/ds/small.bin", headers=line)
        allowed = S3_ERRORS if signed else S3_ERRORS | READ_OK
        add(Case(f"signed header: {name}", payload, allowed,
                 body=small if b"/ds/small.bin" in payload[:40] else big))
    for days in (-2, 2):
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days)
        add(Case(f"signed {days} days off", raw(b"/ds/small.bin", headers=sign_headers(
            f"http://{HOST}/ds/small.bin", when=when)),
            S3_ERRORS if signed else S3_ERRORS | READ_OK, body=small))
    add(Case("signed with the wrong secret", raw(b"/ds/small.bin", headers=sign_headers(
        f"http://{HOST}/ds/small.bin", secret="wrong")),
        S3_ERRORS if signed else S3_ERRORS | READ_OK, body=small))

    url = presign(f"http://{HOST}/ds/small.bin")
    for old, new in PRESIGN_BREAKS:
        broken = url.replace(old, new, 1)
        assert broken != url or not old, (old, new)
        add(Case(f"presigned: {old} -> {new}", raw(target_of(broken)),
                 S3_ERRORS if signed else S3_ERRORS | READ_OK, body=small))
    add(Case("presigned, and an Authorization header", raw(target_of(url), headers=good),
             S3_ERRORS | READ_OK, body=small))
    add(Case("presigned for another key", raw(target_of(url).replace(b"small", b"big")),
             S3_ERRORS if signed else S3_ERRORS | READ_OK, body=big))
    add(Case("presigned, expired", raw(target_of(presign(
        f"http://{HOST}/ds/small.bin", expires=1)).replace(b"X-Amz-Date=2", b"X-Amz-Date=1")),
        S3_ERRORS if signed else S3_ERRORS | READ_OK, body=small))

    for params in LIST_PARAMS:
        for listing in (b"/ds?list-type=2&", b"/ds/?"):
            target = listing + params.encode()
            add(Case(f"list {target[:80]!r}", signed_get(front, target), S3_ERRORS | {200}))
    for op in UNKNOWN_OPS:
        for path in (b"/ds", b"/ds/small.bin"):
            target = path + b"?" + op.encode()
            add(Case(f"op {target!r}", signed_get(front, target)))
    for target in NOT_A_SEGMENT + BAD_ENCODINGS + dotdot_paths():
        body = small if target in (b"/./ds/small.bin",) else None
        add(Case(f"path {target[:80]!r}", raw(target), S3_ERRORS, body=body))
        if signed:
            quoted = quote(target.decode("latin-1"), safe="/%?=&").encode()
            add(Case(f"signed path {target[:80]!r}", signed_get(front, quoted), S3_ERRORS))
    for method in METHODS:
        for path in (b"/ds/small.bin", b"/ds", b"/"):
            add(Case(f"{method!r} {path!r}", raw(path, method=method, headers=(
                b"Content-Length: 5\r\n" if method in (b"PUT", b"POST") else b""),
                body=b"hello" if method in (b"PUT", b"POST") else b"")))
    for spec in BAD_RANGES:
        add(Case(f"Range {spec[:40]!r}", signed_get(front, b"/ds/big.bin", {
            "Range": spec.decode()}), S3_ERRORS | READ_OK, body=big))
    add(Case("GET with a body", raw(b"/ds/small.bin", headers=b"Content-Length: 4\r\n",
                                    body=b"abcd")))
    return cases


async def test_crafted_hostile_s3_requests(
    front: Front, server_errors: Callable[[], list[str]],
    record_property: Callable[[str, object], None],
) -> None:
    cases = crafted_cases(front)
    record_property("requests_sent", len(cases))
    problems = await run_cases(front, cases)
    assert not problems, "\n".join(problems[:60])
    await no_request_left_in_a_handler_of(front.spoke)
    await healthy_and_correct(front)
    assert not server_errors(), "\n".join(server_errors()[:30])
    print(f"\nS3 {front.kind}: {len(cases)} crafted hostile requests")


# ---------------------------------------------------------------------------
# seeded mutations of valid requests


def templates(front: Front) -> list[bytes]:
    """Valid S3 requests, signed for ``front``."""
    targets = [b"/ds/big.bin", b"/ds/small.bin", b"/ds?list-type=2&prefix=&max-keys=3",
               b"/ds/?prefix=d&marker=a", b"/", b"/other/notes.csv"]
    out = [signed_get(front, t) for t in targets]
    out.append(signed_get(front, b"/ds/big.bin", {"Range": "bytes=65530-65545"}))
    out.append(raw(target_of(presign(f"http://{HOST}/ds/big.bin"))))
    return out


def mutate_s3(rng: random.Random, base: bytes) -> bytes:
    """``base`` mutated in its request target or its signature lines, the rest intact (so
    that the S3 front end, not HTTP's parser, is what answers)."""
    head, _, rest = base.partition(b"\r\n")
    method, target, version = head.split(b" ")
    if rng.random() < 0.5:
        target = mutate(rng, target).translate(None, b" \r\n") or b"/"
        return method + b" " + target + b" " + version + b"\r\n" + rest
    lines = rest.split(b"\r\n")
    signed = [i for i, ln in enumerate(lines) if ln.lower().startswith((b"authorization:",
                                                                       b"x-amz-"))]
    if not signed:
        return mutate_s3(rng, base)
    i = rng.choice(signed)
    name, _, value = lines[i].partition(b":")
    lines[i] = name + b":" + (mutate(rng, value).translate(None, b"\r\n") or b"x")
    return head + b"\r\n" + b"\r\n".join(lines)


async def test_mutated_s3_requests(
    front: Front, server_errors: Callable[[], list[str]],
    record_property: Callable[[str, object], None],
) -> None:
    rng = random.Random(f"{SEED}-{front.kind}")
    bases = templates(front)
    payloads = [mutate_s3(rng, rng.choice(bases)) for _ in range(MUTATED_PER_FRONT)]
    record_property("requests_sent", len(payloads))
    gate = asyncio.Semaphore(16)

    async def one(payload: bytes) -> list[str]:
        async with gate:
            try:
                ex = await exchange(front.port, payload, wait=0.5)
            except AssertionError as exc:
                return [f"{payload[:120]!r}: {exc}"]
        problems = s3_problems(ex, payload.startswith(b"HEAD "))
        for reply in ex.replies:
            # A mutated request that still reads must read the right bytes.
            if reply.status == 200 and payload.startswith(b"GET /ds/small.bin") and (
                    b"?" not in payload.split(b" ")[1]):
                problems += [] if reply.body == front.files["ds/small.bin"] else [
                    "wrong bytes"]
        return [f"{payload[:120]!r}: {p}" for p in problems]

    found = [p for ps in await asyncio.gather(*(one(p) for p in payloads)) for p in ps]
    assert not found, "\n".join(found[:40])
    await no_request_left_in_a_handler_of(front.spoke)
    await healthy_and_correct(front)
    assert not server_errors(), "\n".join(server_errors()[:30])


# ---------------------------------------------------------------------------


async def healthy_and_correct(front: Front) -> None:
    """Ranged and whole reads, through S3 and through /objects, are right."""
    big = front.files["ds/big.bin"]
    async with aiohttp.ClientSession() as http:
        for target, extra, want, status in (
                (b"/ds/big.bin", {"Range": "bytes=65000-200000"}, big[65000:200001], 206),
                (b"/ds/big.bin", {}, big, 200),
                (b"/ds/small.bin", {}, front.files["ds/small.bin"], 200)):
            payload = signed_get(front, target, extra)
            ex = await exchange(front.port, payload)
            assert ex.statuses == [status], ex.replies[:1]
            assert ex.replies[0].body == want
        async with http.get(f"{front.spoke.url}/objects/ds/big.bin",
                            headers={"Range": "bytes=-1000"}) as resp:
            assert resp.status == 206 and await resp.read() == big[-1000:]


# ---------------------------------------------------------------------------
# found by this fuzzing, open (see each test): they fail until the front end is fixed

QUERY_ENCODINGS = [b"/ds/small.bin?%zz=1", b"/ds/small.bin?a=%", b"/ds/small.bin?a=%4",
                   b"/ds/?list-type=2&prefix=%zz", b"/ds/?prefix=ab%g1"]


async def test_invalid_percent_encoding_in_a_query_is_a_4xx(front: Front) -> None:
    """protocol.s3.requests.parse_query says so, but parse_qsl leaves a ``%`` that is not
    followed by two hex digits as it is: the request was answered 200."""
    for target in QUERY_ENCODINGS:
        ex = await exchange(front.port, signed_get(front, target))
        # (Signed, the signature may fail first: botocore signs the query re-encoded.)
        assert len(ex.statuses) == 1 and ex.statuses[0] in range(400, 500), (
            target, ex.replies[:1])
        assert s3_problems(ex, head=False) == []


@pytest.mark.parametrize("front", ["sigv4"], indirect=True)
async def test_two_authorization_headers_are_refused(front: Front) -> None:
    """With SigV4 required, a second Authorization header (not a list header, RFC 9110
    §11.6.2) makes the request ambiguous: a proxy may check one, the spoke the other.
    The spoke took the first and answered 200. (Anonymous, signatures go unchecked.)"""
    good = sign_headers(f"http://{HOST}/ds/small.bin")
    for extra in (b"Authorization: AWS4-HMAC-SHA256 x\r\n", b"Authorization: Bearer y\r\n"):
        for lines in (good + extra, extra + good):
            ex = await exchange(front.port, raw(b"/ds/small.bin", headers=lines))
            assert len(ex.statuses) == 1 and ex.statuses[0] in range(400, 500), ex.replies[:1]
            assert s3_problems(ex, head=False) == []
