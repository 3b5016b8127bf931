"""protocol.s3.requests: addressing, operations, list parameters and pages, without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import BadPath
from protocol.s3.errors import (
    InvalidArgument,
    InvalidBucketName,
    MethodNotAllowed,
    OperationNotImplemented,
)
from protocol.s3.requests import (
    Entry,
    ListParams,
    Operation,
    Target,
    bucket_from_host,
    buckets,
    decode_token,
    encode_token,
    list_page,
    list_params,
    operation,
    parse_query,
    target,
)


def test_path_style_and_virtual_hosted_targets() -> None:
    assert target("/", None) == Target(None, None)
    assert target("/ds", None) == Target("ds", None)
    assert target("/ds/", None) == Target("ds", None)
    assert target("/ds/a/b%20c.bin", None) == Target("ds", "a/b c.bin")
    assert target("/a/b.bin", "ds") == Target("ds", "a/b.bin")
    assert target("/", "ds") == Target("ds", None)
    assert target("/ds/a+b", None).path == "ds/a+b"
    assert target("/ds/dir/", None) == Target("ds", "dir/")


@pytest.mark.parametrize("raw", ["/ds/../x", "/ds/%2e%2e/x", "/ds/%252E%252E/x", "/ds/a//b",
                                 "/ds/%ff", "/ds/a%00b", "/ds/a%5cb", "/ds/..%2fx"])
def test_bad_keys(raw: str) -> None:
    with pytest.raises(BadPath):
        target(raw, None)


@pytest.mark.parametrize("raw", ["/../x", "/%2e%2e/x", "//x", "/a%2fb/x", "/%ff/x", "/./x"])
def test_bad_buckets(raw: str) -> None:
    with pytest.raises(InvalidBucketName):
        target(raw, None)


def test_bucket_from_host() -> None:
    assert bucket_from_host("ds.s3.test", "s3.test") == "ds"
    assert bucket_from_host("DS.S3.test:8702", "s3.test") == "ds"
    assert bucket_from_host("s3.test:8702", "s3.test") is None
    assert bucket_from_host("127.0.0.1:8702", "s3.test") is None
    assert bucket_from_host("ds.s3.test", None) is None
    assert bucket_from_host("a.b.s3.test", "s3.test") == "a.b"
    with pytest.raises(InvalidBucketName):
        target("/x", bucket_from_host("a%2fb.s3.test", "s3.test"))


@pytest.mark.parametrize(("method", "where", "query", "op"), [
    ("GET", Target(None, None), "", Operation.LIST_BUCKETS),
    ("HEAD", Target("b", None), "", Operation.HEAD_BUCKET),
    ("GET", Target("b", None), "location", Operation.GET_BUCKET_LOCATION),
    ("GET", Target("b", None), "list-type=2&prefix=a", Operation.LIST_OBJECTS_V2),
    ("GET", Target("b", None), "marker=a", Operation.LIST_OBJECTS),
    ("GET", Target("b", "k"), "x-id=GetObject", Operation.GET_OBJECT),
    ("GET", Target("b", "k"), "versionId=null", Operation.GET_OBJECT),
    ("GET", Target("b", "k"), "X-Amz-Signature=ab&X-Amz-Expires=5", Operation.GET_OBJECT),
    ("HEAD", Target("b", "k"), "", Operation.HEAD_OBJECT),
])
def test_operations(method: str, where: Target, query: str, op: Operation) -> None:
    assert operation(method, where, parse_query(query)) is op


@pytest.mark.parametrize(("method", "where", "query", "error"), [
    ("PUT", Target("b", "k"), "", OperationNotImplemented),
    ("DELETE", Target("b", None), "", OperationNotImplemented),
    ("POST", Target("b", "k"), "uploads", OperationNotImplemented),
    ("GET", Target("b", "k"), "acl", OperationNotImplemented),
    ("GET", Target("b", None), "versions", OperationNotImplemented),
    ("GET", Target("b", "k"), "versionId=3", OperationNotImplemented),
    ("PATCH", Target("b", "k"), "", MethodNotAllowed),
    ("HEAD", Target(None, None), "", MethodNotAllowed),
    ("GET", Target("b", None), "list-type=1", InvalidArgument),
])
def test_refused_operations(method: str, where: Target, query: str, error: type) -> None:
    with pytest.raises(error):
        operation(method, where, parse_query(query))


@pytest.mark.parametrize("query", ["a=%ff", "a=1&a=2", "a=%00",
                                   "&".join(f"p{i}" for i in range(65))])
def test_bad_queries(query: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_query(query)


def test_list_params() -> None:
    p = list_params(parse_query("list-type=2&prefix=a/&delimiter=/&max-keys=5000"), v2=True)
    assert (p.prefix, p.delimiter, p.max_keys, p.after) == ("a/", "/", 1000, "")
    token = encode_token("a/x")
    p = list_params({"continuation-token": token, "start-after": "z"}, v2=True)
    assert p.after == "a/x" and p.continuation_token == token and p.start_after == "z"
    p = list_params({"marker": "m", "encoding-type": "url"}, v2=False)
    assert p.after == "m" and p.encode_url
    for bad in ({"max-keys": "x"}, {"max-keys": "-1"}, {"max-keys": "2147483648"},
                {"max-keys": "١٢"}, {"encoding-type": "b64"}, {"delimiter": "ab"},
                {"prefix": "../x"}, {"continuation-token": "bm9wZQ=="}):
        with pytest.raises(InvalidArgument):
            list_params(bad, v2=True)


@given(st.text())
def test_tokens_round_trip(key: str) -> None:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return
    assert decode_token(encode_token(key)) == key


KEYS = ["a/1", "a/2", "b", "c/x/1", "c/y", "d"]


def _entries(keys: list[str]) -> list[Entry]:
    return [Entry(k, 1, '"e"') for k in keys]


def _walk(params: ListParams) -> tuple[list[str], list[str]]:
    """Every page, following the last key as a client following tokens would."""
    keys: list[str] = []
    prefixes: list[str] = []
    after = params.after
    for _ in range(100):
        page = list_page(_entries(KEYS), ListParams(params.v2, params.prefix, params.delimiter,
                                                    params.max_keys, after))
        keys += [e.key for e in page.contents]
        prefixes += list(page.common_prefixes)
        if not page.truncated:
            return keys, prefixes
        after = page.last
    raise AssertionError("no end")


@pytest.mark.parametrize("size", [1, 2, 3, 1000])
def test_pages_cover_everything_once(size: int) -> None:
    assert _walk(ListParams(True, max_keys=size)) == (KEYS, [])
    assert _walk(ListParams(True, delimiter="/", max_keys=size)) == (["b", "d"], ["a/", "c/"])
    assert _walk(ListParams(True, prefix="c/", delimiter="/", max_keys=size)) == (
        ["c/y"], ["c/x/"])
    assert _walk(ListParams(True, prefix="c", max_keys=size)) == (["c/x/1", "c/y"], [])


def test_page_fields() -> None:
    page = list_page(_entries(KEYS), ListParams(True, delimiter="/", max_keys=1))
    assert page.common_prefixes == ("a/",) and page.truncated and page.last == "a/"
    assert page.count == 1
    page = list_page(_entries(KEYS), ListParams(True, max_keys=0))
    assert page.count == 0 and page.truncated
    page = list_page([], ListParams(True, max_keys=0))
    assert not page.truncated


def test_buckets_are_first_segments() -> None:
    assert buckets(["top.bin", "ds/a", "ds/b/c", "zz/x", "aa/y"]) == ["aa", "ds", "zz"]
