"""The 100 ms steps (the cron's, the cluster's tick) run with the core's timers (server/timers.py):
by the client loop's calls to ``CoreTimers.due`` while it owns the timers, by the timer task when it
does not, at the same times either way, with no catching up after a stall. Virtual time: exact."""

from __future__ import annotations

import trio

from disque_py.core.node import Node
from disque_py.server.timers import PERIOD_MS, CoreTimers


def _timers() -> tuple[CoreTimers, list[int]]:
    node = Node("0" * 40, seed=b"timers", now=int(trio.current_time() * 1000), address=("127.0.0.1", 7711))
    timers = CoreTimers(node, lambda: None)
    ran: list[int] = []
    timers.every_period(lambda: ran.append(round(trio.current_time() * 1000)))
    return timers, ran


async def _loop_until(timers: CoreTimers, ran: list[int], count: int) -> None:
    """What the client loop does: wait what due() says, call it again, until ``count`` steps ran."""
    with trio.fail_after(10):
        while len(ran) < count:
            limit = timers.due()
            assert 0 < limit <= PERIOD_MS / 1000  # an idle node (no job) still wakes for the step
            await trio.sleep(limit)


def _near(ran: list[int], expected: list[int]) -> bool:
    """The same times, within the millisecond now_ms truncates to."""
    return len(ran) == len(expected) and all(abs(a - b) <= 1 for a, b in zip(ran, expected))


async def test_the_loop_runs_the_steps_every_period_and_waits_no_longer_than_the_next(autojump_clock):
    timers, ran = _timers()
    timers.hand_over(True)  # the client loop owns the timers: it calls due() after each pass
    start = round(trio.current_time() * 1000)
    await _loop_until(timers, ran, 10)
    assert _near(ran, [start + PERIOD_MS * i for i in range(1, 11)])


async def test_a_late_loop_runs_the_step_once_and_keeps_the_period_from_then(autojump_clock):
    timers, ran = _timers()
    timers.hand_over(True)
    start = round(trio.current_time() * 1000)
    await trio.sleep(0.35)  # the loop was busy for three periods and a half
    timers.due()
    assert _near(ran, [start + 350])  # once, not three times
    await _loop_until(timers, ran, 2)
    assert _near(ran, [start + 350, start + 450])


async def test_the_timer_task_runs_the_steps_when_the_loop_does_not(autojump_clock, nursery):
    timers, ran = _timers()
    start = round(trio.current_time() * 1000)
    nursery.start_soon(timers.run)
    await trio.sleep(0.55)
    assert _near(ran, [start + PERIOD_MS * i for i in range(1, 6)])
    timers.hand_over(True)  # the loop takes over: the task parks and runs nothing
    await trio.sleep(0.5)
    assert len(ran) == 5
    timers.hand_over(False)
    await trio.sleep(0.3)
    assert len(ran) > 5 and all(abs(b - a - PERIOD_MS) <= 1 for a, b in zip(ran[5:], ran[6:]))
