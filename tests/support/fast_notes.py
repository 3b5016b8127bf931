"""Which requests a server's fast handler (:data:`service.fast.FAST`) answered itself:
the handler wrapped so that each request's outcome is noted, for a test to ask."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field

from protocol.http1 import RequestHead
from service.fast import FastConnection, FastHandler, Reply


@dataclass
class FastNotes:
    answered: list[bool] = field(default_factory=list)
    asked: int = 0  # requests the fast handler was given; each is noted in ``answered``
    noted: asyncio.Event = field(default_factory=asyncio.Event)

    async def took(self) -> list[bool]:
        """Whether the fast path answered each request since the last call. An answer
        sent from a thread can reach the client before its coroutine resumes to note it:
        wait (bounded) until every request asked has been noted."""
        async with asyncio.timeout(10):
            while len(self.answered) < self.asked:
                self.noted.clear()
                await self.noted.wait()
        taken, self.answered, self.asked = self.answered, [], 0
        return taken

    def note(self, took: bool) -> None:
        self.answered.append(took)
        self.noted.set()

    def noting(self, real: FastHandler) -> FastHandler:
        """``real``, noting each outcome (an answer its client hung up on, cancelled or
        failing on the socket, is noted as not the fast path's: it never ended)."""

        def handler(head: RequestHead, conn: FastConnection
                    ) -> Reply | Awaitable[Reply | None] | None:
            self.asked += 1
            outcome = real(head, conn)
            if outcome is None or isinstance(outcome, Reply):
                self.note(outcome is not None)
                return outcome

            async def later(pending: Awaitable[Reply | None]) -> Reply | None:
                try:
                    reply = await pending
                except BaseException:  # cancelled, or the client's side failed
                    self.note(False)
                    raise
                self.note(reply is not None)
                return reply

            return later(outcome)

        return handler
