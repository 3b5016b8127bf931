"""A proxy: its listener, its connections, and its toxics applied to them live."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from loadtest.toxiproxy_standin.addresses import (
    format_hostport,
    go_port,
    go_split_hostport,
    listen_like_go,
    resolve_tcp_addr,
)
from loadtest.toxiproxy_standin.errors import TOXIC_EXISTS, TOXIC_NOT_FOUND, fail, internal_error
from loadtest.toxiproxy_standin.link import Connection, End
from loadtest.toxiproxy_standin.toxics import DOWNSTREAM, UPSTREAM, Toxic

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # identity semantics: a proxy is a live object, not a value
class Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool = False
    toxics: list[Toxic] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _connections: set[Connection] = field(default_factory=set)
    _accepting: set[asyncio.Task[None]] = field(default_factory=set)
    _epoch: int = 0  # bumped on stop so in-flight accepts know they are stale

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            # Toxiproxy's Proxy has an exported zerolog.Logger with no JSON tag, which
            # marshals as an empty object; clients see it, so it is here too.
            "Logger": {},
            "toxics": [toxic.to_json() for toxic in self.ordered_toxics()],
        }

    def ordered_toxics(self) -> list[Toxic]:
        # Toxiproxy lists the upstream chain first, then the downstream one.
        return [t for t in self.toxics if t.direction == UPSTREAM] + [
            t for t in self.toxics if t.direction == DOWNSTREAM
        ]

    def toxics_for(self, stream: str) -> list[Toxic]:
        return [t for t in self.toxics if t.direction == stream]

    def has_toxic(self, name: str) -> bool:
        return any(t.name == name for t in self.toxics)

    def find_toxic(self, name: str) -> Toxic:
        for toxic in self.toxics:
            if toxic.name == name:
                return toxic
        fail(TOXIC_NOT_FOUND)

    # ---- listening

    async def start(self) -> None:
        if self.enabled:
            return
        # As Toxiproxy: no host (an omitted listen is "") means every interface.
        sock = await listen_like_go(self.listen)
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: End(on_made=self._accepted), sock=sock)
        except OSError as exc:
            sock.close()
            raise internal_error(f"listen tcp {self.listen}: {exc.strerror or exc}") from exc
        self._server = server
        self.listen = format_hostport(server.sockets[0].getsockname())
        self.enabled = True
        logger.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    async def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._epoch += 1
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # Toxiproxy drops live connections when a proxy is disabled.
        for connection in list(self._connections):
            connection.kill()
        for task in list(self._accepting):
            task.cancel()
        if server is not None:
            await server.wait_closed()
        logger.info("proxy %s stopped", self.name)

    async def differs(self, listen: str, upstream: str) -> bool:
        """Toxiproxy 2.12's Proxy.Differs: a listen address that resolves to the one
        bound (``localhost:8666`` for ``127.0.0.1:8666``) is no change."""
        if upstream != self.upstream:
            return True
        if listen == self.listen:
            return False
        try:
            return await resolve_tcp_addr(listen) != self.listen
        except ValueError:
            return True  # the new address will not listen either; say so when it starts

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Toxiproxy's Proxy.Update: a new address restarts the listener (dropping
        connections), then the enabled flag is applied."""
        if await self.differs(listen, upstream):
            await self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled and not self.enabled:
            await self.start()
        elif not enabled:
            await self.stop()

    def _accepted(self, client: End) -> None:
        task = asyncio.ensure_future(self._accept(client))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _accept(self, client: End) -> None:
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        try:
            # Toxiproxy takes any upstream text and finds out here, when it dials.
            host, port_text = go_split_hostport(self.upstream)
            target = host or "localhost"  # Go dials the local system for ":port"
            _, upstream = await loop.create_connection(End, target, go_port(port_text))
        except (OSError, ValueError) as exc:
            logger.warning("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            client.close()
            return
        except asyncio.CancelledError:
            client.abort()
            raise
        if epoch != self._epoch:  # disabled while we were dialling
            upstream.abort()
            client.abort()
            return
        connection = Connection(self.toxics_for, client, upstream)
        self._connections.add(connection)
        assert client.transport is not None
        logger.debug("proxy %s: client %s", self.name, client.transport.get_extra_info("peername"))
        try:
            await connection.run()
        except Exception:
            logger.exception("proxy %s: connection failed", self.name)
            connection.kill()
        finally:
            self._connections.discard(connection)

    # ---- toxics on live connections

    def add_toxic(self, toxic: Toxic) -> None:
        if any(t.name == toxic.name for t in self.toxics):
            fail(TOXIC_EXISTS)
        self.toxics.append(toxic)
        for connection in list(self._connections):
            connection.links[toxic.direction].attach(toxic)

    def update_toxic(self, toxic: Toxic) -> None:
        for connection in list(self._connections):
            connection.links[toxic.direction].update(toxic.name)

    def remove_toxic(self, name: str) -> None:
        toxic = self.find_toxic(name)
        self.toxics.remove(toxic)
        for connection in list(self._connections):
            connection.links[toxic.direction].detach(name)

    def remove_all_toxics(self) -> None:
        for toxic in list(self.toxics):
            self.remove_toxic(toxic.name)
