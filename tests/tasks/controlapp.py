"""The app of the control tests (revoke, cancel, status, progress) run by real worker processes:
``disque-py worker tests.tasks.controlapp:app`` (the nodes come from $DISQUE_NODES or -n)."""

from __future__ import annotations

import time

import trio

from disque_py.tasks import App, current_task

app = App(result_ttl=120)


@app.task(queue="ctl-async", retries=3, retry=60)
async def long_async(seconds):
    """Sleeps ``seconds`` (trio), reporting its progress every 0.1 s."""
    end = trio.current_time() + seconds
    n = 0
    while trio.current_time() < end:
        n += 1
        current_task().progress(n, None, "async step %d" % n)
        await trio.sleep(0.1)
    return "finished"


@app.task(queue="ctl-sync", retries=3, retry=60)
def long_sync(seconds):
    """Busy for ``seconds`` in its thread (short sleeps), reporting its progress."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        if n % 10 == 0:
            current_task().progress(n, 1000, "sync step %d" % n)
        time.sleep(0.01)
    return "finished"


@app.task(queue="ctl-quick", retries=0)
def quick(n):
    return n * 10


@app.task(queue="ctl-fail", retries=1, backoff=(4, 4), retry=60)
def fails(n):
    raise ValueError("fails %d" % n)


@app.task(queue="ctl-bound", bind=True, retries=0)
def bound_progress(self, steps):
    for k in range(steps):
        self.progress(k + 1, steps, "bound")
        time.sleep(0.2)
    return steps
