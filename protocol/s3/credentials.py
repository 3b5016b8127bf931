"""S3 access keys and the file that lists them.

The file (``--s3-credentials FILE``) has one key per line::

    # comment
    AKIAEXAMPLE0001  wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY  ds/train,ds/eval
    ADMINKEY         another-secret-of-16-bytes-or-more        ''

three fields separated by whitespace: the access key id, the secret, and a comma-separated list
of prefixes under the hub's root (``bucket/key...``). ``''`` (or ``""``) is the empty prefix,
which allows everything; the third field is required, so a line that forgets its scope is an
error rather than a key that reads everything. Prefixes match on whole segments, exactly as the
HTTP tokens' do (:func:`protocol.auth.path_allowed`): ``ds/train`` allows ``ds/train/a`` and
never ``ds/training/a``.

Errors name the line number and never quote a secret: they reach logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol.auth import MAX_PREFIXES, MIN_SECRET_BYTES, path_allowed
from protocol.errors import BadPath
from protocol.paths import validate_prefix

# The id travels in ``Credential=ID/date/region/s3/aws4_request`` and in logs: no '/', no
# whitespace, nothing that needs escaping. AWS's own ids are 16 to 128 of [A-Z0-9].
_ACCESS_KEY = re.compile(r"[A-Za-z0-9._-]{1,128}")
_EMPTY_PREFIX = frozenset({"''", '""'})


@dataclass(frozen=True, slots=True)
class S3Key:
    """One access key: its secret and the prefixes (``bucket/key...``) it may read."""

    access_key: str
    secret: str = field(repr=False)
    prefixes: tuple[str, ...]

    def allows(self, path: str) -> bool:
        """Whether this key may read object ``path`` (``bucket/key...`` under the hub root)."""
        return any(path_allowed(p, path) for p in self.prefixes)

    def allows_listing(self, prefix: str) -> bool:
        """Whether listing ``prefix`` stays inside this key's prefixes.

        The rule of :func:`protocol.auth.authorize_listing`: a listing prefix is a plain string
        prefix, so it is allowed when its segment-wise form lies inside one of the key's
        prefixes. With ``ds/`` a key may list ``ds``, ``ds/`` and ``ds/shard-0``, but not ``''``
        or ``d``; the listing itself is still filtered with :meth:`allows`.
        """
        base = prefix.removesuffix("/")
        return any(p == "" or (base != "" and path_allowed(p, base)) for p in self.prefixes)


def parse_credentials(text: str) -> dict[str, S3Key]:
    """The keys listed in a credentials file's ``text``, by access key id.

    Raises :class:`ValueError` naming the line of the first bad line.
    """
    keys: dict[str, S3Key] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key = _parse_line(stripped, number)
        if key.access_key in keys:
            raise ValueError(f"line {number}: access key {key.access_key} is listed twice")
        keys[key.access_key] = key
    return keys


def _parse_line(line: str, number: int) -> S3Key:
    fields = line.split()
    if len(fields) != 3:
        raise ValueError(
            f"line {number}: expected ACCESS_KEY_ID SECRET PREFIX[,PREFIX...]"
            f" ('' is everything), got {len(fields)} fields"
        )
    access_key, secret, scope = fields
    if not _ACCESS_KEY.fullmatch(access_key):
        raise ValueError(f"line {number}: an access key id is 1 to 128 of A-Z a-z 0-9 . _ -")
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(
            f"line {number}: the secret of {access_key} is shorter than {MIN_SECRET_BYTES} bytes"
        )
    prefixes = tuple(_parse_prefix(p, number) for p in scope.split(","))
    if len(prefixes) > MAX_PREFIXES:
        raise ValueError(f"line {number}: more than {MAX_PREFIXES} prefixes")
    return S3Key(access_key, secret, prefixes)


def _parse_prefix(text: str, number: int) -> str:
    if text in _EMPTY_PREFIX:
        return ""
    if not text:
        raise ValueError(f"line {number}: an empty prefix is written '' (it allows everything)")
    try:
        return validate_prefix(text.removeprefix("/"))
    except BadPath as exc:
        raise ValueError(f"line {number}: bad prefix {text!r}: {exc}") from None
