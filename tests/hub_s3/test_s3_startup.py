"""A root that cannot be served stops the hub at once with one line naming what is wrong
(the endpoint and the bucket for a store), not a traceback, nor a hub answering 404."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.s3_stores import S3Store
from tests.hub_s3.conftest import BUCKET


def serve(root: str, env: dict[str, str], *flags: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "hub", "serve", "--root", root, "--port", "0", *flags],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )
    return done.returncode, done.stderr


def assert_one_line(err: str, *named: str) -> None:
    assert "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for name in named:
        assert name in err, err


def test_a_missing_bucket_names_it_and_the_endpoint(store: S3Store) -> None:
    code, err = serve("s3://no-such-bucket/some/prefix", store.env())
    assert code == 2
    assert_one_line(err, "no-such-bucket", store.url)


def test_refused_credentials_name_the_endpoint_and_the_bucket(store: S3Store) -> None:
    code, err = serve(f"s3://{BUCKET}", {**store.env(), "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert code == 2
    assert_one_line(err, "refused the credentials", BUCKET, store.url)


def test_an_unreachable_endpoint_names_it_and_the_bucket(store: S3Store) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    code, err = serve(f"s3://{BUCKET}", store.env(), "--s3-endpoint", closed)
    assert code == 2
    assert_one_line(err, "cannot reach", BUCKET, closed)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_the_endpoint_comes_from_the_standard_variables(
    store: S3Store, variable: str
) -> None:
    env = {k: v for k, v in store.env().items() if k != "AWS_ENDPOINT_URL"}
    code, err = serve("s3://no-such-bucket", {**env, variable: store.url})
    assert code == 2
    assert_one_line(err, "no-such-bucket", store.url)


def test_a_missing_directory_is_a_startup_error(tmp_path: Path) -> None:
    code, err = serve(str(tmp_path / "not-there"), {})
    assert code == 2
    assert_one_line(err, "not-there")


def test_a_root_naming_no_bucket_is_a_startup_error() -> None:
    code, err = serve("s3://", {})
    assert code == 2
    assert_one_line(err, "no bucket")


@pytest.mark.parametrize("root", ["gs://bucket/x", "az://container"])
def test_another_schemes_root_is_refused_by_name(root: str) -> None:
    code, err = serve(root, {})
    assert code == 2
    assert_one_line(err, root.partition(":")[0] + "://", "not served")
