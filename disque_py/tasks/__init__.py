"""Tasks for Python teams: ``@app.task``, ``.send()``, results, retries, time limits, groups, chains, chords.

A layer over the cluster's own primitives (see docs/TASKS.md): a task is a job whose
body names the task and carries its arguments (:mod:`.message`), retries are the job's
MAXDELIVER and BACKOFF, a task that fails for good is a dead letter with its error,
and a result is a job of its own (:mod:`.results`). ``disque-py worker myapp.tasks:app``
runs them (:mod:`.runner`, on :class:`disque_py.client.worker.Worker`; a run's hooks in
:mod:`.hooks`, its time limit in :mod:`.timelimit`, what it writes in :mod:`.writes`, its
counts and ``/metrics`` in :mod:`.metrics`; revoke, cancel, status and progress of a sent
task in :mod:`.control`); a group joined by a callback is a chord (:mod:`.chords`: run once after
the last member, with no one in charge).

A client of the cluster: it imports :mod:`disque_py.client` and nothing of the server.
"""

from __future__ import annotations

from .app import App, Chain, ChainRef, Chord, ChordRef, Group, GroupRef, Signature, Task, chain, chord, group
from .chords import ChordPending, Progress
from .message import Message, MessageError, Outcome, result_queue
from .control import TaskStatus
from .results import NoResult, ResultTimeout, TaskError, TaskRef, TaskRevoked
from .hooks import TaskContext, current_task
from .metrics import TaskMetrics
from .runner import Runner, make_worker
from .timelimit import TimeLimitExceeded

__all__ = [
    "App",
    "Task",
    "Signature",
    "Group",
    "GroupRef",
    "Chain",
    "ChainRef",
    "Chord",
    "ChordRef",
    "ChordPending",
    "Progress",
    "group",
    "chain",
    "chord",
    "TaskRef",
    "TaskError",
    "TaskRevoked",
    "TaskStatus",
    "ResultTimeout",
    "NoResult",
    "TimeLimitExceeded",
    "current_task",
    "TaskContext",
    "TaskMetrics",
    "Runner",
    "make_worker",
    "Message",
    "MessageError",
    "Outcome",
    "result_queue",
]
