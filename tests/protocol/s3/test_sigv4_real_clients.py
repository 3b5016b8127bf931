"""protocol.s3.sigv4 verifies the signatures of S3 clients that do not sign with botocore.

rclone (aws-sdk-go-v2), s5cmd (aws-sdk-go) and s3torchconnector (the AWS CRT, aws-c-auth) each
read a few objects with awkward keys from a small recording S3 endpoint on 127.0.0.1; every
request they sent must authenticate, and fail under another secret. The endpoint answers just
enough S3 (an object's bytes, an empty listing) for the clients to finish.
"""

from __future__ import annotations

import datetime
import email.utils
import http.server
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

import pytest

from protocol.s3.credentials import S3Key
from protocol.s3.sigv4 import S3AuthError, authenticate, uri_encode

AK = "AKIAHUBSPOKECLIENTS1"
SECRET = "cLiEnTs/SeCrEt+0123456789abcdefghijKLMN"
KEYS = {AK: S3Key(AK, SECRET, ("",))}
BODY = b"0123456789abcdef"
BUCKET = "ds"
OBJECT_KEYS = ["plain/a.bin", "données/日本語 x.bin", "sp ace/a+b=c~d.bin", "deep/" * 6 + "z"]
CLIENT_TIMEOUT_S = 120


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[Seen]

    def log_message(self, format: str, *args: object) -> None:
        del format, args

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path, _, query = self.path.partition("?")
        headers = tuple(
            (k, v.encode("latin-1").decode("utf-8", "surrogateescape"))
            for k, v in self.headers.items()
        )
        self.seen.append(Seen(self.command, path, query, headers))
        if path.rstrip("/").count("/") <= 1:  # the bucket itself: a listing
            self._send(200, _listing(query), {"Content-Type": "application/xml"}, body)
            return
        common = {
            "ETag": '"0123456789abcdef0123456789abcdef"',
            "Last-Modified": email.utils.formatdate(usegmt=True),
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
        }
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            first, _, last = wanted[6:].partition("-")
            start = int(first or 0)
            stop = min(int(last) + 1 if last else len(BODY), len(BODY))
            common["Content-Range"] = f"bytes {start}-{stop - 1}/{len(BODY)}"
            self._send(206, BODY[start:stop], common, body)
            return
        self._send(200, BODY, common, body)

    def _send(self, status: int, payload: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)


def _listing(query: str) -> bytes:
    """ListObjects(V2) of OBJECT_KEYS: prefix, delimiter and encoding-type=url honoured."""
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    prefix, delimiter = params.get("prefix", ""), params.get("delimiter", "")
    url_encoded = params.get("encoding-type") == "url"

    def name(key: str) -> str:
        return urllib.parse.quote(key, safe="/~") if url_encoded else xml_escape(key)

    contents, common = [], set()
    for key in OBJECT_KEYS:
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if delimiter and delimiter in rest:
            common.add(prefix + rest.split(delimiter)[0] + delimiter)
            continue
        contents.append(
            f"<Contents><Key>{name(key)}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
            f'<ETag>"0123456789abcdef0123456789abcdef"</ETag><Size>{len(BODY)}</Size>'
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    prefixes = "".join(
        f"<CommonPrefixes><Prefix>{name(p)}</Prefix></CommonPrefixes>" for p in sorted(common)
    )
    encoding = "<EncodingType>url</EncodingType>" if url_encoded else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix>{name(prefix)}</Prefix>{encoding}"
        f"<KeyCount>{len(contents) + len(common)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{''.join(contents)}{prefixes}</ListBucketResult>"
    ).encode()


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[Seen]]]:
    seen: list[Seen] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _binary(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (the test extras install it)"
    return found


def _client_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env.update({
        "AWS_ACCESS_KEY_ID": AK, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
        "HOME": str(tmp_path),
    })
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(argv, env=env, capture_output=True, timeout=CLIENT_TIMEOUT_S, check=False)
    assert done.returncode == 0, (argv, done.stderr.decode(errors="replace")[-2000:])
    return done


def _check_all_verify(seen: list[Seen], expected_paths: set[str]) -> None:
    assert seen, "the client sent nothing"
    paths = set()
    for request in seen:
        signed_at = _signed_at(request)
        key = authenticate(
            request.method, request.path, request.query, request.headers, KEYS, signed_at
        )
        assert key.access_key == AK
        wrong = {AK: S3Key(AK, SECRET[::-1], ("",))}
        with pytest.raises(S3AuthError) as caught:
            authenticate(request.method, request.path, request.query, request.headers, wrong,
                         signed_at)
        assert caught.value.code == "SignatureDoesNotMatch"
        paths.add(request.path)
    assert expected_paths <= paths, (expected_paths, paths)


def _signed_at(request: Seen) -> datetime.datetime:
    stamp = next((v for k, v in request.headers if k.lower() == "x-amz-date"), None)
    if stamp is None:
        stamp = request.query.split("X-Amz-Date=")[1].split("&")[0]
    return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)


def _encoded(key: str) -> str:
    return "/" + uri_encode(f"{BUCKET}/{key}", keep_slash=True)


def test_rclone_signatures_verify(endpoint: tuple[str, list[Seen]], tmp_path: Path) -> None:
    url, seen = endpoint
    env = _client_env(tmp_path)
    env.update({
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_CAP_TYPE": "s3", "RCLONE_CONFIG_CAP_PROVIDER": "Other",
        "RCLONE_CONFIG_CAP_ENDPOINT": url, "RCLONE_CONFIG_CAP_ACCESS_KEY_ID": AK,
        "RCLONE_CONFIG_CAP_SECRET_ACCESS_KEY": SECRET, "RCLONE_CONFIG_CAP_REGION": "us-east-1",
        "RCLONE_CONFIG_CAP_FORCE_PATH_STYLE": "true",
    })
    rclone = _binary("rclone")
    common = ["--retries", "1", "--low-level-retries", "1", "--s3-no-check-bucket"]
    for key in OBJECT_KEYS:
        done = _run([rclone, "cat", *common, f"cap:{BUCKET}/{key}"], env)
        assert done.stdout == BODY
    _run([rclone, "lsf", *common, f"cap:{BUCKET}/sp ace/"], env)
    _check_all_verify(seen, {_encoded(k) for k in OBJECT_KEYS})


def test_s5cmd_signatures_verify(endpoint: tuple[str, list[Seen]], tmp_path: Path) -> None:
    url, seen = endpoint
    env = _client_env(tmp_path)
    s5cmd = _binary("s5cmd")
    for key in OBJECT_KEYS:
        done = _run([s5cmd, "--endpoint-url", url, "--retry-count", "1", "cat",
                     f"s3://{BUCKET}/{key}"], env)
        assert done.stdout == BODY
    _run([s5cmd, "--endpoint-url", url, "--retry-count", "1", "ls", f"s3://{BUCKET}/plain/"], env)
    _check_all_verify(seen, {_encoded(k) for k in OBJECT_KEYS})


_S3TORCH_SCRIPT = """
import sys
from s3torchconnector import S3Reader
from s3torchconnector._s3client import S3Client, S3ClientConfig
config = S3ClientConfig(force_path_style=True)
client = S3Client("us-east-1", endpoint=sys.argv[1], s3client_config=config)
for key in sys.argv[2:]:
    reader = client.get_object("ds", key)
    data = reader.read()
    assert data == b"0123456789abcdef", data
print("ok")
"""


def test_s3torchconnector_signatures_verify(
    endpoint: tuple[str, list[Seen]], tmp_path: Path
) -> None:
    url, seen = endpoint
    env = _client_env(tmp_path)
    done = _run([sys.executable, "-c", _S3TORCH_SCRIPT, url, *OBJECT_KEYS], env)
    assert done.stdout.strip().endswith(b"ok")
    _check_all_verify(seen, {_encoded(k) for k in OBJECT_KEYS})
