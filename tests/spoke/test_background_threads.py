"""Storing threads run nicer than the event loop (service.threads)."""

from __future__ import annotations

import os
import threading

from service.threads import BACKGROUND_NICENESS, MAX_NICENESS, background_pool, lower_this_thread

# Per-thread niceness is Linux's, like the /proc the integration tests read: the suite
# runs on Linux (CI included), so these run everywhere it runs, unskipped.


def _own_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_pool_threads_are_nicer_and_the_caller_is_not() -> None:
    before = _own_niceness()
    with background_pool(2, "test-bg") as pool:
        in_pool = {pool.submit(_own_niceness).result() for _ in range(4)}
    assert in_pool == {min(before + BACKGROUND_NICENESS, MAX_NICENESS)}
    assert _own_niceness() == before  # only the pool's threads changed


def test_lowering_is_capped_and_never_raises_priority() -> None:
    def run() -> list[int]:
        seen = []
        lower_this_thread(by=MAX_NICENESS + 5)
        seen.append(_own_niceness())
        lower_this_thread()  # already at the cap: stays there, no error
        seen.append(_own_niceness())
        lower_this_thread(by=-5)  # a negative step is not a request for more CPU
        seen.append(_own_niceness())
        return seen

    result: list[int] = []
    thread = threading.Thread(target=lambda: result.extend(run()))
    thread.start()
    thread.join()
    assert result == [MAX_NICENESS] * 3
