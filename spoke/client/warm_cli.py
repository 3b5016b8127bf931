"""``python -m spoke warm``: start a pre-warm job on a spoke and show its progress.

Exits 0 when every chunk is cached, 1 when the job failed or was cancelled, 2
when the spoke could not be asked. Ctrl-C cancels the job on the spoke.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tqdm import tqdm

POLL_INTERVAL_S = 0.5


_headers = {"Content-Type": "application/json"}


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=_headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def run_warm(
    spoke: str, paths: list[str] | None, prefix: str | None, quiet: bool,
    token_file: str | None = None,
) -> int:
    spoke = spoke.rstrip("/")
    if token_file:
        with open(token_file, encoding="ascii") as f:
            _headers["Authorization"] = f"Bearer {f.read().strip()}"
    body: dict[str, Any] = {"paths": paths} if paths else {"prefix": prefix or ""}
    try:
        job = _call("POST", f"{spoke}/warm", body)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"cannot start a warm job on {spoke}: {_reason(exc)}", file=sys.stderr)
        return 2
    try:
        job = _follow(spoke, job, quiet)
    except KeyboardInterrupt:
        job = _call("DELETE", f"{spoke}/warm/{job['id']}")
    for error in job["errors"]:
        print(f"error: {error}", file=sys.stderr)
    print(f"warm job {job['id']} {job['state']}: {job['chunks_done']}/{job['chunks_total']} "
          f"chunks, {job['bytes_done']} bytes in {job['elapsed_s']:.1f} s, "
          f"{job['error_count']} errors", file=sys.stderr)
    return 0 if job["state"] == "done" else 1


def _follow(spoke: str, job: dict[str, Any], quiet: bool) -> dict[str, Any]:
    with tqdm(total=job["bytes_total"] or None, unit="B", unit_scale=True,
              desc=f"warm {job['id']}", disable=quiet, file=sys.stderr) as bar:
        while True:
            bar.total = job["bytes_total"] or bar.total
            bar.n = job["bytes_done"]
            bar.set_postfix(chunks=f"{job['chunks_done']}/{job['chunks_total']}",
                            errors=job["error_count"])
            bar.refresh()
            if job["state"] != "running":
                return job
            time.sleep(POLL_INTERVAL_S)
            job = _call("GET", f"{spoke}/warm/{job['id']}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        try:
            return str(json.loads(exc.read()).get("detail", exc))
        except ValueError:
            return str(exc)
    return str(exc)
