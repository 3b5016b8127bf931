"""The body of ``POST /plans``: the reads to come and, optionally, the job they belong to.

    {"reads": [[path, offset, length], ...], "job": "run-42/epoch-3"}

``job`` gives a plan an identity its makers choose, so that the ranks of one training
job, each registering the same epoch, share one plan instead of making one each: the
first registration makes it, the others are answered with it. Plan ids stay the
spoke's: the id is derived from the tenant and the job, so two tenants naming the
same job get two plans, and an id says nothing about another tenant's jobs.

The part of ``job`` before its last ``/`` names the series its plans belong to
(``run-42`` above): a series' plans follow one another, so an epoch registered ahead
is taken to start when the one before it ends.
"""

from __future__ import annotations

import hashlib
import re

from protocol.errors import ProtocolError

MAX_JOB_LENGTH = 200
_JOB = re.compile(r"[A-Za-z0-9._:/@+=-]+")


class BadPlanJob(ProtocolError):
    status_hint = 400
    title = "Bad plan job"


def parse_job(value: object) -> str | None:
    """The ``job`` field of a plan request: None when absent, else a checked name."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_JOB_LENGTH \
            or _JOB.fullmatch(value) is None:
        raise BadPlanJob(
            f'"job" must be 1 to {MAX_JOB_LENGTH} characters of letters, digits and '
            f"._:/@+=-, not {str(value)[:80]!r}")
    return value


def job_plan_id(tenant: str, job: str) -> str:
    """The plan id of ``tenant``'s job ``job``: the same for every rank that names it."""
    digest = hashlib.sha256(f"{tenant}\0{job}".encode()).hexdigest()
    return f"job-{digest[:24]}"


def job_series(job: str) -> str:
    """The series of plans ``job`` belongs to: its name up to the last ``/`` (a name
    without one is a series of its own)."""
    series, slash, _ = job.rpartition("/")
    return series if slash and series else job
