"""A worker's settings, declared once: :class:`WorkerSettings`, checked when made.

``Worker(client, queues, handler, concurrency=4, ...)`` takes each of them as a keyword (as
documented), or ``Worker(client, queues, handler, settings=WorkerSettings(...))`` the whole set
(a keyword given too replaces that one). Each stage reads the settings it needs:

* the run stages (``runners.py``, ``threads.py``): ``concurrency``, ``max_attempts``;
* the fetcher (``fetch.py``): ``max_in_flight``, ``fetch_timeout_ms``;
* what an outcome is (``outcome.py``): ``max_attempts``, ``retry_backoff``, ``dead_letter``;
* the pause (``pause.py``): ``backoff``, ``backoff_after``, ``backoff_ratio``;
* sending outcomes (``acks.py``): ``fast_ack``;
* the jobs' heartbeats (``keepalive.py``): ``heartbeat``;
* the stop (``stop.py``): ``grace_period``;
* the worker's beats to the cluster (``beacon.py``): ``beacon_interval``, ``describe``;
* the worker's control queue (``control.py``): ``on_cancel``;
* the jitters (retry delays, pauses): ``rng``.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from ..cluster import Backoff
from ..model import Job
from .handlers import DeadLetterHandler
from .pause import DEFAULT_PAUSE_BACKOFF, FailureGate

__all__ = ["WorkerSettings", "DEFAULT_DEAD_LETTER", "DEFAULT_RETRY_BACKOFF", "DEFAULT_PAUSE_BACKOFF"]


class _Default(enum.Enum):
    DEAD_LETTER = "NACK ... DEAD: the cluster's dead letter"


#: ``dead_letter=`` default: ``NACK <id> DEAD REASON <error>``: the cluster dead-letters the job
#: (into its DEADLETTER queue, ``<queue>.dead`` by default). On a node that does not know NACK's
#: options (Disque's), the worker ADDs a JSON :class:`DeadLetter` to ``<queue>.dead`` instead.
DEFAULT_DEAD_LETTER = _Default.DEAD_LETTER

#: ``retry_backoff=`` default: a failed job comes back after 1 s, 2 s, 4 s... (at most 5
#: minutes), jittered by up to 25 % (NACK's DELAY).
DEFAULT_RETRY_BACKOFF = Backoff(initial=1.0, maximum=300.0, factor=2.0, jitter=0.25)


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker fetches, retries, pauses and stops (see the module docstring for who reads what).

    ``concurrency``: handlers at once. ``max_in_flight``: jobs fetched and not yet acknowledged,
    at most (None: ``2 * concurrency``, :attr:`in_flight_limit`). ``fetch_timeout_ms``: how
    long one GETJOB blocks (it also bounds how long a stop waits for the fetcher).

    ``max_attempts``: dead-letter on a failure of this attempt (None: never; the job's own
    MAXDELIVER still applies). ``retry_backoff``: the delay before a failed job comes back
    (NACK DELAY; default :data:`DEFAULT_RETRY_BACKOFF`, 1 s doubling up to 5 min; None: at once).
    ``dead_letter``: :data:`DEFAULT_DEAD_LETTER` (the cluster's dead letter, ``NACK ... DEAD``),
    a callable ``(job, error_text)`` (sync or async; the job is then acknowledged), or None to
    drop such jobs (ACK and log).

    ``backoff``, ``backoff_after`` and ``backoff_ratio``: the consumer-wide pause, when
    ``backoff_ratio`` (0.9) of the last ``backoff_after`` (20) jobs failed (None: the default
    :data:`DEFAULT_PAUSE_BACKOFF`, 0.5 s doubling up to 5 s).

    ``fast_ack``: FASTACK instead of ACKJOB. ``heartbeat``: False, True (auto) or seconds
    between WORKING commands. ``grace_period``: seconds running handlers get after a stop.
    ``rng``: the random generator for the jitters (None: a new one).

    ``beacon_interval``: seconds between the worker's beats to the cluster (``WORKER BEAT``:
    who it is, what it runs, its counters; ``disque-py workers`` lists it), at least 0.1; None:
    no beats. ``describe``: ``job -> str``, the label a running job is shown with (the task
    runner gives the task's name; None: none).

    ``on_cancel``: ``job_id -> None``, called in the trio thread for each cancel notice the
    worker's control queue brings (``@control:<worker id>``, :mod:`.control`; the task runner
    stops that task); None: no control queue is read.
    """

    concurrency: int = 1
    max_in_flight: int | None = None
    fetch_timeout_ms: int = 1000
    max_attempts: int | None = 5
    retry_backoff: Backoff | None = DEFAULT_RETRY_BACKOFF
    dead_letter: DeadLetterHandler | None | _Default = DEFAULT_DEAD_LETTER
    backoff: Backoff | None = None
    backoff_after: int = 20
    backoff_ratio: float = 0.9
    fast_ack: bool = False
    heartbeat: bool | float = False
    grace_period: float = 30.0
    rng: random.Random | None = dataclasses.field(default=None, compare=False)
    beacon_interval: float | None = 5.0
    describe: Callable[[Job], str] | None = None
    on_cancel: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.max_in_flight is not None and self.max_in_flight < self.concurrency:
            raise ValueError("max_in_flight (%d) must be >= concurrency (%d)" % (self.max_in_flight, self.concurrency))
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1 (or None)")
        if self.fetch_timeout_ms < 1:
            raise ValueError("fetch_timeout_ms must be >= 1")
        FailureGate.check(self.backoff_after, self.backoff_ratio)
        if self.beacon_interval is not None and not 0.1 <= self.beacon_interval <= 86400:
            raise ValueError("beacon_interval must be between 0.1 and 86400 seconds (or None: no beats)")

    @classmethod
    def of(cls, settings: "WorkerSettings | None", options: dict[str, Any]) -> "WorkerSettings":
        """``settings`` (default: the defaults) with the keywords in ``options`` replacing theirs;
        a keyword that is no setting raises TypeError naming it."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError("Worker() got unexpected keyword argument(s): %s" % ", ".join(unknown))
        if settings is None:
            return cls(**options)
        return dataclasses.replace(settings, **options) if options else settings

    # The defaults that depend on other settings (a field left None keeps meaning "the default",
    # also in a copy made with other keywords).
    @property
    def in_flight_limit(self) -> int:
        """``max_in_flight``, or ``2 * concurrency`` without one."""
        return 2 * self.concurrency if self.max_in_flight is None else self.max_in_flight

    @property
    def pause_backoff(self) -> Backoff:
        """``backoff``, or :data:`DEFAULT_PAUSE_BACKOFF` without one."""
        return DEFAULT_PAUSE_BACKOFF if self.backoff is None else self.backoff
