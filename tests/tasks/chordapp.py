"""The app of the chord proof with real processes (tests/tasks/test_chord_process.py), run by
``disque-py worker tests.tasks.chordapp:app -n ...``: every run of the callback appends
``<chord> <pid> <job ID> <attempt> <values as JSON>`` to the file $CHORD_RUNS, so what is
checked is what ran."""

from __future__ import annotations

import json
import os
import random
import time

from disque_py.tasks import App, current_task

app = App(result_ttl=600)


@app.task(queue="chord-members", retries=3, backoff=(0.05, 0.2), retry=8)
def member(chord: int, i: int) -> int:
    time.sleep(random.uniform(0.0, float(os.environ.get("CHORD_MEMBER_SLEEP", "0.05"))))
    return chord * 1000 + i


@app.task(queue="chord-callbacks", retries=3, backoff=(0.05, 0.2), retry=8)
def collect(values: list[int], chord: int) -> int:
    ctx = current_task()
    line = "%d %d %s %d %s\n" % (chord, os.getpid(), ctx.job_id, ctx.attempt, json.dumps(values, separators=(",", ":")))
    fd = os.open(os.environ["CHORD_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line with O_APPEND: lines never mix
    finally:
        os.close(fd)
    return sum(values)
