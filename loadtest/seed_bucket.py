"""Upload a directory into a bucket, creating the bucket: ``python -m loadtest.seed_bucket``.

The compose file's ``objstore`` profile seeds its store with the sample dataset this
way. Idempotent: a key already there with the same size is skipped. The store may still
be starting: it is asked again until ``--timeout`` runs out.

    python -m loadtest.seed_bucket --from /data --bucket hubspoke --endpoint http://store:8333
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from hub.store.s3 import make_client


def wait_for_store(client: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.list_buckets()
            return
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"seed_bucket: the store never answered: {exc}") from None
            time.sleep(1)  # polling a store that is still starting, bounded by the deadline


def stored_size(client: Any, bucket: str, key: str) -> int | None:
    """The size of ``key`` in the bucket; None when it is not there."""
    try:
        return int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except ClientError:
        return None


def seed(client: Any, source: str, bucket: str, prefix: str) -> tuple[int, int]:
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou",
                                                             "BucketAlreadyExists"):
            raise
    uploaded = skipped = 0
    for dirpath, _, names in os.walk(source):
        for name in sorted(names):
            full = os.path.join(dirpath, name)
            key = prefix + os.path.relpath(full, source).replace(os.sep, "/")
            size = os.path.getsize(full)
            if stored_size(client, bucket, key) == size:
                skipped += 1
                continue
            with open(full, "rb") as f:
                client.put_object(Bucket=bucket, Key=key, Body=f)
            uploaded += 1
    return uploaded, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", required=True, help="directory to upload")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", default="", help="key prefix (ends with / if given)")
    parser.add_argument("--endpoint", default=None, help="default: the AWS environment's")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the store")
    args = parser.parse_args()
    client = make_client(args.endpoint or os.environ.get("AWS_ENDPOINT_URL"), os.environ, 60)
    wait_for_store(client, args.timeout)
    uploaded, skipped = seed(client, args.source, args.bucket, args.prefix)
    print(f"seed_bucket: {uploaded} uploaded, {skipped} already there, into s3://{args.bucket}/"
          f"{args.prefix}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
