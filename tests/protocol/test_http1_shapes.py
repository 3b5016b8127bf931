"""The request-head reader's memory of head shapes: a head read after another of the same
shape (the same bytes but for its ``Range: bytes=`` digits) is read exactly as the
uncached reader, and the reference, read it, whatever was read before it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import http1
from protocol.http1 import MAX_KNOWN_SHAPES, MAX_SHAPED_HEAD_BYTES, Headers, parse_request_head
from tests.protocol.test_http1 import _FIELDS, _REQUEST, reference_reads

Read = tuple[str, str, dict[str, str], bool] | None


def _read(head: bytes | bytearray, with_query: bool = False) -> Read:
    ours = parse_request_head(head, with_query=with_query)
    if ours is None:
        return None
    assert type(ours.headers) is Headers
    return ours.method, ours.target, dict(ours.headers), ours.keep_alive


def _uncached(head: bytes | bytearray, with_query: bool = False) -> Read:
    ours = http1._parse(head, with_query)
    return None if ours is None else (ours.method, ours.target, dict(ours.headers),
                                      ours.keep_alive)


@pytest.fixture(autouse=True)
def _no_shapes_known() -> None:
    for shapes in http1._shapes:
        shapes.clear()


# Range values: digits and their separators mostly, and near misses (whitespace, a bare
# CR or LF, a control byte, a letter) that must never be taken for digits.
_DIGITS = st.text("0123456789,-", max_size=24)
_RANGE_VALUE = st.one_of(
    _DIGITS, _DIGITS, _DIGITS,
    st.tuples(_DIGITS, st.sampled_from([" ", "\t", "\r", "\n", "\r\n", "\r\n ", "\x00", "\x7f",
                                        "\xff", "a", "=", "bytes="]), _DIGITS).map("".join),
)
_RANGE_FIELD = st.sampled_from(["\r\nRange: bytes=", "\r\nRange: bytes=", "\r\nrange: bytes=",
                                "\r\nRange:bytes=", "\r\nRange: bytes= ", "\r\nRange: Bytes=",
                                "\r\nRange : bytes=", "\nRange: bytes="])


@settings(max_examples=500, deadline=None)
@given(
    request=_REQUEST,
    host=st.sampled_from(["\r\nHost: h", "\r\nhost:h ", "\r\nHOST:\t127.0.0.1:8080", ""]),
    before=_FIELDS, after=_FIELDS, field=_RANGE_FIELD,
    values=st.lists(_RANGE_VALUE, min_size=2, max_size=4),
    with_query=st.booleans(),
)
def test_a_head_of_a_known_shape_reads_as_it_would_unknown(
    request: str, host: str, before: list[tuple[str, str, str, str]],
    after: list[tuple[str, str, str, str]], field: str, values: list[str], with_query: bool,
) -> None:
    start = request + host + "".join(map("".join, before)) + field
    end = "".join(map("".join, after))
    for value in values:
        raw = (start + value + end).encode("latin-1")
        assert _read(raw, with_query) == _uncached(raw, with_query), raw
        if not with_query:
            assert _read(raw) == reference_reads(raw), raw
        assert _read(bytearray(raw), with_query) == _uncached(raw, with_query), raw


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=120), values=st.lists(_DIGITS, min_size=2, max_size=3))
def test_any_bytes_around_a_range_read_as_they_would_unknown(raw: bytes, values: list[str]) -> None:
    cut = len(raw) // 2
    for value in values:
        for head in (raw[:cut] + b"\r\nRange: bytes=" + value.encode() + raw[cut:],
                     b"GET / HTTP/1.1\r\nHost: h\r\nRange: bytes=" + value.encode() + raw):
            assert _read(head) == _uncached(head) == reference_reads(head), head


def test_a_known_shape_is_read_with_its_own_range() -> None:
    first = b"GET /objects/a HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nAccept: */*"
    second = first.replace(b"0-9", b"65536-131071")
    assert _read(first) == ("GET", "/objects/a", {"host": "h", "range": "bytes=0-9",
                                                  "accept": "*/*"}, True)
    assert len(http1._shapes[False]) == 1
    again = parse_request_head(second)
    assert again is not None and again.headers["Range"] == "bytes=65536-131071"
    other = parse_request_head(second)
    assert other is not None and again.headers is not other.headers  # each head's own fields
    assert len(http1._shapes[False]) == 1  # the same shape, remembered once


def test_a_refused_shape_stays_refused_with_other_digits() -> None:
    twice = b"GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nrange: bytes=1-2"
    assert parse_request_head(twice) is None
    assert parse_request_head(twice.replace(b"0-9", b"3-4")) is None
    assert len(http1._shapes[False]) == 1


def test_the_shapes_known_are_bounded() -> None:
    for i in range(MAX_KNOWN_SHAPES * 2 + 3):
        head = b"GET /a%d HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9" % i
        assert _read(head) == reference_reads(head)
        assert len(http1._shapes[False]) <= MAX_KNOWN_SHAPES


def test_a_large_head_is_read_but_not_remembered() -> None:
    head = b"GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\nX: " + b"v" * MAX_SHAPED_HEAD_BYTES
    assert _read(head) == reference_reads(head) is not None
    assert not http1._shapes[False]


@pytest.mark.parametrize("field", [
    b"X-Amz-Date: 20261201T175500Z", b"x-amz-date: 20261201T175500Z",
    b"amz-sdk-invocation-id: 5d0d5f4e-1a2b",
])
def test_a_head_an_sdk_sends_once_is_read_but_not_remembered(field: bytes) -> None:
    head = b"GET /b/k?x-id=GetObject HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n" + field
    assert _read(head, with_query=True) == _uncached(head, with_query=True) is not None
    assert not http1._shapes[True]
    assert _read(head) is None  # a query: not /objects' to read


@pytest.mark.parametrize("field", [
    b"X-Amz-Date: 20261201T175500Z", b"amz-sdk-invocation-id: 5d0d5f4e-1a2b",
])
def test_a_once_only_field_anywhere_among_the_fields_keeps_its_head_unremembered(
    field: bytes,
) -> None:
    head = b"GET /b/k HTTP/1.1\r\n" + field + b"\r\nHost: h\r\nRange: bytes=0-9"
    assert _read(head, with_query=True) == _uncached(head, with_query=True) is not None
    assert not http1._shapes[True]


def test_a_presigned_url_head_is_remembered_whatever_its_query_names() -> None:
    """Its query names X-Amz-Date, and a field may hold "mz-" (a name that is not a
    once-only one): only the fields after the request line are looked at, exactly."""
    query = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20261201T175500Z&"
             "amz-sdk-invocation-id=x&X-Amz-Signature=" + "ab" * 32)
    for first in (0, 10, 20):
        head = (f"GET /b/k?{query} HTTP/1.1\r\nHost: h\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD"
                f"\r\nRange: bytes={first}-{first + 9}").encode()
        read = _read(head, with_query=True)
        assert read == _uncached(head, with_query=True) is not None
        assert read[2]["range"] == f"bytes={first}-{first + 9}"
    assert len(http1._shapes[True]) == 1
