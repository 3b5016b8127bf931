"""Fixtures of the S3 client tests: one dataset tree, and S3 endpoints over it.

``s3`` runs each test twice: against the spoke's S3 front end (hub and spoke started as
processes, SigV4 required) and against rclone's S3 server over the same tree (the proof
that the test itself is right). ``anonymous`` is a spoke with no credentials configured.
The servers live for the session; every test reads its own prefix cold where the cache
matters (``train/by-client/NAME/``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3_clients.endpoints import Endpoint, start_endpoint, write_tree


@pytest.fixture(autouse=True)
def _leaks_show_in_their_own_test() -> Iterator[None]:
    """A client's socket left open fails the test that left it (unraisable warnings are
    errors here), not whichever later test the garbage collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def s3_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("s3-tree")
    return root, write_tree(root)


def _endpoint(kind: str, tree: tuple[Path, dict[str, bytes]],
              factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    endpoint = start_endpoint(kind, tree[0], tree[1], factory.mktemp(f"s3-{kind}"))
    try:
        yield endpoint
    finally:
        endpoint.stop()


@pytest.fixture(scope="session")
def spoke_s3(s3_tree: tuple[Path, dict[str, bytes]],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """The spoke's S3 front end, SigV4 required (also alone, for what rclone does not do:
    scoped keys, the cache)."""
    yield from _endpoint("spoke", s3_tree, tmp_path_factory)


@pytest.fixture(scope="session")
def rclone_s3(s3_tree: tuple[Path, dict[str, bytes]],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    yield from _endpoint("rclone", s3_tree, tmp_path_factory)


@pytest.fixture(params=["spoke", "rclone"])
def s3(request: pytest.FixtureRequest) -> Endpoint:
    endpoint: Endpoint = request.getfixturevalue(f"{request.param}_s3")
    return endpoint


@pytest.fixture(scope="session")
def anonymous(s3_tree: tuple[Path, dict[str, bytes]],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """A spoke with no credentials configured: anonymous reads."""
    yield from _endpoint("spoke-anonymous", s3_tree, tmp_path_factory)
