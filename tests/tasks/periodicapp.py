"""The app of the periodic proof (tests/tasks/test_periodic_process.py), run with
``disque-py worker tests.tasks.periodicapp:app``: one task every 2 s that records each run.

``PERIODIC_NODES``: the seeds; ``PERIODIC_PREFER``: the node this worker uses while it
answers (so that each worker process starts on a node of its own); ``PERIODIC_RUNS``: the
file each run appends one line to: ``<slot start> <pid> <job ID> <attempt>``.
"""

from __future__ import annotations

import os

from disque_py.tasks import App, current_task

app = App(
    nodes=os.environ.get("PERIODIC_NODES", "127.0.0.1:7711"),
    prefer=os.environ.get("PERIODIC_PREFER") or None,
    socket_timeout=2.0,
    connect_timeout=0.5,
    failover_timeout=5.0,
)


# retry=4: a slot's job queued on a node that dies is queued again by a node holding a copy
# within seconds, not after the node's default RETRY
@app.periodic(every=2, name="tick", queue="periodic", retry=4)
def tick():
    ctx = current_task()
    line = "%s %d %s %d\n" % (ctx.meta["periodic_slot"], os.getpid(), ctx.job_id, ctx.attempt)
    fd = os.open(os.environ["PERIODIC_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of one line: lines of two processes never mix
    finally:
        os.close(fd)
