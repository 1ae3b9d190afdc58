"""The worker runtime: fetch jobs, run a handler on each, acknowledge, retry, dead-letter, stop.

A :class:`Worker` is a trio program built on the trio client
(:class:`disque_py.aio.Client`), made of stages, one module each, that share plain state
(trio tasks switch only at ``await``, so no locks; the handler threads share theirs under one):

=================  ===========================================================================
``fetch.py``       the one fetch path: a round is the pending outcomes then ``GETJOB NOHANG
                   COUNT <free slots>``; the fetcher task sends them (or blocks in GETJOB when
                   it has nothing to carry), never more than ``max_in_flight`` jobs in hand
``runners.py``     run, ``async def`` handlers: ``concurrency`` trio tasks
``threads.py``     run, plain functions: ``concurrency`` handler threads and the collector that
                   turns their reports into outcomes
``direct.py``      the handler threads' own rounds (the fetch path's), on a blocking connection,
                   while handlers are quick (direct mode)
``outcome.py``     what a run becomes: ACK, a retry (NACK with DELAY), a dead letter
``acks.py``        acknowledge: the outcomes waiting, carried by the fetcher or sent by the acker
``pause.py``       the consumer-wide pause when most jobs fail (:class:`FailureGate`)
``keepalive.py``   a job's heartbeats (WORKING) while its handler runs
``stop.py``        :meth:`Worker.stop`, signals, the grace period, the jobs given back
``stats.py``       the counters and :class:`WorkerStats`
``settings.py``    :class:`WorkerSettings`, every setting declared once
``handlers.py``    what a handler may raise (:class:`Reject`) and how its error is told (its text,
                   its traceback)
``runtime.py``     :class:`Worker`: the stages wired together and run
=================  ===========================================================================

A job's way: the fetcher puts it in the buffer; a runner or a handler thread takes it and runs
the handler; :mod:`.outcome` decides its outcome, which waits in :mod:`.acks` until the fetcher
carries it in its next round (or the acker sends it); its slot is free once the node answered.
Either kind of handler succeeds by returning (the value is ignored) and fails by raising
anything; raising :class:`Reject` dead-letters the job at once, with its message as the reason;
raising :class:`GiveBack` gives it back for another worker (a task this one does not know).

:meth:`Worker.starved` is the signal for batch handlers: it is True when
the worker has no more jobs available right now: nothing is waiting in the
local buffer and the last GETJOB returned fewer jobs than it asked for. A
handler that accumulates work (e.g. rows for one bulk insert) flushes when
it sees it; :func:`current_worker` finds the worker from inside a handler.

:meth:`Worker.stats` returns a frozen :class:`WorkerStats` snapshot of the counters.
"""

from __future__ import annotations

from .handlers import GiveBack, Reject, describe_error, trace_of
from .pause import FailureGate
from .runtime import Worker, current_worker
from .settings import DEFAULT_DEAD_LETTER, DEFAULT_PAUSE_BACKOFF, DEFAULT_RETRY_BACKOFF, WorkerSettings
from .stats import WorkerStats

__all__ = [
    "Worker",
    "WorkerSettings",
    "WorkerStats",
    "FailureGate",
    "current_worker",
    "describe_error",
    "trace_of",
    "Reject",
    "GiveBack",
    "DEFAULT_DEAD_LETTER",
    "DEFAULT_RETRY_BACKOFF",
    "DEFAULT_PAUSE_BACKOFF",
]
