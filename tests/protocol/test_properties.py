"""Hypothesis property tests for :mod:`protocol` (model checks where a model is cheap)."""

from __future__ import annotations

import re
from urllib.parse import unquote

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.chunks import chunk_bounds, chunk_count, chunk_slices
from protocol.conditional import (
    NS,
    PreconditionFailed,
    evaluate_preconditions,
    http_date,
    if_range_holds,
    parse_http_date,
)
from protocol.digests import DEFAULT_DIGEST_ALG, digest, digest_algorithms
from protocol.errors import BadPath, BadSize, ManifestError, RangeNotSatisfiable, TooManyRanges
from protocol.manifest import Manifest, decode_manifest, encode_manifest
from protocol.paths import validate_path
from protocol.ranges import ByteRange, parse_range, range_header
from protocol.response import Representation, ResponsePlan, plan_response
from protocol.sizes import parse_size

SETTINGS = settings(max_examples=300, deadline=None, database=None)

sizes = st.integers(min_value=0, max_value=10_000) | st.integers(min_value=0, max_value=1 << 64)
range_alphabet = st.sampled_from(list("0123456789-,= \tbytesBYTESx٣²０"))
range_headers = (
    st.text(max_size=60)
    | st.text(alphabet=range_alphabet, max_size=40)
    | st.text(alphabet=range_alphabet, max_size=40).map(lambda t: "bytes=" + t)
)


@SETTINGS
@given(header=range_headers, size=sizes)
def test_parse_range_results_are_within_the_object(header: str, size: int) -> None:
    try:
        result = parse_range(header, size)
    except RangeNotSatisfiable as exc:
        assert exc.size == size
        return
    except TooManyRanges:
        return
    if result is not None:
        assert result, "a parsed header yields at least one range"
        for r in result:
            assert 0 <= r.start < r.stop <= size


# One range-spec as (first, last): first None is a suffix range, last None is open.
positions = st.integers(min_value=0, max_value=40) | st.integers(min_value=0, max_value=10**25)
specs = st.one_of(
    st.tuples(positions, positions | st.none()),
    st.tuples(st.none(), positions),
)


def _spec_text(spec: tuple[int | None, int | None]) -> str:
    first, last = spec
    return f"{'' if first is None else first}-{'' if last is None else last}"


def _model(
    spec_list: list[tuple[int | None, int | None]], size: int
) -> list[tuple[int, int]] | str | None:
    """Reference resolution, by the byte positions each spec selects."""
    if any(f is not None and n is not None and n < f for f, n in spec_list):
        return None
    out = []
    for first, last in spec_list:
        if first is None:
            assert last is not None
            selected = [i for i in range(size) if i >= size - last]
        else:
            end = size if last is None else last + 1
            selected = [i for i in range(size) if first <= i < end]
        if selected:
            out.append((selected[0], selected[-1] + 1))
    return out or "416"


@SETTINGS
@given(spec_list=st.lists(specs, min_size=1, max_size=6), size=st.integers(0, 40))
def test_parse_range_matches_model(
    spec_list: list[tuple[int | None, int | None]], size: int
) -> None:
    header = "bytes=" + ", ".join(_spec_text(s) for s in spec_list)
    expected = _model(spec_list, size)
    if isinstance(expected, str):  # "416"
        try:
            parse_range(header, size)
        except RangeNotSatisfiable as exc:
            assert exc.size == size
        else:
            raise AssertionError(f"{header!r} on {size} bytes should be unsatisfiable")
    elif expected is None:
        assert parse_range(header, size) is None
    else:
        assert parse_range(header, size) == [ByteRange(a, b) for a, b in expected]


@SETTINGS
@given(data=st.data(), size=st.integers(1, 1 << 40))
def test_range_header_round_trips(data: st.DataObject, size: int) -> None:
    start = data.draw(st.integers(0, size - 1))
    stop = data.draw(st.integers(start + 1, size))
    assert parse_range(range_header(ByteRange(start, stop)), size) == [ByteRange(start, stop)]


@SETTINGS
@given(data=st.data(), obj=st.binary(max_size=300), chunk_size=st.integers(1, 64))
def test_chunk_slices_reassemble_the_range(
    data: st.DataObject, obj: bytes, chunk_size: int
) -> None:
    size = len(obj)
    start = data.draw(st.integers(0, size))
    stop = data.draw(st.integers(start, size))
    count = chunk_count(size, chunk_size)
    chunks = [obj[i * chunk_size : (i + 1) * chunk_size] for i in range(count)]
    for i, chunk in enumerate(chunks):
        b = chunk_bounds(i, size, chunk_size)
        assert obj[b.start : b.stop] == chunk
    slices = list(chunk_slices(ByteRange(start, stop), size, chunk_size))
    assert b"".join(chunks[s.index][s.start : s.stop] for s in slices) == obj[start:stop]
    if start == stop:
        assert slices == []
    else:
        first, last = start // chunk_size, (stop - 1) // chunk_size
        assert [s.index for s in slices] == list(range(first, last + 1))
    for s in slices:
        assert 0 <= s.start < s.stop <= len(chunks[s.index])


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def manifests(draw: st.DrawFn) -> tuple[Manifest, bytes]:
    obj = draw(st.binary(max_size=200))
    chunk_size = draw(st.integers(1, 64))
    alg = draw(st.sampled_from(["xxh3-128", "sha256", "blake3"]))
    path = draw(st.sampled_from(["a", "dataset/shard-0001.bin", "données/日本.bin"]))
    etag = '"' + draw(st.text(alphabet="0123456789abcdef", max_size=24)) + '"'
    digests = tuple(digest(alg, obj[i : i + chunk_size]) for i in range(0, len(obj), chunk_size))
    m = Manifest(
        path=path,
        size=len(obj),
        etag=etag,
        chunk_size=chunk_size,
        digest_alg=alg,
        digests=digests,
        mtime=draw(st.integers(0, 1 << 40)),
    )
    return m, obj


@SETTINGS
@given(manifests())
def test_manifest_round_trips(generated: tuple[Manifest, bytes]) -> None:
    m, _ = generated
    assert decode_manifest(encode_manifest(m)) == m
    assert m.chunk_count == chunk_count(m.size, m.chunk_size)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_decode_manifest_raises_only_manifest_error(data: bytes) -> None:
    try:
        m = decode_manifest(data)
    except ManifestError:
        return
    assert isinstance(m, Manifest)


@SETTINGS
@given(
    generated=manifests(),
    key=st.sampled_from(["path", "size", "etag", "chunk_size", "digest_alg", "digests", "mtime"]),
    value=msgpack_values,
)
def test_decode_manifest_with_any_field_value(
    generated: tuple[Manifest, bytes], key: str, value: object
) -> None:
    raw = msgpack.unpackb(encode_manifest(generated[0]), raw=False)
    raw[key] = value
    try:
        m = decode_manifest(msgpack.packb(raw, use_bin_type=True))
    except ManifestError:
        return
    got = getattr(m, key)
    assert (list(got) if key == "digests" else got) == value
    assert type(m.size) is int and type(m.chunk_size) is int and type(m.mtime) is int


@SETTINGS
@given(generated=manifests(), data=st.data())
def test_decode_manifest_on_corrupted_bytes(
    generated: tuple[Manifest, bytes], data: st.DataObject
) -> None:
    good = bytearray(encode_manifest(generated[0]))
    i = data.draw(st.integers(0, len(good) - 1))
    good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    try:
        m = decode_manifest(bytes(good[:cut]))
    except ManifestError:
        return
    assert isinstance(m, Manifest)
    assert len(m.digests) == chunk_count(m.size, m.chunk_size)


def _all_decodings(segment: str) -> list[str]:
    forms = [segment]
    while len(forms) < 20:
        decoded = unquote(forms[-1], errors="surrogateescape")
        if decoded == forms[-1]:
            return forms
        forms.append(decoded)
    raise AssertionError(f"{segment!r} still decodes after 20 rounds")


path_alphabet = st.sampled_from(list("ab./%25ef2E0\\\x00\x1fé日"))
path_texts = st.text(max_size=40) | st.text(alphabet=path_alphabet, max_size=30)


@SETTINGS
@given(path=path_texts)
def test_validate_path_accepts_only_safe_paths(path: str) -> None:
    try:
        result = validate_path(path)
    except BadPath:
        return
    assert result == path
    assert not path.startswith("/")
    for segment in path.split("/"):
        assert segment
        for form in _all_decodings(segment):
            assert form not in (".", "..")
            assert "\x00" not in form and "\\" not in form and "/" not in form


@SETTINGS
@given(path=st.sampled_from([".", ".."]), rounds=st.integers(1, 8), lower=st.booleans())
def test_validate_path_refuses_dots_in_any_encoding(path: str, rounds: int, lower: bool) -> None:
    encoded = path.replace(".", "%2e" if lower else "%2E")
    for _ in range(rounds - 1):
        encoded = encoded.replace("%", "%25")
    try:
        validate_path(f"a/{encoded}/b")
    except BadPath:
        return
    raise AssertionError(f"accepted {encoded!r}")


size_texts = st.text(max_size=30) | st.from_regex(
    r"\s*[0-9]{0,25}(\.[0-9]{0,6})?\s*[A-Za-z]{0,4}\s*", fullmatch=True
)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20}
_UNITS |= {"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}


@SETTINGS
@given(text=size_texts)
def test_parse_size_raises_only_bad_size(text: str) -> None:
    try:
        value = parse_size(text)
    except BadSize:
        return
    assert type(value) is int and value >= 0
    exact = re.fullmatch(r"\s*([0-9]+)\s*([A-Za-z]*)\s*", text, flags=re.ASCII)
    if exact:
        assert value == int(exact.group(1)) * _UNITS[exact.group(2).lower()]


@SETTINGS
@given(text=st.text(max_size=40))
def test_parse_http_date_returns_int_or_none(text: str) -> None:
    assert parse_http_date(text) is None or type(parse_http_date(text)) is int


@SETTINGS
@given(epoch=st.integers(0, 253402300799))
def test_http_date_round_trips(epoch: int) -> None:
    assert parse_http_date(http_date(epoch)) == epoch


header_names = st.sampled_from(
    ["If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range"]
)
header_values = st.text(max_size=30) | st.sampled_from(
    ['"v1"', '"v2"', 'W/"v1"', "*", "Sun, 06 Nov 1994 08:49:37 GMT", "bytes=0-3", "bytes=1-2,5-"]
)


@SETTINGS
@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT"]),
    headers=st.dictionaries(header_names, header_values, max_size=6),
)
def test_preconditions_outcomes(method: str, headers: dict[str, str]) -> None:
    try:
        status = evaluate_preconditions(method, headers, '"v1"', 784111777 * NS, NOW)
    except PreconditionFailed:
        return
    assert status is None or (status == 304 and method in ("GET", "HEAD"))
    assert if_range_holds(headers, '"v1"', 784111777 * NS, NOW) in (True, False)


BOUNDARY = "7d4a1c9e0b2f43a8"
NOW = 784111777 + 86400  # the Date of the answers: a day after the version


def _parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    delimiter = b"\r\n--" + BOUNDARY.encode()
    pieces = (b"\r\n" + body).split(delimiter)
    assert pieces[0] == b"" and pieces[-1] == b"--\r\n"
    parts = []
    for piece in pieces[1:-1]:
        head, sep, payload = piece.partition(b"\r\n\r\n")
        assert sep
        lines = head.split(b"\r\n")
        assert lines[0] == b""
        assert lines[1] == b"Content-Type: " + content_type.encode()
        assert lines[2].startswith(b"Content-Range: ") and len(lines) == 3
        parts.append((lines[2][len(b"Content-Range: ") :].decode(), payload))
    return parts


@SETTINGS
@given(
    obj=st.binary(max_size=64),
    spec_list=st.lists(specs, min_size=1, max_size=5),
    extra=st.dictionaries(header_names, header_values, max_size=2),
)
def test_plan_body_is_what_the_headers_say(
    obj: bytes, spec_list: list[tuple[int | None, int | None]], extra: dict[str, str]
) -> None:
    rep = Representation(size=len(obj), etag='"v1"', mtime_ns=784111777 * NS)
    headers = {**extra, "Range": "bytes=" + ",".join(_spec_text(s) for s in spec_list)}
    try:
        plan = plan_response("GET", headers, rep, BOUNDARY, NOW)
    except (PreconditionFailed, RangeNotSatisfiable, TooManyRanges):
        return
    without_range = {k: v for k, v in headers.items() if k != "Range"}
    assert plan_response("HEAD", headers, rep, BOUNDARY, NOW) == plan_response(
        "GET", without_range, rep, BOUNDARY, NOW
    )
    fields = dict(plan.headers)
    assert len(fields) == len(plan.headers)
    assert fields["Accept-Ranges"] == "bytes" and fields["ETag"] == '"v1"'
    body = b"".join(p if isinstance(p, bytes) else obj[p.start : p.stop] for p in plan.body)
    assert len(body) == plan.content_length
    if plan.status == 304:
        assert plan.body == ()
        return
    assert fields["Content-Length"] == str(len(body))
    if plan.status == 200:
        assert body == obj and "Content-Range" not in fields
        return
    assert plan.status == 206
    if "Content-Range" in fields:  # single part
        single = re.fullmatch(rf"bytes (\d+)-(\d+)/{len(obj)}", fields["Content-Range"])
        assert single is not None
        assert body == obj[int(single.group(1)) : int(single.group(2)) + 1]
        return
    assert fields["Content-Type"] == f"multipart/byteranges; boundary={BOUNDARY}"
    parts = _parse_multipart(body, rep.content_type)
    assert len(parts) >= 2
    covered: set[int] = set()
    for content_range, payload in parts:
        m = re.fullmatch(rf"bytes (\d+)-(\d+)/{len(obj)}", content_range)
        assert m is not None
        first, last = int(m.group(1)), int(m.group(2))
        assert payload == obj[first : last + 1]
        span = set(range(first, last + 1))
        assert not covered & span, "multipart parts never repeat object bytes"
        covered |= span


@SETTINGS
@given(data=st.binary(max_size=200))
def test_digests_are_deterministic_and_sized(data: bytes) -> None:
    sizes_ = {"xxh3-128": 16, "sha256": 32, "blake3": 32}
    assert DEFAULT_DIGEST_ALG in digest_algorithms()
    for alg in digest_algorithms():
        d = digest(alg, data)
        assert len(d) == sizes_[alg]
        assert digest(alg, memoryview(data)) == d
        assert digest(alg, data + b"x") != d


def test_plan_response_plan_type() -> None:
    plan = plan_response("GET", {}, Representation(3, '"v1"', 0), BOUNDARY, NOW)
    assert plan == ResponsePlan(
        200,
        (
            ("Accept-Ranges", "bytes"),
            ("ETag", '"v1"'),
            ("Last-Modified", "Thu, 01 Jan 1970 00:00:00 GMT"),
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", "3"),
        ),
        (ByteRange(0, 3),),
    )
