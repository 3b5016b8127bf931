"""A real hub and spoke with the spoke's S3 front end on 127.0.0.1, and boto3 clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from aiohttp import web
from botocore import UNSIGNED
from botocore.config import Config

from service.runner import start_site
from spoke.s3.access import S3Access
from spoke.s3.app import make_s3_app
from tests.conftest import SpokeFactory
from tests.support.servers import RunningServer


@dataclass
class S3Front:
    url: str
    spoke: RunningServer
    runner: web.AppRunner

    def client(self, *, signed: bool = True, virtual: bool = False, url: str | None = None,
               key: str = "anything", secret: str = "anything", **config: Any) -> Any:
        """A boto3 S3 client of this front end (blocking: call it in a thread)."""
        return s3_client(url or self.url, signed=signed, virtual=virtual, key=key,
                         secret=secret, **config)


def s3_client(url: str, *, signed: bool = True, virtual: bool = False, key: str = "anything",
              secret: str = "anything", verify: str | None = None, **config: Any) -> Any:
    extra: dict[str, Any] = {"signature_version": UNSIGNED if not signed else "s3v4"}
    return boto3.session.Session().client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret, verify=verify,
        config=Config(s3={"addressing_style": "virtual" if virtual else "path"},
                      retries={"max_attempts": 1, "mode": "standard"}, **extra, **config),
    )


FrontFactory = Callable[..., Awaitable[S3Front]]


@pytest.fixture
async def make_front(make_spoke: SpokeFactory) -> AsyncIterator[FrontFactory]:
    runners: list[web.AppRunner] = []

    async def make(domain: str | None = None, access: S3Access | None = None,
                   **overrides: object) -> S3Front:
        spoke = await make_spoke(**overrides)
        runner, port = await start_site(make_s3_app(spoke.app, domain, access=access),
                                        "127.0.0.1", 0)
        runners.append(runner)
        return S3Front(f"http://127.0.0.1:{port}", spoke, runner)

    yield make
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def front(make_front: FrontFactory) -> S3Front:
    return await make_front()


def _read_get(client: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    answer = client.get_object(**kwargs)
    return answer, answer["Body"].read()


async def get_object(client: Any, **kwargs: Any) -> tuple[dict[str, Any], bytes]:
    """boto3's GetObject and the body it read, off the event loop."""
    import asyncio

    return await asyncio.to_thread(_read_get, client, kwargs)
