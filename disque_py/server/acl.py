"""Users and their rights: the table behind AUTH, ``ACL ...`` and the check before a command runs.

A subset of Redis 6+ ACLs that redis-cli users recognise, with rights suited to a
job broker. A user has a name, is ``on`` or ``off``, has passwords (kept only as
SHA-256 hex digests, as Redis keeps them, and compared with
``hmac.compare_digest``) or ``nopass``, a set of commands it may run (granted by
categories, ``+@produce``, or one by one, ``+qlen``) and queue-name patterns
(``~orders.*``, Redis glob syntax; ``allkeys`` is ``~*``).

Rules (``ACL SETUSER name rule ...`` and the ``user name rule ...`` directive):

=====================  =========================================================
``on`` / ``off``       may / may not authenticate
``>pw`` / ``<pw``      add / remove a password
``#hex`` / ``!hex``    add / remove a password by its SHA-256 hex digest
``nopass``             any password is accepted (and the passwords are dropped)
``resetpass``          no password, no ``nopass``: nobody can authenticate
``~pattern``           queues matching the pattern may be used; ``allkeys`` = ``~*``
``resetkeys``          no queue at all
``+@cat`` / ``-@cat``  the commands of a category (``@all``: every command)
``+cmd`` / ``-cmd``    one command (``client|kill`` names a subcommand)
``allcommands``        ``+@all``; ``nocommands`` is ``-@all``
``reset``              ``resetpass resetkeys off -@all``: what a new user starts as
=====================  =========================================================

``ACL LIST`` shows each user as such rules (passwords as ``#digest``); after
ACL SETUSER or DELUSER the config's ``user`` value becomes those lines, so
CONFIG REWRITE saves the users as they are (until then it keeps the file's
``user`` lines as written).

The categories (:data:`CATEGORY_NAMES`; ``ACL CAT`` lists them) overlap as
Redis's do: a command is allowed when any granted category holds it and no
later ``-`` rule took it away. Commands every authenticated connection may
run whatever its rights (``ALWAYS``) are in no category: AUTH, HELLO,
QUIT, PING, ECHO, TIME, COMMAND, the CLIENT subcommands about the connection
itself, ACL WHOAMI and ACL CAT. Which command is in which category, and where
it names queues or job IDs, is said by the command's own declaration
(``core/commandspec.py``); :class:`Rights` reads them once, when the node's
:class:`Acl` is made, so this module names no command.

Queues: a command naming queues (``QUEUE``: ADDJOB, QLEN, QSTAT, QPEEK, PAUSE;
``FROM_QUEUES``: GETJOB ... FROM q1 q2) is refused if any of them matches none
of the user's patterns. A command naming job IDs (``JOB_IDS``: ACKJOB, FASTACK,
NACK, WORKING, SHOW, ENQUEUE, DEQUEUE, DELJOB) is checked against the queue of
each job this node holds; an ID the node does not hold (or a malformed one) is
refused to a user without ``allkeys``: an ACKJOB of an unknown ID would
otherwise spread an acknowledgement through the cluster for a job of any queue.
QSCAN and JSCAN (``EVERY_QUEUE``) walk every queue and job, so they need
``allkeys``.

The ``default`` user always exists. ``requirepass`` is its password (no
``requirepass``: ``nopass``), unless a ``user default ...`` line says
otherwise (each ``user`` line starts from ``reset``, as in Redis; a later
CONFIG SET requirepass sets the password again). With no ``user``
configured a node behaves as before: every connection is ``default`` with every right, or must
``AUTH <requirepass>`` first. A connection whose user has every command and
``allkeys`` is never checked (``Connection.perms`` is None: one attribute
test in the dispatcher); otherwise ``perms`` is its :class:`User`, read live,
so ``ACL SETUSER`` changes apply to its next command. ``ACL DELUSER``, and
``ACL SETUSER ... off``, close the connections authenticated as that user.

Failed AUTHs (and HELLO ... AUTH) are counted in INFO stats as
``acl_access_denied_auth`` (Redis 7's name); refused commands and queues as
``acl_access_denied_cmd`` and ``acl_access_denied_key``. A connection that
fails :data:`AUTH_FAILURE_LIMIT` times in a row is closed after the reply to
the last one, so guessing costs a new connection every few attempts.

Called by: the admin commands (:mod:`.admin`: AUTH, HELLO, ACL) and the
dispatcher (:mod:`.dispatch`: :meth:`Acl.check`). It imports only the
glob matcher (:mod:`disque_py.util.globmatch`) and the command declarations' type.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Callable, Iterable

from ..core.commandspec import ALWAYS, EVERY_QUEUE, FROM_QUEUES, JOB_IDS, QUEUE, CommandSpec
from ..util.globmatch import glob_match

__all__ = [
    "Acl",
    "AclError",
    "User",
    "Rights",
    "CATEGORY_NAMES",
    "AUTH_FAILURE_LIMIT",
    "WRONGPASS",
    "hash_password",
]

AUTH_FAILURE_LIMIT = 5  # failed AUTHs in a row before the connection is closed
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."

#: The categories, as ``ACL CAT`` lists them. What each holds is declared by the commands
#: (``CommandSpec.acl``): produce = add jobs and look at the queues they go to; consume = take
#: jobs, acknowledge them, give them back or ask for more time; inspect = look without
#: changing anything (queues, jobs, INFO, the slow log); admin = run the node, and move or
#: delete jobs by hand.
CATEGORY_NAMES = ("produce", "consume", "inspect", "admin")


class Rights:
    """What the ACL knows of the node's commands, read off their declarations, once.

    ``categories``: category -> the command keys it grants (``addjob``, or ``client|kill``
    for a subcommand declared apart); ``always``: the keys every connection may run;
    ``all_commands``: every key some category grants; ``keys``: command name -> where it
    names queues or job IDs (``core/commandspec.py``); ``subcommands``: the commands whose
    subcommands are named apart; ``plain``: the others, name -> (key or None: always allowed,
    where it names queues), so that checking one costs a single lookup.
    """

    __slots__ = ("categories", "always", "all_commands", "keys", "subcommands", "plain")

    def __init__(self, specs: Iterable[CommandSpec]) -> None:
        specs = tuple(specs)
        categories: dict[str, set[str]] = {name: set() for name in CATEGORY_NAMES}
        always: set[str] = set()

        def grant(key: str, acl: tuple[str, ...]) -> None:
            if acl == ALWAYS:
                always.add(key)
                return
            if not acl:
                raise ValueError("command %r is in no ACL category" % key)
            for cat in acl:
                if cat not in categories:
                    raise ValueError("command %r: no ACL category %r" % (key, cat))
                categories[cat].add(key)

        keys: dict[bytes, str] = {}
        subcommands: set[bytes] = set()
        for spec in specs:
            name = spec.name.decode()
            grant(name, spec.acl)
            for sub, acl in spec.subcommands:
                grant(name + "|" + sub, acl)
                subcommands.add(spec.name)
            if spec.keys is not None:
                keys[spec.name] = spec.keys
        self.categories: dict[str, frozenset[str]] = {c: frozenset(v) for c, v in categories.items()}
        self.always = frozenset(always)
        self.all_commands: frozenset[str] = frozenset().union(*self.categories.values())
        self.keys = keys
        self.subcommands = frozenset(subcommands)
        # What ``Acl.check`` reads first: name -> (its key, or None if it needs no right; where it
        # names queues) for every command whose subcommands are not named apart.
        self.plain: dict[bytes, tuple[str | None, str | None]] = {
            spec.name: (None if spec.name.decode() in self.always else spec.name.decode(), spec.keys)
            for spec in specs if spec.name not in self.subcommands
        }

    def command_key(self, name: bytes, argv: list[bytes]) -> str:
        """The name rights are given by: ``addjob``, or ``client|kill`` for a checked subcommand."""
        if name in self.subcommands and len(argv) > 1:
            key = "%s|%s" % (name.decode(), argv[1].decode("utf-8", "replace").lower())
            if key in self.always or key in self.all_commands:
                return key
            return name.decode()  # other subcommands: as the command
        return name.decode("utf-8", "replace")


class AclError(Exception):
    """A rule that cannot be applied; the text is the reply (or the config error)."""


def hash_password(password: bytes) -> str:
    return hashlib.sha256(password).hexdigest()


class User:
    """One user. ``commands``: the command keys granted; ``patterns``: queue globs; ``rights``:
    the node's commands (what ``+@cat`` grants, what ``+cmd`` may name)."""

    __slots__ = ("name", "enabled", "nopass", "passwords", "commands", "patterns", "allkeys", "rights")

    def __init__(self, name: bytes, rights: Rights) -> None:
        self.name = name
        self.rights = rights
        self.enabled = False
        self.nopass = False
        self.passwords: list[str] = []  # SHA-256 hex digests, in the order added
        self.commands: set[str] = set()
        self.patterns: list[bytes] = []
        self.allkeys = False

    def copy(self) -> "User":
        other = User(self.name, self.rights)
        other.set_from(self)
        return other

    def set_from(self, other: "User") -> None:
        self.enabled = other.enabled
        self.nopass = other.nopass
        self.passwords = list(other.passwords)
        self.commands = set(other.commands)
        self.patterns = list(other.patterns)
        self.allkeys = other.allkeys

    @property
    def unrestricted(self) -> bool:
        """Every command on every queue: its connections are never checked."""
        return self.allkeys and self.commands >= self.rights.all_commands

    def apply(self, rule: bytes) -> None:
        """Apply one rule; :class:`AclError` if it is not one."""
        low = rule.lower()
        if low == b"on":
            self.enabled = True
        elif low == b"off":
            self.enabled = False
        elif low == b"nopass":
            self.nopass = True
            self.passwords = []
        elif low == b"resetpass":
            self.nopass = False
            self.passwords = []
        elif low == b"allkeys":
            self.allkeys = True
            self.patterns = [b"*"]
        elif low == b"resetkeys":
            self.allkeys = False
            self.patterns = []
        elif low in (b"allcommands", b"+@all"):
            self.commands = set(self.rights.all_commands)
        elif low in (b"nocommands", b"-@all"):
            self.commands = set()
        elif low == b"reset":
            for r in (b"resetpass", b"resetkeys", b"off", b"-@all"):
                self.apply(r)
        elif rule[:1] == b">":
            digest = hash_password(rule[1:])
            if digest not in self.passwords:
                self.passwords.append(digest)
            self.nopass = False
        elif rule[:1] == b"<":
            digest = hash_password(rule[1:])
            if digest not in self.passwords:
                raise AclError("The password you are trying to remove from the user does not exist")
            self.passwords.remove(digest)
        elif rule[:1] in (b"#", b"!"):
            digest = rule[1:].decode("ascii", "replace").lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise AclError("The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters")
            if rule[:1] == b"#":
                if digest not in self.passwords:
                    self.passwords.append(digest)
                self.nopass = False
            elif digest in self.passwords:
                self.passwords.remove(digest)
            else:
                raise AclError("The password you are trying to remove from the user does not exist")
        elif rule[:1] == b"~":
            pattern = rule[1:]
            if pattern == b"*":
                self.apply(b"allkeys")
            elif not self.allkeys and pattern not in self.patterns:
                self.patterns.append(pattern)
        elif rule[:2] in (b"+@", b"-@"):
            cat = low[2:].decode("utf-8", "replace")
            categories = self.rights.categories
            if cat not in categories:
                raise AclError("Unknown command or category name in ACL")
            if rule[:1] == b"+":
                self.commands |= categories[cat]
            else:
                self.commands -= categories[cat]
        elif rule[:1] in (b"+", b"-"):
            cmd = low[1:].decode("utf-8", "replace")
            if cmd not in self.rights.all_commands:
                raise AclError("Unknown command or category name in ACL")
            if rule[:1] == b"+":
                self.commands.add(cmd)
            else:
                self.commands.discard(cmd)
        else:
            raise AclError("Syntax error")

    def describe(self) -> list[str]:
        """The rules that make this user again (ACL LIST, the ``user`` directive)."""
        out = ["on" if self.enabled else "off"]
        if self.nopass:
            out.append("nopass")
        out.extend("#" + d for d in self.passwords)
        if self.allkeys:
            out.append("~*")
        else:
            out.append("resetkeys")
            out.extend("~" + p.decode("utf-8", "surrogateescape") for p in self.patterns)
        if self.commands >= self.rights.all_commands:
            out.append("+@all")
        else:
            out.append("-@all")
            covered: set[str] = set()
            for cat, cmds in self.rights.categories.items():
                if cmds <= self.commands:
                    out.append("+@" + cat)
                    covered |= cmds
            out.extend("+" + c for c in sorted(self.commands - covered))
        return out

    def may_use(self, queue: bytes) -> bool:
        if self.allkeys:
            return True
        for pattern in self.patterns:
            if glob_match(pattern, queue):
                return True
        return False


def _check_name(name: bytes) -> None:
    if not name or any(c <= 32 or c >= 127 for c in name):
        raise AclError("Usernames can't contain spaces or null characters")


class Acl:
    """The user table of a node (always holding ``default``). ``commands``: the declarations
    of every command the node answers (``core/commandspec.py``), read into :attr:`rights`."""

    def __init__(
        self,
        requirepass: str = "",
        user_lines: Iterable[Iterable[str | bytes]] = (),
        *,
        commands: Iterable[CommandSpec],
    ) -> None:
        self.rights = rights = Rights(commands)
        default = User(b"default", rights)
        default.enabled = True
        default.apply(b"allkeys")
        default.apply(b"allcommands")
        self.users: dict[bytes, User] = {b"default": default}
        self.default = default
        self.set_requirepass(requirepass)
        for line in user_lines:
            words = [w.encode("utf-8", "surrogateescape") if isinstance(w, str) else w for w in line]
            if not words:
                raise AclError("a user line needs a user name")
            self.setuser(words[0], [b"reset", *words[1:]])  # a configured user starts from nothing (as Redis)

    @classmethod
    def from_config(cls, config, commands: Iterable[CommandSpec]) -> "Acl":
        """The table the config describes, following ``requirepass`` as CONFIG SET changes it."""
        acl = cls(config.requirepass or "", getattr(config, "user", None) or (), commands=commands)
        config.on_change.append(acl._config_changed)
        return acl

    def _config_changed(self, name: str, old, new) -> None:
        if name == "requirepass":
            self.set_requirepass(new or "")

    def config_lines(self) -> list[list[str]]:
        """The ``user`` directive's value for this table (CONFIG REWRITE writes it): every user
        but ``default`` while it is just what ``requirepass`` makes it."""
        lines = []
        for name, user in self.users.items():
            if user is self.default and user.enabled and user.unrestricted and (
                    user.passwords == [hash_password(self.requirepass)] if self.requirepass else user.nopass):
                continue
            lines.append([name.decode("utf-8", "surrogateescape"), *user.describe()])
        return lines

    def set_requirepass(self, password: str) -> None:
        """``requirepass``: the default user's one password ("": ``nopass``). Connections already
        authenticated stay so, as they always have."""
        self.requirepass = password.encode("utf-8", "surrogateescape")
        default = self.default
        default.apply(b"resetpass")
        default.apply(b">" + self.requirepass if password else b"nopass")

    @property
    def default_open(self) -> bool:
        """A new connection is the default user without AUTH (no requirepass, as Disque)."""
        return self.default.enabled and self.default.nopass

    def setuser(self, name: bytes, rules: list[bytes]) -> tuple[User, bool]:
        """Create or change a user; all rules apply or none (AclError names the one at fault).
        Returns the user and whether it existed before."""
        _check_name(name)
        existing = self.users.get(name)
        draft = existing.copy() if existing is not None else User(name, self.rights)
        for rule in rules:
            try:
                draft.apply(rule)
            except AclError as exc:
                raise AclError("Error in ACL SETUSER modifier '%s': %s" % (rule.decode("utf-8", "replace"), exc)) from None
        if existing is None:
            self.users[name] = draft
            return draft, False
        existing.set_from(draft)
        return existing, True

    def deluser(self, name: bytes) -> bool:
        if name == b"default":
            raise AclError("The 'default' user cannot be removed")
        return self.users.pop(name, None) is not None

    def authenticate(self, name: bytes, password: bytes) -> User | None:
        """The user if ``password`` is one of its own and it is on; None otherwise.

        The digest is compared with every stored one in constant time (no early exit), and an
        unknown user costs the same hash, so the time taken says little about what matched."""
        user = self.users.get(name)
        digest = hash_password(password).encode()
        ok = False
        for stored in user.passwords if user is not None else ("0" * 64,):
            ok |= hmac.compare_digest(digest, stored.encode())
        if user is None or not user.enabled:
            return None
        return user if ok or user.nopass else None

    @staticmethod
    def perms_of(user: User) -> User | None:
        """What a connection authenticated as ``user`` keeps in ``perms`` (None: never checked)."""
        return None if user.unrestricted else user

    def check(
        self, user: User, name: bytes, argv: list[bytes], queue_of: Callable[[bytes], bytes | None]
    ) -> tuple[str, str] | None:
        """None if ``user`` may run ``argv``; else (what was refused: "cmd" or "key", the error).

        ``queue_of(job_id)``: the queue of a job this node holds, None if it holds none."""
        rights = self.rights
        entry = rights.plain.get(name)  # one lookup for a command whose subcommands go as it
        if entry is None:  # named apart by subcommand, or not a command at all
            key = rights.command_key(name, argv)
            if key in rights.always:
                return None
            kind = rights.keys.get(name)
        else:
            key, kind = entry
            if key is None:  # needs no right
                return None
        if key not in user.commands:
            return "cmd", "NOPERM this user has no permissions to run the '%s' command" % key
        if kind is None or user.allkeys:
            return None
        if kind == QUEUE:
            if len(argv) > 1 and not user.may_use(argv[1]):
                return "key", _queue_denied(argv[1])
        elif kind == FROM_QUEUES:
            for i in range(1, len(argv)):
                if argv[i].lower() == b"from":
                    for queue in argv[i + 1:]:
                        if not user.may_use(queue):
                            return "key", _queue_denied(queue)
                    break
        elif kind == JOB_IDS:
            for job_id in argv[1:]:
                queue = queue_of(job_id)
                if queue is None:
                    return "key", "NOPERM this user has no permissions to access the job '%s': it is not known to this node" % job_id.decode("utf-8", "replace")
                if not user.may_use(queue):
                    return "key", _queue_denied(queue)
        elif kind == EVERY_QUEUE:
            return "key", "NOPERM this user has no permissions to access every queue, as '%s' needs" % key
        return None


def _queue_denied(queue: bytes) -> str:
    return "NOPERM this user has no permissions to access the '%s' queue" % queue.decode("utf-8", "replace")
