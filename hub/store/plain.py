"""A chunk fill's presigned GET to a plain-HTTP store, on kept-alive ``http.client``
connections of its own.

For a store reached over plain HTTP with no proxy (a store next to the hub), botocore's
send and urllib3's pool cost a fill several times what the request itself does (URL
parsing and encoding, header merging, pool keys): a fill's CPU on the hub is mostly
theirs. :mod:`http.client` parses the answer's head as urllib3 does (urllib3 is built
on it) and the body is read, or spliced, from the same objects. Anything over TLS or
through a proxy stays botocore's (its verification, its proxies).

A connection is used again only once its answer was read to its end (the body's
length told by Content-Length); a GET that fails on a kept connection (the store
closed it meanwhile) is sent once more on a new one, as urllib3 does.
"""

from __future__ import annotations

import threading
from http.client import HTTPConnection, HTTPException, HTTPResponse
from typing import Any
from urllib.parse import urlsplit
from urllib.request import getproxies

# Kept-alive connections at most (as many as the store's threads: STORE_CONNECTIONS).
MAX_IDLE = 64


class PlainAnswer:
    """A GET's answer as :class:`hub.store.s3.S3Object` reads one of urllib3's: the
    http.client response (``_fp``), its connection (``connection.sock``), and
    ``release_conn`` once read to its end."""

    def __init__(self, gets: PlainGets, connection: HTTPConnection, response: HTTPResponse
                 ) -> None:
        self._gets = gets
        self.connection: HTTPConnection | None = connection
        self._fp = response

    def read(self, amt: int | None = None) -> bytes:
        return self._fp.read(amt)

    def release_conn(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            self._gets.give_back(connection, self._fp)

    def close(self) -> None:
        connection, self.connection = self.connection, None
        self._fp.close()
        if connection is not None:
            connection.close()


class PlainGets:
    """GETs of presigned URLs of one plain-HTTP store, on connections kept alive."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._idle: list[HTTPConnection] = []
        self._lock = threading.Lock()

    @classmethod
    def for_endpoint(cls, endpoint: str, proxies: object, timeout_s: float) -> PlainGets | None:
        """For a plain-HTTP ``endpoint`` reached without a proxy; None otherwise."""
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname or proxies \
                or getproxies().get("http"):
            return None
        return cls(parts.hostname, parts.port or 80, timeout_s)

    def get(self, url: str, headers: dict[str, str]) -> tuple[int, Any, PlainAnswer] | None:
        """The status, fields and body of a GET of ``url`` (presigned: ``Host`` is the
        one it was signed for); None if it could not be sent or answered."""
        parts = urlsplit(url)
        target = f"{parts.path}?{parts.query}" if parts.query else parts.path
        for fresh in (False, True):
            connection = self._take(fresh)
            try:
                connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
                connection.putheader("Host", parts.netloc)
                for name, value in headers.items():
                    connection.putheader(name, value)
                connection.endheaders()
                response = connection.getresponse()
            except (OSError, HTTPException):
                connection.close()
                if fresh:
                    return None
                continue  # the store had closed the kept connection: once more, anew
            return response.status, response.headers, PlainAnswer(self, connection, response)
        return None

    def _take(self, fresh: bool) -> HTTPConnection:
        if not fresh:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
        return HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def give_back(self, connection: HTTPConnection, response: HTTPResponse) -> None:
        """Keep ``connection`` for another GET if its answer was read to its end."""
        if not response.isclosed() or response.will_close:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
