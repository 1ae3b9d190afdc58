"""The periodic steps (the cron's, the cluster's tick) run with the core's timers (server/timers.py):
by the client loop's calls to ``CoreTimers.due`` while it owns the timers, by the timer task when it
does not, at the same times either way, with no catching up after a stall; every 100 ms, or as
seldom as every step asks (an idle cron: once a second). Virtual time: exact."""

from __future__ import annotations

import trio

from disque_py.config import Config
from disque_py.core.node import Node
from disque_py.server.timers import PERIOD_MS, CoreTimers, Cron


def _timers() -> tuple[CoreTimers, list[int]]:
    node = Node("0" * 40, seed=b"timers", now=int(trio.current_time() * 1000), address=("127.0.0.1", 7711))
    timers = CoreTimers(node, lambda: None)
    ran: list[int] = []
    timers.every_period(lambda: ran.append(round(trio.current_time() * 1000)))
    return timers, ran


async def _loop_until(timers: CoreTimers, ran: list[int], count: int, longest: float = PERIOD_MS / 1000) -> None:
    """What the client loop does: wait what due() says, call it again, until ``count`` steps ran."""
    with trio.fail_after(10):
        while len(ran) < count:
            limit = timers.due()
            assert 0 <= limit <= longest  # an idle node (no job) still wakes for the step
            # (0: the periodic steps ran for their slice and the next is due after the loop's next pass)
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


async def test_the_shortest_period_a_step_asks_for_is_the_next(autojump_clock):
    node = Node("0" * 40, seed=b"timers", now=int(trio.current_time() * 1000), address=("127.0.0.1", 7711))
    timers = CoreTimers(node, lambda: None)
    timers.hand_over(True)
    ran: list[int] = []
    wants = {"a": 500, "b": 300}
    timers.every_period(lambda: ran.append(round(trio.current_time() * 1000)) or wants["a"])
    timers.every_period(lambda: wants["b"])
    start = round(trio.current_time() * 1000)
    await _loop_until(timers, ran, 3, longest=0.5)
    assert _near(ran, [start + 100, start + 400, start + 700])  # the first after 100 ms, then 300
    wants["b"] = 800  # (the loop above slept until the next round, at 1000: not run yet)
    await _loop_until(timers, ran, 5, longest=0.5)
    assert _near(ran[3:], [start + 1000, start + 1500])  # asked at 700 (300 more), then 500


async def test_an_idle_cron_steps_once_a_second_and_a_command_or_a_peer_makes_it_busy(autojump_clock):
    stats = {"total_commands_processed": 0}
    checked: list[int] = []  # the rate each client check was told (steps a second)
    done = [True]  # whether a round of the client checks is over
    cron = Cron(Config(), stats, lambda timeout, hz: checked.append(hz) or done[0])
    seconds: list[int] = []
    cron.every_second.append(lambda: seconds.append(round(trio.current_time() * 1000)))
    peers = [0]
    cron.activity = lambda: peers[0]
    start = round(trio.current_time() * 1000)
    def step() -> int:  # the cron's two periodic steps, as the timers run them
        period = cron.step()
        assert cron.check_step() == period
        return period

    assert step() == Cron.IDLE_MS  # nothing happened
    await trio.sleep(1.0)
    assert step() == Cron.IDLE_MS and _near(seconds, [start + 1000])
    stats["total_commands_processed"] += 50  # 50 commands in that second
    await trio.sleep(1.0)
    assert step() == PERIOD_MS and cron.instantaneous_ops() == 50 // 3  # (0 + 0 + 50) / 3 samples
    for _ in range(9):  # busy: 10 steps a second, once-a-second work still once a second
        await trio.sleep(0.1)
        assert step() == PERIOD_MS
    await trio.sleep(0.1)
    assert step() == Cron.IDLE_MS  # a second with nothing: idle again
    assert len(seconds) == 3
    # a slice of the client checks at every step, sized for the step's rate: 1 a second idle, 10 busy
    assert checked == [1, 1] + [10] * 10 + [1]
    done[0] = False  # more clients than a slice covers: the checks go on every 100 ms, idle or not
    assert cron.check_step() == PERIOD_MS
    peers[0] += 1  # a job-layer message from a peer
    await trio.sleep(1.0)
    assert cron.step() == PERIOD_MS


# --------------------------------------------------------------------------- the tick's slices


async def test_a_run_of_the_core_timers_ticks_while_due_within_its_slice_and_the_loop_does_the_rest(
    autojump_clock, monkeypatch
):
    """Many job wake-ups due at once: each tick runs a bounded batch (``SCHEDULE_BATCH``); one run of
    the timers ticks again while more are due, for ``TICK_SLICE_NS`` at most, then ``due()`` says none
    to wait (due already) so that the loop comes back after its next pass; every requeue runs."""
    from disque_py.core.job import TIME_ERROR_MS
    from disque_py.core.node import SCHEDULE_BATCH
    from disque_py.server import timers as timers_mod
    from disque_py.server.contracts import now_ms

    node = Node("0" * 40, seed=b"slices", now=now_ms(), address=("127.0.0.1", 7711))
    effects: list[int] = []
    timers = CoreTimers(node, lambda: effects.append(len(node.take_effects())))
    timers.hand_over(True)
    n = SCHEDULE_BATCH * 6
    for i in range(n):
        node.execute(1, [b"ADDJOB", b"q", b"b%d" % i, b"0", b"RETRY", b"1"], now_ms())
    assert len(node.execute(2, [b"GETJOB", b"NOHANG", b"COUNT", b"%d" % n, b"FROM", b"q"], now_ms())) == n
    node.take_effects()
    await trio.sleep((1000 + TIME_ERROR_MS) / 1000)  # every requeue is due
    qlen = lambda: node.execute(3, [b"QLEN", b"q"], now_ms())  # noqa: E731

    monkeypatch.setattr(timers_mod, "TICK_SLICE_NS", 0)  # no time for a second tick: one batch a run
    assert timers.due() <= 0 and qlen() == SCHEDULE_BATCH  # still due: the loop waits for nothing
    assert timers.due() <= 0 and qlen() == 2 * SCHEDULE_BATCH
    monkeypatch.setattr(timers_mod, "TICK_SLICE_NS", 10**10)  # time for all: one run ticks them all
    assert timers.due() > 0 and qlen() == n
    assert len(effects) == 3  # the effects carried out once a run


async def test_a_step_that_returns_0_runs_again_in_the_same_round_after_a_pass(autojump_clock, monkeypatch):
    """The cluster's tick sends its PINGs in steps: while it returns 0 it is called again, before
    the round's next step, after a pass of the loop each time (however short it was); the round
    still ends at its time and the next starts one period after it was due."""
    from disque_py.server import timers as timers_mod

    node = Node("0" * 40, seed=b"timers", now=int(trio.current_time() * 1000), address=("127.0.0.1", 7711))
    timers = CoreTimers(node, lambda: None)
    timers.hand_over(True)
    calls: list[str] = []
    left = [0]

    def sliced() -> int:
        calls.append("sliced")
        if left[0]:
            left[0] -= 1
            return 0
        return PERIOD_MS

    timers.every_period(lambda: calls.append("before") or PERIOD_MS)
    timers.every_period(sliced)
    timers.every_period(lambda: calls.append("after") or PERIOD_MS)
    monkeypatch.setattr(timers_mod, "STEPS_SLICE_NS", 10**10)  # time for every step: a pass only for "again"
    start = round(trio.current_time() * 1000)
    await trio.sleep(PERIOD_MS / 1000)
    left[0] = 3
    waits = []
    while "after" not in calls:
        waits.append(timers.due())
    assert calls == ["before"] + ["sliced"] * 4 + ["after"]
    assert waits[:-1] == [0.0] * 3  # a pass of the loop after each 0, waiting for nothing
    assert abs(waits[-1] - PERIOD_MS / 1000) < 0.002  # then the next round, one period after this one
    await trio.sleep(waits[-1])
    calls.clear()
    assert timers.due() > 0 and calls == ["before", "sliced", "after"]  # done: one call of due() again
    assert round(trio.current_time() * 1000) == start + 2 * PERIOD_MS
