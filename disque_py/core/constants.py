"""Numbers the node, its AOF, its configuration and its clients share, each written once.

A leaf: it imports nothing, so that the core, the AOF records, the configuration and the task
layer (a client of the cluster: ``tests/test_contracts.py`` lets it import this and ``ids``)
may all use it. Not compiled: its constants are literals, which a compiled module that imports
them inlines; ``default_retry`` is called once per set of ADDJOB options (``commands``
remembers what it parsed) and by the task layer.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "INT64_MIN", "INT64_MAX", "REPLICATE_MAX", "DURATION_MAX", "DEFAULT_TTL", "DEFAULT_RETRY_MAX", "default_retry",
    "INTERNAL_QUEUE_PREFIX",
]  # fmt: skip

#: Redis's ``long long``: the range of a command's integer (``commands.parse_int``), of a
#: configuration number, of a job's times and counters on the bus (``wire``) and in the AOF
#: (``persistence/records``).
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

#: The largest REPLICATE (ADDJOB's, and a job's on the bus and in the AOF).
REPLICATE_MAX: Final = 65535
#: The longest DELAY or RETRY a job arriving from a peer or the AOF may carry (seconds; 68 years).
DURATION_MAX: Final = 1 << 31

#: Queues whose names start with this are the cluster's own (a task's result: ``@result:<job ID>``):
#: queues in every respect (replicated, their TTL, GETJOB), but QSCAN leaves them out unless
#: asked (``QSCAN ... ALL``), and so do ``disque-py top``, the admin page and /metrics.
INTERNAL_QUEUE_PREFIX: Final = b"@"

#: ADDJOB's TTL when it names none (seconds; Disque's: a day).
DEFAULT_TTL: Final = 86400
#: The longest RETRY ADDJOB gives a job that names none (seconds; Disque's JOB_DEFAULT_RETRY_MAX).
DEFAULT_RETRY_MAX: Final = 300


def default_retry(ttl: int) -> int:
    """ADDJOB's RETRY for a job of ``ttl`` seconds that names none: Disque's rule (job.c,
    ``addjobCommand``), a tenth of its TTL, at most ``DEFAULT_RETRY_MAX``, at least 1 s (300 s
    for the default TTL). The node's (``commands.parse_addjob``) and the task layer's
    (``tasks/app.py``, which never goes below it) one rule."""
    return max(1, min(ttl // 10, DEFAULT_RETRY_MAX))
