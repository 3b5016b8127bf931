"""What the owner and its reader workers tell each other, one record per kind of message.

On the :class:`~spoke.workers.channel.Channel` a message is a msgpack array: its
kind's tag, then the record's fields in order (a record is a ``NamedTuple``, so
:func:`encode` is one list display and msgpack packs nested records as arrays).
:func:`decode` checks the kind, the number of fields and each field's type, with
one parser per field chosen once, here, when the module loads; anything else is a
:class:`BadMessage`, which a receiver drops as it drops bytes that do not unpack.

Owner to reader: :class:`ManifestFresh`, :class:`ManifestGone`,
:class:`ManifestUnknown`, :class:`ChunksAdded`, :class:`ChunksGone`, :class:`Sync`.
Reader to owner: :class:`Ready`, :class:`HandedOver` and :class:`S3HandedOver` (the
connection's descriptor travels with it), :class:`HitsCounted`, :class:`S3Counted`,
:class:`HangUps`, :class:`ChunksVerified`, :class:`ChunksSuspect`, :class:`Synced`,
:class:`ManifestWanted`.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import call
from typing import Any, NamedTuple

from spoke.cache.integrity import Expected


class BadMessage(ValueError):
    """A channel message that is none of these records (a bug on the other side)."""


# -- owner to reader --------------------------------------------------------------


class ManifestFresh(NamedTuple):
    """The owner holds ``path``'s manifest (``wire``: encoded) fresh until ``expires_at``
    (``time.monotonic``; one clock for every process of the machine)."""

    path: str
    wire: bytes
    expires_at: float


class ManifestGone(NamedTuple):
    """``path``'s manifest is forgotten, or not mirrored: reads of it go to the owner."""

    path: str


class ManifestUnknown(NamedTuple):
    """The owner has no fresh manifest of ``path`` to give (the reader asked; hub down...)."""

    path: str


class ToldChunk(NamedTuple):
    """A stored chunk and what its file must hold (see :mod:`spoke.cache.integrity`)."""

    name: str
    expected: Expected


class ChunksAdded(NamedTuple):
    chunks: list[ToldChunk]


class ChunksGone(NamedTuple):
    """Evicted or purged: their bytes must not stay readable on the reader."""

    names: list[str]


class Sync(NamedTuple):
    """Answer :class:`Synced` with ``seq`` once every change told before is applied."""

    seq: int


# -- reader to owner --------------------------------------------------------------


class Ready(NamedTuple):
    """The reader listens on the shared port."""


class HandedOver(NamedTuple):
    """A client's connection, its descriptor attached, and the bytes read of it so far."""

    received: bytes


class S3HandedOver(NamedTuple):
    """:class:`HandedOver`, of a connection to the S3 port (:mod:`spoke.workers.s3`)."""

    received: bytes


class HitsCounted(NamedTuple):
    """What the reader served since its last report: hits per chunk, bytes, the read
    latency histogram's bucket counts and sum, and the paths read (kept fresh)."""

    hits: dict[str, int]
    served_bytes: int
    latency_counts: list[int]
    latency_sum: float
    paths: list[str]


class S3Counted(NamedTuple):
    """The S3 front end's share of what the reader served since its last report (also
    in :class:`HitsCounted`): requests by S3 operation, and the hits' latency
    histogram's bucket counts and sum (``spoke_s3_read_seconds``)."""

    requests: dict[str, int]
    latency_counts: list[int]
    latency_sum: float


class HangUps(NamedTuple):
    """Clients gone mid-answer on the reader, for the owner's ``/metrics``."""

    clients: int


class ChunksVerified(NamedTuple):
    """Chunk files the reader hashed before serving them."""

    files: int
    nbytes: int


class ChunksSuspect(NamedTuple):
    """Chunk files the reader found bad, for the owner to hash again."""

    names: list[str]


class Synced(NamedTuple):
    seq: int


class ManifestWanted(NamedTuple):
    """The reader needs ``path``'s manifest; ``offset``: where the read wanting it
    starts, for the owner to fetch that chunk alongside (:mod:`spoke.cache.early`)."""

    path: str
    offset: int | None


ToReader = ManifestFresh | ManifestGone | ManifestUnknown | ChunksAdded | ChunksGone | Sync
ToOwner = (Ready | HandedOver | S3HandedOver | HitsCounted | S3Counted | HangUps | ChunksVerified
           | ChunksSuspect | Synced | ManifestWanted)
Message = ToReader | ToOwner


# -- the wire ---------------------------------------------------------------------


def encode(message: Message) -> list[Any]:
    """``message`` as the channel sends it: its kind's tag, then its fields."""
    return [_TAGS[type(message)], *message]


def decode(raw: object) -> Message:
    """The record ``raw`` (as the channel unpacked it) encodes; BadMessage if none."""
    if type(raw) is not list or not raw:
        raise BadMessage(f"not a message: {type(raw).__name__}")
    tag = raw[0]
    kind = _KINDS.get(tag) if type(tag) is str else None
    if kind is None:
        raise BadMessage(f"unknown kind of message {tag!r}")
    record, parsers = kind
    if len(raw) != len(parsers) + 1:
        raise BadMessage(f"{tag!r} has {len(raw) - 1} fields, not {len(parsers)}")
    try:
        # tuple's own constructor, fed by map: no Python-level __new__ or loop per message.
        message: Message = tuple.__new__(record, map(call, parsers, raw[1:]))
    except BadMessage as exc:
        raise BadMessage(f"{tag!r}: {exc}") from None
    return message


# -- field parsers: the value, of the record's type, or BadMessage -------------------

Parser = Callable[[Any], Any]


def _wrong(value: object, wanted: str) -> BadMessage:
    return BadMessage(f"{type(value).__name__} where {wanted} belongs")


def _str(value: object) -> str:
    if type(value) is not str:
        raise _wrong(value, "a string")
    return value


def _bytes(value: object) -> bytes:
    if type(value) is not bytes:
        raise _wrong(value, "bytes")
    return value


def _int(value: object) -> int:
    if type(value) is not int:  # not a bool either
        raise _wrong(value, "an integer")
    return value


def _optional_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _float(value: object) -> float:
    if type(value) is float:
        return value
    if type(value) is int:  # msgpack keeps a whole number an integer
        return float(value)
    raise _wrong(value, "a number")


def _list(value: object) -> list[Any]:
    if type(value) is not list:
        raise _wrong(value, "an array")
    return value


def _strs(value: object) -> list[str]:
    items = _list(value)
    if not all(type(item) is str for item in items):
        raise _wrong(next(i for i in items if type(i) is not str), "an array of strings")
    return items


def _ints(value: object) -> list[int]:
    items = _list(value)
    if not all(type(item) is int for item in items):
        raise _wrong(next(i for i in items if type(i) is not int), "an array of integers")
    return items


def _hits(value: object) -> dict[str, int]:
    if type(value) is not dict:
        raise _wrong(value, "a map")
    if not all(type(k) is str and type(n) is int for k, n in value.items()):
        raise BadMessage("a map of names to counts holds something else")
    return value


def _told_chunks(value: object) -> list[ToldChunk]:
    chunks = []
    new = tuple.__new__
    for item in _list(value):
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list \
                or len(item[1]) != 3:
            raise _wrong(item, "a chunk's [name, [size, digest_alg, digest]]")
        name, (size, alg, digest) = item
        if type(name) is not str or type(size) is not int or type(alg) is not str \
                or type(digest) is not bytes:
            kinds = [type(v).__name__ for v in (name, size, alg, digest)]
            raise BadMessage(f"a chunk's fields are {kinds}, not [str, int, str, bytes]")
        chunks.append(new(ToldChunk, (name, new(Expected, (size, alg, digest)))))
    return chunks


_KINDS: dict[str, tuple[type[Any], tuple[Parser, ...]]] = {
    "manifest": (ManifestFresh, (_str, _bytes, _float)),
    "gone": (ManifestGone, (_str,)),
    "unknown": (ManifestUnknown, (_str,)),
    "add": (ChunksAdded, (_told_chunks,)),
    "drop": (ChunksGone, (_strs,)),
    "sync": (Sync, (_int,)),
    "ready": (Ready, ()),
    "conn": (HandedOver, (_bytes,)),
    "s3conn": (S3HandedOver, (_bytes,)),
    "hits": (HitsCounted, (_hits, _int, _ints, _float, _strs)),
    "s3hits": (S3Counted, (_hits, _ints, _float)),
    "hangups": (HangUps, (_int,)),
    "verified": (ChunksVerified, (_int, _int)),
    "suspect": (ChunksSuspect, (_strs,)),
    "synced": (Synced, (_int,)),
    "want": (ManifestWanted, (_str, _optional_int)),
}
_TAGS: dict[type[Any], str] = {record: tag for tag, (record, _) in _KINDS.items()}
