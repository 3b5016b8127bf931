"""``--workers 2 --s3-port 0``: the reader worker serves the S3 port too. A real hub and
spoke as processes, real boto3 clients, SigV4 required. Warm ranged GetObjects are
answered by both processes, byte for byte; what a reader declines (a miss, a listing,
a HeadObject, a missing key, a bad signature, a key out of scope) the owner answers in
S3's words, on the same connection; and the owner's counters hold every answer, the
reader's included."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from loadtest.procs import Process
from tests.s3_clients.endpoints import (
    ACCESS_KEY,
    CHUNK,
    SCOPED_KEY,
    SCOPED_SECRET,
    SECRET_KEY,
    start_hub_process,
    start_s3_spoke,
    write_credentials,
)
from tests.support.servers import write_dataset

WARM = "train/warm.bin"
# New connections, each a client of its own: all on one of two processes by chance: 2 ** -23.
CLIENTS = 24
SETTLE_S = 30.0
_SESSION = boto3.session.Session()


@dataclass
class Spoke:
    process: Process
    http: str
    s3: str
    files: dict[str, bytes]

    def client(self, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Any:
        """A boto3 client of its own (its own connections), of one session (loaded once)."""
        return _SESSION.client(
            "s3", endpoint_url=self.s3, region_name="us-east-1", aws_access_key_id=key,
            aws_secret_access_key=secret,
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                          retries={"max_attempts": 1, "mode": "standard"}))

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http}/stats", timeout=30) as reply:
            doc: dict[str, Any] = json.loads(reply.read())
        return doc

    def metrics(self) -> dict[str, float]:
        """The owner's /metrics, one scrape: ``name{labels}`` (labels sorted) → value."""
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=30) as reply:
            text = reply.read().decode()
        samples = {}
        for line in text.splitlines():
            match = re.fullmatch(r"([a-z0-9_]+)(?:\{([^}]*)\})? (\S+)", line)
            if match:
                labels = ",".join(sorted((match.group(2) or "").split(",")))
                samples[f"{match.group(1)}{{{labels}}}"] = float(match.group(3))
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the owner's /metrics (0 if it has none yet)."""
        return self.metrics().get(sample(name, **labels), 0.0)

    def settled(self, name: str, expected: float, **labels: str) -> float:
        """``name``'s sample once it is ``expected`` (readers report every 50 ms), or
        what it is when the deadline passes."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            value = self.metric(name, **labels)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.05)


def sample(name: str, **labels: str) -> str:
    """A key of :meth:`Spoke.metrics`."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


GETS = sample("spoke_s3_requests_total", operation="GetObject")
HITS = sample("spoke_cache_hits_total")


@pytest.fixture(scope="module")
def spoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spoke]:
    work = tmp_path_factory.mktemp("s3-workers")
    root = work / "data"
    sizes = {WARM: CHUNK * 8 + 5, "other/notes.csv": 3000}
    sizes |= {f"train/cold/c-{i:02d}.bin": CHUNK * 2 + i for i in range(CLIENTS)}
    sizes |= {f"train/list/k-{i:02d}.bin": 10 + i for i in range(5)}
    files = write_dataset(str(root), sizes, seed=21)
    hub = start_hub_process(root, work)
    try:
        process, http, s3 = start_s3_spoke(
            hub, work / "cache", work, write_credentials(work / "creds"), "--workers", "2",
            "--log-level", "warning")
    except BaseException:
        hub.stop()
        raise
    try:
        yield Spoke(process, http, s3, files)
    finally:
        process.stop()
        hub.stop()


def process_of(answer: dict[str, Any]) -> str:
    """The per-process prefix of an answer's x-amz-request-id (service.logs)."""
    rid: str = answer["ResponseMetadata"]["RequestId"]
    return rid[:8]


def ranged(client: Any, key: str, first: int, last: int) -> tuple[dict[str, Any], bytes]:
    answer = client.get_object(Bucket="train", Key=key.removeprefix("train/"),
                               Range=f"bytes={first}-{last}")
    return answer, answer["Body"].read()


def test_warm_ranged_gets_are_answered_by_both_processes_and_counted_by_the_owner(
    spoke: Spoke,
) -> None:
    data = spoke.files[WARM]
    whole = spoke.client().get_object(Bucket="train", Key="warm.bin")["Body"].read()
    assert whole == data  # the owner fetched every chunk
    fetches = spoke.stats()["hub_fetches"]
    label = {"operation": "GetObject"}
    before = spoke.settled("spoke_s3_requests_total", spoke.metric("spoke_s3_requests_total",
                                                                   **label), **label)
    hits_before = spoke.metric("spoke_s3_read_seconds_count", cache="hit")
    labelled_before = spoke.metric("spoke_read_seconds_count", cache="hit", front="s3")
    reads = [(i * 3000, i * 3000 + CHUNK + 99) for i in range(CLIENTS)]  # across chunks
    processes = set()
    for first, last in reads:
        answer, body = ranged(spoke.client(), WARM, first, last)
        assert body == data[first:last + 1]
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert answer["ContentRange"] == f"bytes {first}-{last}/{len(data)}"
        assert answer["ResponseMetadata"]["HTTPHeaders"]["x-cache"] == "HIT"
        processes.add(process_of(answer))
    assert len(processes) == 2
    assert spoke.settled("spoke_s3_requests_total", before + CLIENTS, **label) == \
        before + CLIENTS
    assert spoke.settled("spoke_s3_read_seconds_count", hits_before + CLIENTS, cache="hit") == \
        hits_before + CLIENTS
    assert spoke.settled("spoke_read_seconds_count", labelled_before + CLIENTS, cache="hit",
                         front="s3") == labelled_before + CLIENTS
    assert spoke.stats()["hub_fetches"] == fetches


def test_what_the_reader_declines_the_owner_answers_on_the_same_connection(
    spoke: Spoke,
) -> None:
    warm = spoke.files[WARM]
    spoke.client().get_object(Bucket="train", Key="warm.bin")["Body"].read()
    errors_before = spoke.metric("spoke_s3_errors_total", code="NoSuchKey")
    handed_before = spoke.stats()["handed_over_connections"]
    for i in range(CLIENTS):
        client = spoke.client()  # a connection of its own, kept alive over these requests
        answer, body = ranged(client, WARM, 10, 20)  # a hit first: the reader's, if it has it
        assert body == warm[10:21]
        key = f"train/cold/c-{i:02d}.bin"
        answer, body = ranged(client, key, CHUNK - 5, CHUNK + 5)  # a miss
        assert (answer["ResponseMetadata"]["HTTPStatusCode"], body) == \
            (206, spoke.files[key][CHUNK - 5:CHUNK + 6])
        listed = client.list_objects_v2(Bucket="train", Prefix="list/")
        assert [o["Key"] for o in listed["Contents"]] == [f"list/k-{n:02d}.bin" for n in range(5)]
        head = client.head_object(Bucket="train", Key="warm.bin")
        assert head["ContentLength"] == len(warm)
        with pytest.raises(ClientError) as missing:
            client.get_object(Bucket="train", Key="no-such.bin", Range="bytes=0-9")
        assert missing.value.response["Error"]["Code"] == "NoSuchKey"
        assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        assert missing.value.response["ResponseMetadata"]["RequestId"]
    assert spoke.settled("spoke_s3_errors_total", errors_before + CLIENTS, code="NoSuchKey") == \
        errors_before + CLIENTS
    assert spoke.stats()["handed_over_connections"] > handed_before


def test_a_bad_signature_or_a_key_out_of_scope_is_refused_by_every_process(
    spoke: Spoke,
) -> None:
    spoke.client().get_object(Bucket="train", Key="warm.bin")["Body"].read()
    denied_before = spoke.metric("spoke_s3_errors_total", code="AccessDenied")
    forged_before = spoke.metric("spoke_s3_errors_total", code="SignatureDoesNotMatch")
    for _ in range(CLIENTS // 2):
        # Warm bytes, on a new connection each: a reader holding them must still refuse.
        with pytest.raises(ClientError) as forged:
            ranged(spoke.client(secret="not-the-secret"), WARM, 0, 9)
        assert forged.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        assert forged.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with pytest.raises(ClientError) as denied:
            ranged(spoke.client(SCOPED_KEY, SCOPED_SECRET), WARM, 0, 9)
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
        assert denied.value.response["ResponseMetadata"]["RequestId"]
    assert spoke.settled("spoke_s3_errors_total", denied_before + CLIENTS // 2,
                         code="AccessDenied") == denied_before + CLIENTS // 2
    assert spoke.settled("spoke_s3_errors_total", forged_before + CLIENTS // 2,
                         code="SignatureDoesNotMatch") == forged_before + CLIENTS // 2


def test_a_presigned_url_reads_warm_bytes_from_both_processes(spoke: Spoke) -> None:
    data = spoke.files[WARM]
    spoke.client().get_object(Bucket="train", Key="warm.bin")["Body"].read()
    url = spoke.client().generate_presigned_url(
        "get_object", Params={"Bucket": "train", "Key": "warm.bin"}, ExpiresIn=600)
    processes = set()
    for i in range(CLIENTS):
        request = urllib.request.Request(url, headers={"Range": f"bytes={i}-{i + 999}"})
        with urllib.request.urlopen(request, timeout=30) as reply:  # one connection each
            assert (reply.status, reply.read()) == (206, data[i:i + 1000])
            processes.add(reply.headers["x-amz-request-id"][:8])
    assert len(processes) == 2


def test_the_owner_counts_each_of_the_readers_hits_once(spoke: Spoke) -> None:
    spoke.client().get_object(Bucket="train", Key="warm.bin")["Body"].read()
    before = spoke.metrics()
    fetches = spoke.stats()["hub_fetches"]
    for i in range(CLIENTS):
        ranged(spoke.client(), WARM, i * 100, i * 100 + 99)  # one chunk each
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = spoke.metrics()  # one scrape: the hits and the GetObjects together
        gets = after[GETS] - before[GETS]
        if gets >= CLIENTS or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    # A reader reports its hits with its S3 counts; the last test's may arrive late,
    # but then both ways: every one-chunk GetObject is one hit, none counted twice.
    assert gets >= CLIENTS
    assert after[HITS] - before[HITS] == gets
    assert spoke.stats()["hub_fetches"] == fetches
