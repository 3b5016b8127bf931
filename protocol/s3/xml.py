"""S3's XML documents: errors, ListBucketResult (v1 and v2), ListAllMyBucketsResult,
LocationConstraint. Written by hand: each is a few fixed elements, and the text in them
is escaped here, once."""

from __future__ import annotations

from urllib.parse import quote
from xml.sax.saxutils import escape

from protocol.s3.requests import ListPage, ListParams, encode_token

XML_TYPE = "application/xml"
NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
# Hub listings carry no dates; S3's documents require one. A fixed one says "unknown"
# and compares equal on every listing (clients syncing by date see nothing change).
UNKNOWN_DATE = "1970-01-01T00:00:00.000Z"
OWNER_ID = "hubspoke"


def _text(value: str) -> str:
    return escape(value, {'"': "&quot;"})


def _element(name: str, value: str | int | bool) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"<{name}>{_text(str(value))}</{name}>"


def error(code: str, message: str, resource: str, request_id: str) -> bytes:
    """``<Error>``: the body of every error answer."""
    return (
        f"{_DECLARATION}<Error>{_element('Code', code)}{_element('Message', message)}"
        f"{_element('Resource', resource)}{_element('RequestId', request_id)}</Error>"
    ).encode()


def list_bucket_result(bucket: str, params: ListParams, page: ListPage) -> bytes:
    """``<ListBucketResult>`` of a ListObjects (``params.v2``: ListObjectsV2) page."""

    def name(value: str) -> str:
        return quote(value, safe="/~") if params.encode_url else value

    parts = [f'{_DECLARATION}<ListBucketResult xmlns="{NAMESPACE}">', _element("Name", bucket),
             _element("Prefix", name(params.prefix))]
    if params.v2:
        parts.append(_element("KeyCount", page.count))
        if params.continuation_token is not None:
            parts.append(_element("ContinuationToken", params.continuation_token))
        if params.start_after:
            parts.append(_element("StartAfter", name(params.start_after)))
    else:
        parts.append(_element("Marker", name(params.marker)))
    parts.append(_element("MaxKeys", params.max_keys))
    if params.delimiter:
        parts.append(_element("Delimiter", name(params.delimiter)))
    if params.encode_url:
        parts.append(_element("EncodingType", "url"))
    parts.append(_element("IsTruncated", page.truncated))
    if page.truncated:
        if params.v2:
            parts.append(_element("NextContinuationToken", encode_token(page.last)))
        elif params.delimiter:
            parts.append(_element("NextMarker", name(page.last)))
    for entry in page.contents:
        parts.append(
            f"<Contents>{_element('Key', name(entry.key))}"
            f"{_element('LastModified', UNKNOWN_DATE)}{_element('ETag', entry.etag)}"
            f"{_element('Size', entry.size)}{_element('StorageClass', 'STANDARD')}</Contents>"
        )
    for prefix in page.common_prefixes:
        parts.append(f"<CommonPrefixes>{_element('Prefix', name(prefix))}</CommonPrefixes>")
    parts.append("</ListBucketResult>")
    return "".join(parts).encode("utf-8")


def list_all_my_buckets(buckets: list[str]) -> bytes:
    """``<ListAllMyBucketsResult>`` naming ``buckets``."""
    listed = "".join(
        f"<Bucket>{_element('Name', b)}{_element('CreationDate', UNKNOWN_DATE)}</Bucket>"
        for b in buckets
    )
    return (
        f'{_DECLARATION}<ListAllMyBucketsResult xmlns="{NAMESPACE}">'
        f"<Owner>{_element('ID', OWNER_ID)}{_element('DisplayName', OWNER_ID)}</Owner>"
        f"<Buckets>{listed}</Buckets></ListAllMyBucketsResult>"
    ).encode()


def location_constraint(region: str) -> bytes:
    """``<LocationConstraint>``: empty for us-east-1, as S3 has it."""
    value = "" if region == "us-east-1" else _text(region)
    return (
        f'{_DECLARATION}<LocationConstraint xmlns="{NAMESPACE}">{value}</LocationConstraint>'
    ).encode()
