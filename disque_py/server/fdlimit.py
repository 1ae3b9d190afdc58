"""Fit ``maxclients`` to the open-file limit, as Disque does at start and on CONFIG SET.

Every client is a file descriptor, and the node needs a few more of its own
(listeners, cluster bus links, the log, the epolls, later the AOF). When the
process may not open ``maxclients`` + :data:`RESERVED_FDS` files, the soft
``RLIMIT_NOFILE`` is raised towards the hard one. If that is still not
enough, ``maxclients`` is lowered to what fits, with a warning, so that a
client over the limit gets Disque's ``-ERR max number of clients reached``
instead of waiting unaccepted in the listen backlog while the node cannot
``accept`` (EMFILE).

Called by the node (:mod:`.app`) at start and on CONFIG SET maxclients
(which it vetoes when the limit cannot be raised far enough).
"""

from __future__ import annotations

import logging
import resource

__all__ = ["RESERVED_FDS", "fit_maxclients"]

#: Descriptors kept for the node itself beyond its clients (Disque keeps 32).
RESERVED_FDS = 32


def fit_maxclients(maxclients: int) -> tuple[int, list[tuple[int, str]]]:
    """Raise the soft open-file limit if needed; the ``maxclients`` that fits and what to log.

    The notes are ``(logging level, text)``; none when nothing had to
    change. Raises :class:`OSError` only if the limit is so low that not
    even one client fits.
    """
    want = maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return maxclients, []
    notes: list[tuple[int, str]] = []
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            raised = "Open files limit raised from %d to %d for maxclients %d." % (soft, target, maxclients)
            notes.append((logging.INFO, raised))
            soft = target
        except (OSError, ValueError) as exc:
            notes.append((logging.WARNING, "Can't raise the open files limit from %d to %d: %s." % (soft, target, exc)))
    if soft >= want:
        return maxclients, notes
    fit = soft - RESERVED_FDS
    if fit < 1:
        raise OSError(
            "the open files limit ('ulimit -n') of %d is not enough to start: at least %d is needed"
            % (soft, RESERVED_FDS + 1)
        )
    notes.append((
        logging.WARNING,
        "You requested maxclients of %d requiring at least %d max file descriptors, but the "
        "limit is %d: maxclients has been reduced to %d to compensate. If you need more "
        "clients, increase 'ulimit -n'." % (maxclients, want, soft, fit),
    ))  # fmt: skip
    return fit, notes
