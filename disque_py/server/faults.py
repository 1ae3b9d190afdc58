"""Fault hooks for the chaos tests: a node's clock shifted, its next fsyncs failed.

They exist so that the chaos harness (``tests/chaos``) can put a real node
process through faults a test cannot otherwise cause on demand: a jump of the
node's monotonic clock (what a VM migration or a stalled hypervisor does to
the timers of a process), and an ``fdatasync`` that fails (a disk that
reports an I/O error).

They are off unless the node was started with ``DISQUE_PY_FAULT_HOOKS=1`` in
its environment; no configuration directive or command turns them on, so a
production node cannot be made to lose its durability by a client. When on,
two ``DEBUG`` subcommands reach them:

* ``DEBUG JUMP-CLOCK <ms>``: every later reading of the shell's clock
  (:func:`.contracts.now_ms`, the time the core and the cluster bus's
  membership see) is shifted by ``ms`` (negative goes back), at once;
* ``DEBUG FAIL-FSYNC <n>``: the next ``n`` fsyncs of the append only file
  fail with EIO.

This module imports nothing of the shell but :mod:`.contracts`.
"""

from __future__ import annotations

import errno
import os

from . import contracts

__all__ = ["ENABLED", "jump_clock", "fail_fsyncs", "fdatasync", "debug"]

#: Whether this process takes fault hooks (read once, at import).
ENABLED = os.environ.get("DISQUE_PY_FAULT_HOOKS") == "1"

_fsync_failures = 0


def jump_clock(ms: int) -> int:
    """Shift the shell's clock by ``ms``; the total shift so far."""
    contracts.shift_clock(ms)
    return contracts.clock_shift_ms()


def fail_fsyncs(n: int) -> None:
    """Make the next ``n`` calls of :func:`fdatasync` fail with EIO."""
    global _fsync_failures
    _fsync_failures = max(0, n)


def fdatasync(fd: int) -> None:
    """``os.fdatasync``, unless a fault was asked for (then OSError EIO, once per failure asked)."""
    global _fsync_failures
    if _fsync_failures:
        _fsync_failures -= 1
        raise OSError(errno.EIO, "Input/output error (fault hook)")
    os.fdatasync(fd)


def debug(argv: list[bytes]) -> int | str:
    """``DEBUG JUMP-CLOCK ms`` / ``DEBUG FAIL-FSYNC n`` (``argv`` from the subcommand on): an integer
    reply, or an error text."""
    if not ENABLED:
        return "fault hooks are off: start the node with DISQUE_PY_FAULT_HOOKS=1 in its environment"
    if len(argv) != 2:
        return "wrong number of arguments for DEBUG %s" % argv[0].decode("utf-8", "replace").upper()
    try:
        n = int(argv[1])
    except ValueError:
        return "value is not an integer or out of range"
    if argv[0].lower() == b"jump-clock":
        return jump_clock(n)
    fail_fsyncs(n)
    return n
