"""The client loop's direct waiting (disque_py/server/waiting.py) never holds trio up.

Each test runs a loop shaped like the node's client loop (``DirectWait.wait``
on an epoll, trio's descriptor flagged when it shows up) next to ordinary
trio work: deadlines, trio sockets, threads, signals, cancellation. The
loop must really wait directly (``direct_waits`` grows), and everything
else must still finish, each within a generous deadline.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading

import pytest
import trio
import trio.testing

from disque_py.server.waiting import DirectWait, trio_epoll_fd

DEADLINE = 10  # seconds: liveness bound, far above what any step needs


class Loop:
    """A client-loop stand-in: reads whatever arrives on its sockets."""

    def __init__(self) -> None:
        self.ep = select.epoll()
        self.direct = DirectWait(self.ep)
        self.a, self.b = socket.socketpair()
        self.a.setblocking(False)
        self.ep.register(self.a.fileno(), select.EPOLLIN)
        self.received = bytearray()
        self.changed = trio.Event()
        self.started = trio.Event()

    async def run(self) -> None:
        try:
            await self.direct.start()
            self.started.set()
            while True:
                ready = await self.direct.wait()
                for fd, _events in ready:
                    if fd == self.direct.trio_fd:
                        self.direct.trio_ready = True
                        continue
                    self.received += self.a.recv(65536)
                    self.changed.set()  # wakes a trio task: the loop must let it run
                    self.changed = trio.Event()
        finally:
            self.direct.close()
            self.ep.close()
            self.a.close()
            self.b.close()

    async def wait_for(self, data: bytes) -> None:
        while data not in self.received:
            await self.changed.wait()


@pytest.fixture
def loop():
    return Loop()


def test_trio_epoll_is_reachable():
    async def main():
        fd = trio_epoll_fd()
        return fd, os.readlink("/proc/self/fd/%d" % fd)

    fd, target = trio.run(main)
    assert isinstance(fd, int) and target == "anon_inode:[eventpoll]"


async def test_direct_waiting_is_on_and_trio_keeps_running(loop, nursery):
    with trio.fail_after(DEADLINE):
        nursery.start_soon(loop.run)
        await loop.started.wait()
        assert loop.direct.active

        # Deadlines: sleeps end while the loop waits in its own epoll (nothing else scheduled,
        # it blocks there until the sleep's deadline): each sleep sees a direct wait.
        for _ in range(5):
            waits = loop.direct.direct_waits
            await trio.sleep(0.01)
            assert loop.direct.direct_waits > waits
        waits = loop.direct.direct_waits

        # trio's own sockets: their readiness comes through trio's epoll.
        left, right = trio.socket.socketpair()
        with left, right:

            async def echo():
                data = await right.recv(100)
                await right.send(data.upper())

            parked = loop.direct.direct_waits
            nursery.start_soon(echo)
            while loop.direct.direct_waits == parked:  # a direct wait: echo has run and is parked in trio's epoll
                await trio.sleep(0.001)
            await left.send(b"ping")
            assert await left.recv(100) == b"PING"

        # Threads wake trio with run_sync_soon (trio's wake-up socket).
        assert await trio.to_thread.run_sync(lambda: 41 + 1) == 42

        # The loop's own sockets, written from another thread meanwhile.
        threading.Thread(target=loop.b.sendall, args=(b"from a thread",)).start()
        await loop.wait_for(b"from a thread")
        assert loop.direct.direct_waits > waits
        assert loop.direct.active
        nursery.cancel_scope.cancel()


async def test_signals_arrive_while_waiting_directly(loop, nursery):
    with trio.fail_after(DEADLINE):
        nursery.start_soon(loop.run)
        await loop.started.wait()
        with trio.open_signal_receiver(signal.SIGUSR1) as signals:
            waits = loop.direct.direct_waits
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            async for signum in signals:
                assert signum == signal.SIGUSR1
                break
        assert loop.direct.direct_waits > waits  # it came while the loop waited directly
        nursery.cancel_scope.cancel()


async def test_a_deadline_cancels_the_loop_itself():
    loop = Loop()
    with trio.fail_after(DEADLINE):
        with trio.move_on_after(0.05) as scope:
            await loop.run()
    assert scope.cancelled_caught
    assert loop.direct.direct_waits > 0


async def test_two_loops_in_one_run_both_fall_back_and_both_work(nursery):
    first, second = Loop(), Loop()
    with trio.fail_after(DEADLINE):
        nursery.start_soon(first.run)
        await first.started.wait()
        assert first.direct.active
        nursery.start_soon(second.run)
        await second.started.wait()
        assert not first.direct.active and not second.direct.active
        first.b.sendall(b"one")
        second.b.sendall(b"two")
        await first.wait_for(b"one")
        await second.wait_for(b"two")
        nursery.cancel_scope.cancel()


async def test_virtual_clock_keeps_the_plain_wait(loop, nursery, autojump_clock):
    with trio.fail_after(DEADLINE):
        nursery.start_soon(loop.run)
        await loop.started.wait()
        assert not loop.direct.active
        await trio.sleep(DEADLINE / 2)  # virtual: trio sees the run idle and jumps
        loop.b.sendall(b"still read")
        await loop.wait_for(b"still read")
        assert loop.direct.direct_waits == 0
        nursery.cancel_scope.cancel()
