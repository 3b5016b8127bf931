"""How the spoke behaves when the WAN misbehaves: retries and a circuit breaker.

Both are plain objects with the clock and the sleep passed in, so tests drive
them without waiting.

Retries: idempotent hub reads that failed for a transient reason are tried
again with exponential backoff and full jitter (AWS architecture blog,
"Exponential Backoff and Jitter"), bounded in attempts and in total time.

Circuit breaker: after ``failure_threshold`` consecutive connectivity failures
the hub is considered down; misses then fail at once with 503 and a
``Retry-After`` instead of piling up behind timeouts. When the cool-down has
passed, one probe request is let through (half-open); its success closes the
breaker, its failure re-opens it with a longer cool-down.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from spoke.upstream.errors import HubError, HubTimeout, HubUnavailable

T = TypeVar("T")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}


class CircuitOpen(HubUnavailable):
    """Refused without trying: the hub failed repeatedly and is cooling down."""

    title = "Hub unavailable (circuit open)"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout_s: float = 1.0,
        max_reset_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.base_reset_s = reset_timeout_s
        self.max_reset_s = max_reset_timeout_s
        self._clock = clock
        self.state = CLOSED
        self.failures = 0
        self.opened_total = 0
        self.rejected_total = 0
        self._reset_s = reset_timeout_s
        self._opened_at = 0.0
        self._probing = False

    def before_call(self) -> None:
        """Raise :class:`CircuitOpen` unless a call may go to the hub now."""
        if self.state == CLOSED:
            return
        remaining = self._opened_at + self._reset_s - self._clock()
        if self.state == OPEN and remaining <= 0:
            self.state = HALF_OPEN
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True  # exactly one probe at a time
            return
        self.rejected_total += 1
        error = CircuitOpen(
            f"hub failed {self.failures} times in a row; next attempt in {max(remaining, 0):.1f} s"
        )
        error.retry_after_s = max(remaining, 1.0)
        raise error

    def would_admit(self) -> bool:
        """Whether :meth:`before_call` would let a call through now (without taking the
        half-open probe): closed, or open past its cool-down."""
        if self.state == CLOSED:
            return True
        if self.state == HALF_OPEN:
            return not self._probing
        return self._clock() >= self._opened_at + self._reset_s

    def on_success(self) -> None:
        self.state = CLOSED
        self.failures = 0
        self._probing = False
        self._reset_s = self.base_reset_s

    def on_failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN:
            self._reset_s = min(self._reset_s * 2, self.max_reset_s)
            self._open()
        elif self.state == CLOSED and self.failures >= self.failure_threshold:
            self._open()

    def release_probe(self) -> None:
        """A probe ended in neither success nor connectivity failure (e.g. a 404)."""
        if self.state == HALF_OPEN:
            self.on_success()

    def _open(self) -> None:
        self.state = OPEN
        self._probing = False
        self._opened_at = self._clock()
        self.opened_total += 1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    base_delay_s: float = 0.05
    max_delay_s: float = 1.0
    deadline_s: float = 15.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


@dataclass
class RetryCounters:
    retries: int = 0
    timeouts: int = 0


def is_connectivity_failure(exc: BaseException) -> bool:
    return isinstance(exc, HubUnavailable | HubTimeout) and not isinstance(exc, CircuitOpen)


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breaker: CircuitBreaker,
    counters: RetryCounters,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run ``call`` through the breaker, retrying retryable hub errors within the policy."""
    rng = rng or random.Random()
    started = clock()
    attempt = 0
    while True:
        breaker.before_call()
        try:
            result = await call()
        except HubError as exc:
            _record(exc, breaker, counters)
            attempt += 1
            pause = policy.delay(attempt, rng)
            out_of_time = clock() - started + pause > policy.deadline_s
            if not exc.retryable or attempt >= policy.attempts or out_of_time:
                raise
            counters.retries += 1
            await sleep(pause)
            continue
        except BaseException:
            breaker.release_probe()
            raise
        breaker.on_success()
        return result


def _record(exc: HubError, breaker: CircuitBreaker, counters: RetryCounters) -> None:
    if isinstance(exc, HubTimeout):
        counters.timeouts += 1
    if is_connectivity_failure(exc):
        breaker.on_failure()
    else:
        breaker.release_probe()  # the hub answered: the link itself works


class ResilientCalls:
    """Upstream calls run through one retry policy and one breaker, counted in one place."""

    def __init__(
        self,
        policy: RetryPolicy,
        breaker: CircuitBreaker,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.policy = policy
        self.breaker = breaker
        self.counters = RetryCounters()
        self.clock = clock
        self.sleep = sleep  # the backoff between attempts (tests hold it)
        self._rng = random.Random()  # one generator: a new one per call seeds from urandom

    async def call(self, call: Callable[[], Awaitable[T]]) -> T:
        return await call_with_retries(
            call, policy=self.policy, breaker=self.breaker, counters=self.counters,
            clock=self.clock, sleep=self.sleep, rng=self._rng,
        )
