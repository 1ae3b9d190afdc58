"""The app the real-process tests run with ``disque-py worker tests.tasks.taskapp:app``
(the nodes come from $DISQUE_NODES)."""

from __future__ import annotations

import time

from disque_py.tasks import App, current_task

app = App(result_ttl=120)


@app.task(queue="flaky", retries=3, backoff=(0.05, 0.2), retry=2)
def flaky(n):
    """Fails on its first two deliveries, then returns 2n."""
    if current_task().attempt <= 2:
        raise RuntimeError("flaky %d, attempt %d" % (n, current_task().attempt))
    return 2 * n


@app.task(queue="hopeless", retries=1, backoff=(0.05, 0.2), retry=2)
def hopeless(n):
    raise ValueError("hopeless %d" % n)


@app.task(queue="slow", retries=0, timeout=0.3, retry=30)
def slow(n):
    end = time.monotonic() + 30
    while time.monotonic() < end:
        time.sleep(0.01)
    return n


@app.task(queue="steady", retries=3, backoff=(0.05, 0.2), retry=1)
def steady(n):
    time.sleep(0.3)
    return n + 1
