"""The loader SDK: async and sync clients, fsspec, torch and the warm CLI.

It speaks hubspoke's HTTP API through :mod:`protocol` only and imports no server wing, so a
loader can install it without the spoke's engine. ``from spoke.client import Client`` is the
public spelling.
"""

from spoke.client.clients import (
    AsyncClient,
    Client,
    HubspokeError,
    InvalidPath,
    ObjectFile,
    ObjectNotFound,
    ObjectStat,
    Unavailable,
    VersionChanged,
)

__all__ = [
    "AsyncClient",
    "Client",
    "HubspokeError",
    "InvalidPath",
    "ObjectFile",
    "ObjectNotFound",
    "ObjectStat",
    "Unavailable",
    "VersionChanged",
]
