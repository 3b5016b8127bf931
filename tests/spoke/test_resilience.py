"""Retries and the circuit breaker, driven by a fake clock and a fake fetcher."""

from __future__ import annotations

import random

import pytest

from spoke.upstream.errors import BadGateway, GoneAtHub, HubRefused, HubTimeout, HubUnavailable
from spoke.upstream.resilience import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    CircuitBreaker,
    CircuitOpen,
    RetryCounters,
    RetryPolicy,
    call_with_retries,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class Fetcher:
    """Fails with the given errors in turn, then answers ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def run(fetcher: Fetcher, clock: FakeClock, breaker: CircuitBreaker | None = None,
        policy: RetryPolicy | None = None, counters: RetryCounters | None = None):  # type: ignore[no-untyped-def]
    return call_with_retries(
        fetcher, policy=policy or RetryPolicy(), breaker=breaker or CircuitBreaker(clock=clock),
        counters=counters or RetryCounters(), clock=clock, sleep=clock.sleep,
        rng=random.Random(1),
    )


@pytest.mark.parametrize(
    "error", [HubUnavailable("down"), HubTimeout("slow"), BadGateway("short body")]
)
async def test_transient_errors_are_retried(error: Exception) -> None:
    clock, counters = FakeClock(), RetryCounters()
    fetcher = Fetcher(error, error)
    assert await run(fetcher, clock, counters=counters) == "ok"
    assert fetcher.calls == 3
    assert counters.retries == 2
    assert counters.timeouts == (2 if isinstance(error, HubTimeout) else 0)


@pytest.mark.parametrize("error", [GoneAtHub("gone"), HubRefused("400")])
async def test_permanent_errors_are_not_retried(error: Exception) -> None:
    clock = FakeClock()
    fetcher = Fetcher(error)
    with pytest.raises(type(error)):
        await run(fetcher, clock)
    assert fetcher.calls == 1


async def test_attempts_are_bounded() -> None:
    clock = FakeClock()
    fetcher = Fetcher(*[HubUnavailable("down")] * 10)
    with pytest.raises(HubUnavailable):
        await run(fetcher, clock, policy=RetryPolicy(attempts=4))
    assert fetcher.calls == 4


async def test_total_time_is_bounded() -> None:
    clock = FakeClock()
    policy = RetryPolicy(attempts=100, base_delay_s=1.0, max_delay_s=1.0, deadline_s=3.0)
    fetcher = Fetcher(*[HubUnavailable("down")] * 100)
    with pytest.raises(HubUnavailable):
        await run(fetcher, clock, policy=policy, breaker=CircuitBreaker(failure_threshold=1000))
    assert clock.now <= 3.0
    assert 2 <= fetcher.calls < 100


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=0.4)
    rng = random.Random(3)
    delays = [[policy.delay(a, rng) for _ in range(200)] for a in range(1, 6)]
    assert max(delays[0]) <= 0.2 and max(delays[1]) <= 0.4
    assert all(max(d) <= 0.4 for d in delays)
    assert max(delays[3]) > 0.3  # full jitter reaches near the cap


def test_breaker_opens_after_threshold_and_fails_fast() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, reset_timeout_s=2.0, clock=clock)
    for _ in range(2):
        breaker.before_call()
        breaker.on_failure()
    assert breaker.state == CLOSED
    breaker.before_call()
    breaker.on_failure()
    assert breaker.state == OPEN and breaker.opened_total == 1
    clock.now = 1.5
    with pytest.raises(CircuitOpen) as info:
        breaker.before_call()
    assert info.value.status_hint == 503
    assert info.value.retry_after_s == pytest.approx(1.0)
    assert breaker.rejected_total == 1


def test_half_open_lets_one_probe_through_and_closes_on_success() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=2.0, clock=clock)
    breaker.on_failure()
    clock.now = 2.0
    breaker.before_call()  # the probe
    assert breaker.state == HALF_OPEN
    with pytest.raises(CircuitOpen):
        breaker.before_call()  # a second caller while the probe is out
    breaker.on_success()
    assert breaker.state == CLOSED
    breaker.before_call()


def test_failed_probe_reopens_with_longer_cool_down() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout_s=2.0, max_reset_timeout_s=5.0,
                             clock=clock)
    breaker.on_failure()
    clock.now = 2.0
    breaker.before_call()
    breaker.on_failure()
    assert breaker.state == OPEN and breaker.opened_total == 2
    clock.now = 5.9  # 2.0 + 4.0 would be needed now
    with pytest.raises(CircuitOpen):
        breaker.before_call()
    clock.now = 6.0
    breaker.before_call()
    assert breaker.state == HALF_OPEN


async def test_open_breaker_stops_retries_at_once() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=2, reset_timeout_s=10.0, clock=clock)
    fetcher = Fetcher(*[HubUnavailable("down")] * 10)
    with pytest.raises(CircuitOpen):
        await run(fetcher, clock, breaker=breaker, policy=RetryPolicy(attempts=5))
    assert fetcher.calls == 2  # the third attempt was refused by the open breaker


async def test_answers_from_the_hub_do_not_open_the_breaker() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, clock=clock)
    with pytest.raises(GoneAtHub):
        await run(Fetcher(GoneAtHub("gone")), clock, breaker=breaker)
    assert breaker.state == CLOSED
