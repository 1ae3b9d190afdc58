"""What a command is: one declaration per command, next to the code that answers it.

Each command the node answers is declared once, as a :class:`CommandSpec`, in the
module that owns it: the core's in a ``COMMANDS`` tuple beside their machine
(``ACKJOB`` in ``acks.py``, ``ADDJOB`` in ``replication.py`` ...), collected by
``node.py`` (``CORE_COMMANDS``); the shell's in ``server/admin.py`` and
``server/cluster.py``. Everything else about a command is derived from these
declarations, once, when a node is made:

* the dispatch tables (``Node.commands``, the shell's admin table): name ->
  (bound handler, arity), the only thing the dispatch path reads (:func:`bind`);
* the commands refused at memory level 3 (``denyoom`` in ``flags``);
* COMMAND's reply (arity and flags);
* the ACL rights (``server/acl.py``: the categories, the commands every
  connection may run, and where a command names its queues or job IDs);
* what a person is told of it: ``disque-py cli``'s ``help`` (``cli/commandhelp.py``) and
  COMMAND DOCS (``server/commanddocs.py``), from its ``syntax``, ``summary``, ``group``
  and ``since``.

The syntax is written in Redis's notation, the arguments named as Disque's README names
them: the command's name first, upper case; an UPPER-CASE word is typed as it is (a
token: ``FROM``, ``REPLICATE``; any case works); a lower-case word is a value the user
gives (``queue_name``, ``ms-timeout``); ``[...]`` is optional; ``x [x ...]`` is one or
more; ``A|B`` (no spaces) is one of two words; `` | `` (spaced) separates alternatives
of whole argument lists, at the top (a command's subcommands: ``CONFIG GET parameter |
SET parameter value``) or inside brackets.

A leaf: it imports nothing, so that both the core and the shell may use it.
"""

from __future__ import annotations

from typing import Callable, Final, Iterable, NamedTuple, TypeVar

__all__ = [
    "CommandSpec",
    "ALWAYS",
    "QUEUE",
    "FROM_QUEUES",
    "JOB_IDS",
    "EVERY_QUEUE",
    "KEY_KINDS",
    "FLAGS",
    "GROUPS",
    "DISQUE",
    "bind",
    "check_unique",
]

#: The ACL "category" of a command any authenticated connection may run, whatever its rights.
ALWAYS: Final = ("always",)

H = TypeVar("H")  # a handler: the core's (client, argv), the shell's own

# Where a command names the queues (or jobs) it touches: what an ACL with queue patterns checks.
QUEUE: Final = "queue"  # the first argument is a queue name (ADDJOB, QLEN ...)
FROM_QUEUES: Final = "from"  # every argument after FROM is a queue name (GETJOB)
JOB_IDS: Final = "ids"  # every argument is a job ID, checked against the queue of the job (ACKJOB ...)
EVERY_QUEUE: Final = "every"  # walks every queue and job (QSCAN, JSCAN): needs every queue
KEY_KINDS: Final = frozenset({QUEUE, FROM_QUEUES, JOB_IDS, EVERY_QUEUE})

#: The flags COMMAND shows (Redis's names for Disque's letters: w r m a l F).
FLAGS: Final = frozenset({"write", "readonly", "denyoom", "admin", "loading", "fast"})

#: What a command is about (``help @jobs``, COMMAND DOCS' ``group``), in the order help lists them.
GROUPS: Final = ("jobs", "queues", "workers", "cluster", "connection", "server")

#: ``since`` of the commands Disque 1.0-rc1 has; ours say ``disque-py <version>``.
DISQUE: Final = "Disque 1.0-rc1"


class CommandSpec(NamedTuple):
    """One command, as its owner declares it.

    ``name``: lower case, as looked up. ``handler``: the name of the method (or, in the
    shell's table, the function) of its owner that answers it, called with
    ``(client, argv)``. ``arity``: Redis's convention, argv's length with the name
    itself; negative: at least that many. ``flags``: what COMMAND shows, in its order
    (``denyoom``: refused with -OOM at memory level 3). ``acl``: the ACL categories
    that grant it (``ALWAYS``: needs no right). ``keys``: where its queue names or job
    IDs sit (one of ``KEY_KINDS``; None: none). ``subcommands``: (subcommand, its
    categories) for those whose rights differ from the command's; the others go as
    the command. ``syntax``: the whole command in the notation of the module docstring;
    ``summary``: one line on what it does; ``group``: one of ``GROUPS``; ``since``: the
    release that brought it (``DISQUE``, or ``disque-py <version>`` for ours). Read by
    people (help, COMMAND DOCS), never by the dispatch path.
    """

    name: bytes
    handler: str
    arity: int
    flags: tuple[str, ...]
    acl: tuple[str, ...]
    keys: str | None = None
    subcommands: tuple[tuple[str, tuple[str, ...]], ...] = ()
    syntax: str = ""
    summary: str = ""
    group: str = ""
    since: str = DISQUE


def check_unique(specs: Iterable[CommandSpec]) -> tuple[CommandSpec, ...]:
    """``specs`` as a tuple; ValueError if a name is declared twice or a spec is malformed."""
    out = tuple(specs)
    seen: set[bytes] = set()
    for spec in out:
        if spec.name in seen:
            raise ValueError("command %r is declared twice" % spec.name)
        seen.add(spec.name)
        if spec.name != spec.name.lower() or not spec.arity:
            raise ValueError("command %r: a lower-case name and a non-zero arity" % spec.name)
        if not set(spec.flags) <= FLAGS or (spec.keys is not None and spec.keys not in KEY_KINDS):
            raise ValueError("command %r: unknown flag or key kind" % spec.name)
        if spec.group and spec.group not in GROUPS:
            raise ValueError("command %r: unknown group %r" % (spec.name, spec.group))
    return out


def bind(specs: Iterable[CommandSpec], lookup: Callable[[str], H]) -> dict[bytes, tuple[H, int]]:
    """A dispatch table, name -> (handler, arity), made once: ``lookup(spec.handler)`` gives
    the callable (``getattr`` of the owning machine, or the shell's functions by name)."""
    return {spec.name: (lookup(spec.handler), spec.arity) for spec in check_unique(specs)}
