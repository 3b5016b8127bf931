"""Requests that real botocore signed, caught just before they would go on the wire.

A ``before-send`` handler raises with the prepared request, so nothing is sent; the request's
path, query and headers are exactly what botocore's S3 client would send (Host included, which
the HTTP layer adds from the URL).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config

REGION = "us-east-1"


@dataclass(frozen=True)
class Wire:
    """One signed request as the server sees it."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str:
        return next(v for k, v in self.headers if k.lower() == name.lower())

    def with_header(self, name: str, value: str) -> Wire:
        rest = tuple((k, v) for k, v in self.headers if k.lower() != name.lower())
        return replace(self, headers=(*rest, (name, value)))

    def signed_at(self) -> datetime.datetime:
        if "X-Amz-Date=" in self.query:
            stamp = self.query.split("X-Amz-Date=")[1].split("&")[0]
        else:
            stamp = self.header("X-Amz-Date")
        return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)


class _Caught(Exception):
    def __init__(self, request: Any) -> None:
        super().__init__("caught")
        self.request = request


def _catch(request: Any, **_: Any) -> None:
    raise _Caught(request)


# A client takes a while to build (it loads the service model), and it holds no state we use.
@cache
def client(
    access_key: str, secret: str, *, endpoint: str = "http://127.0.0.1:9000", style: str = "path"
) -> Any:
    c = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=REGION,
        aws_access_key_id=access_key, aws_secret_access_key=secret,
        config=Config(signature_version="s3v4", s3={"addressing_style": style},
                      retries={"max_attempts": 1}),
    )
    c.meta.events.register("before-send.s3.*", _catch)
    return c


def signed(call: Callable[[], object]) -> Wire:
    """The request ``call`` (a method of a :func:`client`) signed and would have sent."""
    try:
        call()
    except _Caught as caught:
        return _wire(caught.request.method, caught.request.url, caught.request.headers.items())
    raise AssertionError("the client sent nothing")


def presigned(url: str) -> Wire:
    """The GET a client sends for presigned ``url``."""
    return _wire("GET", url, [])


def _wire(method: str, url: str, items: Any) -> Wire:
    parts = urlsplit(url)
    headers = [("Host", parts.netloc)]
    for name, value in items:
        text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
        headers.append((name, text))
    return Wire(method, parts.path, parts.query, tuple(headers))
