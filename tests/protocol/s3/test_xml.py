"""protocol.s3.xml: the documents parse as XML and say what S3's say."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from protocol.s3 import xml
from protocol.s3.requests import Entry, ListPage, ListParams, decode_token

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def test_error_document_escapes_its_text() -> None:
    doc = ET.fromstring(xml.error("NoSuchKey", "no object 'a<&>b'", "/b/a<&>", "rid-1"))
    assert doc.tag == "Error"
    assert [c.tag for c in doc] == ["Code", "Message", "Resource", "RequestId"]
    assert doc.findtext("Message") == "no object 'a<&>b'"
    assert doc.findtext("Resource") == "/b/a<&>"


def _list(params: ListParams, page: ListPage) -> ET.Element:
    return ET.fromstring(xml.list_bucket_result("ds", params, page))


def test_list_v2() -> None:
    page = ListPage((Entry("a&b.bin", 5, '"e1"'),), ("dir/",), True, "dir/")
    doc = _list(ListParams(True, prefix="", delimiter="/", max_keys=2), page)
    assert doc.tag == f"{NS}ListBucketResult"
    assert doc.findtext(f"{NS}KeyCount") == "2"
    assert doc.findtext(f"{NS}IsTruncated") == "true"
    assert decode_token(doc.findtext(f"{NS}NextContinuationToken") or "") == "dir/"
    contents = doc.find(f"{NS}Contents")
    assert contents is not None
    assert contents.findtext(f"{NS}Key") == "a&b.bin"
    assert contents.findtext(f"{NS}ETag") == '"e1"'
    assert contents.findtext(f"{NS}Size") == "5"
    assert doc.findtext(f"{NS}CommonPrefixes/{NS}Prefix") == "dir/"
    assert doc.find(f"{NS}Marker") is None


def test_list_v1_and_url_encoding() -> None:
    page = ListPage((Entry("a b+c.bin", 1, '"e"'),), ("d e/",), True, "d e/")
    doc = _list(ListParams(False, delimiter="/", max_keys=2, encode_url=True, marker="m n"), page)
    assert doc.findtext(f"{NS}Marker") == "m%20n"
    assert doc.findtext(f"{NS}NextMarker") == "d%20e/"
    assert doc.findtext(f"{NS}Contents/{NS}Key") == "a%20b%2Bc.bin"
    assert doc.findtext(f"{NS}EncodingType") == "url"
    assert doc.find(f"{NS}KeyCount") is None
    # Without a delimiter v1 sends no NextMarker: clients resume after the last key.
    doc = _list(ListParams(False, max_keys=1), ListPage((Entry("a", 1, '"e"'),), (), True, "a"))
    assert doc.find(f"{NS}NextMarker") is None


def test_buckets_and_location() -> None:
    doc = ET.fromstring(xml.list_all_my_buckets(["ds", "other"]))
    assert [b.findtext(f"{NS}Name") for b in doc.iter(f"{NS}Bucket")] == ["ds", "other"]
    assert ET.fromstring(xml.location_constraint("us-east-1")).text is None
    assert ET.fromstring(xml.location_constraint("eu-west-1")).text == "eu-west-1"
