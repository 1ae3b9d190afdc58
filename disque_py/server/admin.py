"""Connection and administration commands, answered by the shell.

These need what only the shell has (the connection, the process, the config
file): AUTH, ACL (the users of :mod:`.acl`), PING, ECHO, QUIT, INFO, TIME, COMMAND, CLIENT, CONFIG,
SHUTDOWN, DEBUG, CLUSTER (handed to the cluster service), SLOWLOG and LATENCY (reading the
stores the dispatcher feeds: :mod:`.slowlog`, :mod:`.latency`, :mod:`.cmdstats`), and the
``HELLO <protover>`` handshake. Everything about jobs and queues goes to
the core.

Each command is declared once in :data:`COMMANDS` (``core/commandspec.py``: name,
handler, arity, flags, ACL categories); :func:`build_table` binds them into the
name -> (handler, arity) table the dispatcher reads and :func:`hello_handshake`
is the handshake, both bound to an :class:`AdminContext`: the few things of the
node they read or call (config, core, stats, the open clients, shutdown, CLIENT
KILL, ops/s, and the declarations of every command the node answers, for
COMMAND), given by the node (:mod:`.app`). CLUSTER is declared and answered by
the cluster service (:mod:`.cluster`). The dispatcher (:mod:`.dispatch`) calls
the handlers; nothing here calls back into it.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import trio

from .. import DISQUE_COMPAT_VERSION, __version__
from .._build import describe as build_description
from ..config import ConfigError, config_get, config_set, rewrite_config
from ..core.commandspec import ALWAYS, CommandSpec, bind
from ..core.replies import OK, Error, Status, err, syntax_error
from ..util.rss import rss_bytes
from . import faults, gcpolicy
from .acl import AUTH_FAILURE_LIMIT, WRONGPASS, Acl, AclError
from .cmdstats import CommandStats
from .connection import PERMS_UNSET
from .contracts import NO_REPLY
from .latency import LatencyMonitor
from .logs import log
from .slowlog import SlowLog

if TYPE_CHECKING:
    from ..config import Config
    from .aof import Aof
    from ..core.node import Node
    from .connection import Connection

# SLOWLOG and LATENCY: reading is inspecting, emptying is administering.
_MONITOR_READ = ("inspect", "admin")
_ADMIN = ("admin",)

#: The shell's commands, each declared once (core/commandspec.py): ``handler`` names a function
#: of :func:`build_table`. COMMAND lists them in this order, after CLUSTER and before the core's;
#: the flags are informational, as Disque's.
COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec(b"auth", "auth", -2, ("readonly", "loading", "fast"), ALWAYS,
                syntax="AUTH [username] password",
                summary="Log in: with requirepass, or as an ACL user", group="connection"),
    CommandSpec(b"ping", "ping", -1, ("readonly", "fast"), ALWAYS,
                syntax="PING [message]", summary="PONG, or the message", group="connection"),
    CommandSpec(b"echo", "echo", 2, ("readonly", "fast"), ALWAYS,
                syntax="ECHO message", summary="The message, back", group="connection", since="disque-py 0.1.0"),
    CommandSpec(b"quit", "quit_", 1, ("readonly", "fast"), ALWAYS,
                syntax="QUIT", summary="Close the connection", group="connection"),
    CommandSpec(b"time", "time_", 1, ("readonly", "fast"), ALWAYS,
                syntax="TIME", summary="The node's clock: seconds and microseconds", group="server"),
    CommandSpec(b"info", "info", -1, ("readonly", "loading"), ("inspect",),
                syntax="INFO [section]",
                summary="The node's state and counters, by section (all, commandstats: more)", group="server"),
    CommandSpec(b"command", "command", -1, ("readonly", "loading"), ALWAYS,
                syntax="COMMAND [COUNT | LIST | INFO command [command ...] | DOCS [command [command ...]]]",
                summary="The node's commands: arity and flags; DOCS: syntax and summary", group="server"),
    CommandSpec(b"client", "client", -2, ("admin", "readonly"), ALWAYS, subcommands=(
        ("id", ALWAYS), ("getname", ALWAYS), ("setname", ALWAYS), ("setinfo", ALWAYS), ("info", ALWAYS),
        ("kill", _ADMIN), ("list", _ADMIN),
    ), syntax="CLIENT ID | GETNAME | SETNAME connection-name | SETINFO LIB-NAME|LIB-VER value | INFO | LIST | "
              "KILL ip:port | KILL [ID client-id] [ADDR ip:port] [LADDR ip:port] [SKIPME YES|NO]",
       summary="This connection (its ID and name), or every one: list them, close some", group="connection"),
    CommandSpec(b"config", "config", -2, ("admin", "readonly"), _ADMIN,
                syntax="CONFIG GET parameter | SET parameter value | REWRITE | RESETSTAT",
                summary="Read and change the directives at run time, save them to the config file",
                group="server"),
    CommandSpec(b"shutdown", "shutdown", -1, ("admin", "readonly", "loading"), _ADMIN,
                syntax="SHUTDOWN [SAVE|NOSAVE|REWRITE-AOF]",
                summary="Stop the node (REWRITE-AOF: a fresh AOF first)", group="server"),
    CommandSpec(b"bgrewriteaof", "bgrewriteaof", 1, ("admin", "readonly"), _ADMIN,
                syntax="BGREWRITEAOF", summary="Rewrite the AOF in the background", group="server"),
    CommandSpec(b"debug", "debug", -2, ("admin",), _ADMIN,
                syntax="DEBUG FLUSHALL | SLEEP seconds | ERROR message | GC",
                summary="Empty the node, block it, answer an error, run a full garbage collection",
                group="server"),
    CommandSpec(b"acl", "acl_", -2, ("admin", "readonly", "loading"), _ADMIN, subcommands=(
        ("whoami", ALWAYS), ("cat", ALWAYS),
    ), syntax="ACL SETUSER username [rule [rule ...]] | DELUSER username [username ...] | LIST | USERS | "
              "WHOAMI | CAT [category]",
       summary="The users and their rights (SECURITY.md)", group="server", since="disque-py 0.1.0"),
    CommandSpec(b"slowlog", "slowlog", -2, ("admin", "readonly", "loading"), _ADMIN, subcommands=(
        ("get", _MONITOR_READ), ("len", _MONITOR_READ), ("help", _MONITOR_READ), ("reset", _ADMIN),
    ), syntax="SLOWLOG GET [count] | LEN | RESET | HELP",
       summary="The commands that ran longer than slowlog-log-slower-than", group="server"),
    CommandSpec(b"latency", "latency", -2, ("admin", "readonly", "loading"), _ADMIN, subcommands=(
        ("latest", _MONITOR_READ), ("history", _MONITOR_READ), ("doctor", _MONITOR_READ),
        ("help", _MONITOR_READ), ("reset", _ADMIN),
    ), syntax="LATENCY LATEST | HISTORY event | RESET [event [event ...]] | DOCTOR | HELP",
       summary="Latency spikes over latency-monitor-threshold, by event", group="server"),
)  # fmt: skip

INFO_SECTIONS = ("server", "clients", "memory", "jobs", "queues", "persistence", "stats", "cpu")
#: sections only INFO all / everything (or by name) shows, as Redis's commandstats
INFO_EXTRA_SECTIONS = ("commandstats",)

SLOWLOG_HELP = [
    b"SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    b"GET [<count>]",
    b"    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    b"    Entries are made of:",
    b"    id, timestamp, time in microseconds, arguments array, client IP and port,",
    b"    client name",
    b"LEN",
    b"    Return the length of the slowlog.",
    b"RESET",
    b"    Reset the slowlog.",
    b"HELP",
    b"    Print this help.",
]
LATENCY_HELP = [
    b"LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    b"LATEST",
    b"    Return the latest latency samples for all events.",
    b"HISTORY <event>",
    b"    Return time-latency samples for the <event> class.",
    b"RESET [<event> ...]",
    b"    Reset latency data of one or more <event> classes.",
    b"    (default: reset all data for all event classes)",
    b"DOCTOR",
    b"    Return a human readable latency analysis report.",
    b"HELP",
    b"    Print this help.",
]


def _human(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return "%.2f%s" % (n / size, unit)
    return "%dB" % n


@dataclass
class AdminContext:
    """What the shell's commands read and call of their node."""

    config: "Config"
    node: "Node"
    stats: dict[str, int]  # INFO stats, CONFIG RESETSTAT
    clients: dict[int, "Connection"]  # every open client, by id (CLIENT LIST/KILL, INFO)
    start_time: float  # wall clock at start (uptime)
    request_shutdown: Callable[[], None]
    close_client: Callable[["Connection"], None]  # after what is buffered for it has gone out
    ops_per_sec: Callable[[], int]
    # the declarations of every command the node answers, in COMMAND's order (app.NODE_COMMANDS)
    commands: tuple[CommandSpec, ...]
    aof: "Aof | None" = None  # the node's AOF (server/aof.py): INFO persistence, BGREWRITEAOF
    acl: Acl | None = None  # the users (server/acl.py); None: made from the config and ``commands``
    # what the dispatcher measures (server/cmdstats.py, slowlog.py, latency.py); None: empty ones
    cmdstats: CommandStats | None = None
    slowlog: SlowLog | None = None
    latency: LatencyMonitor | None = None
    # live workers heard from (server/workers.py): INFO clients' connected_workers
    connected_workers: Callable[[], int] = lambda: 0

    def __post_init__(self) -> None:
        if self.acl is None:
            self.acl = Acl.from_config(self.config, self.commands)
        if self.cmdstats is None:
            self.cmdstats = CommandStats()
        if self.slowlog is None:
            self.slowlog = SlowLog(self.config.slowlog_max_len)
        if self.latency is None:
            self.latency = LatencyMonitor(self.config.latency_monitor_threshold)
        self.stats.setdefault("acl_access_denied_auth", 0)


def build_table(ctx: AdminContext) -> dict[bytes, tuple[Callable[["Connection", list[bytes]], Any], int]]:
    """The shell's commands (:data:`COMMANDS`) bound to ``ctx``: name -> (handler, arity)."""
    peak = [0]
    reply = _command_reply(ctx.commands)  # COMMAND's entries, made once
    docs: dict[bytes, dict[bytes, object]] = {}  # COMMAND DOCS' (server/commanddocs.py), made at its first use

    def auth(conn: "Connection", argv: list[bytes]) -> Any:
        if len(argv) > 3:
            return syntax_error(argv[3])
        if len(argv) == 2:  # AUTH <password>: the default user, as Disque's requirepass
            acl = ctx.acl
            if acl.default.nopass and not acl.default.passwords:
                return err("Client sent AUTH, but no password is set")
            if login(ctx, conn, b"default", argv[1]):
                return OK
            return err("invalid password")
        if login(ctx, conn, argv[1], argv[2]):
            return OK
        return Error(WRONGPASS)

    def ping(conn: "Connection", argv: list[bytes]) -> Any:
        if len(argv) > 2:
            return err("wrong number of arguments for 'ping' command")
        return argv[1] if len(argv) == 2 else Status(b"PONG")

    def echo(conn: "Connection", argv: list[bytes]) -> Any:
        return argv[1]

    def quit_(conn: "Connection", argv: list[bytes]) -> Any:
        conn.closing = True
        return OK

    def time_(conn: "Connection", argv: list[bytes]) -> Any:
        t = time.time()
        return [b"%d" % int(t), b"%d" % int((t % 1) * 1_000_000)]

    def info(conn: "Connection", argv: list[bytes]) -> Any:
        if len(argv) > 2:
            return syntax_error(argv[2], "INFO takes one section")
        section = argv[1].decode("utf-8", "replace").lower() if len(argv) == 2 else "default"
        return info_text(ctx, section, peak).encode()

    def command(conn: "Connection", argv: list[bytes]) -> Any:
        table = reply
        if len(argv) == 1:
            return list(table.values())
        sub = argv[1].lower()
        if sub == b"count":
            return len(table)
        if sub == b"info":
            return [table.get(name.lower()) for name in argv[2:]]
        if sub == b"docs":  # Redis 7's shape: a map, name -> summary, since, group, arguments
            if not docs:
                from .commanddocs import docs_reply

                docs.update(docs_reply(ctx.commands))
            if len(argv) == 2:
                return docs
            return {name: docs[name] for name in dict.fromkeys(a.lower() for a in argv[2:]) if name in docs}
        if sub == b"list":
            return [entry[0] for entry in table.values()]
        return err("Unknown subcommand or wrong number of arguments for '%s'" % argv[1].decode("utf-8", "replace"))

    def client(conn: "Connection", argv: list[bytes]) -> Any:
        sub = argv[1].lower()
        n = len(argv)
        if sub == b"id" and n == 2:
            return conn.id
        if sub == b"getname" and n == 2:
            return conn.name or None
        if sub == b"setname" and n == 3:
            if any(c <= 32 or c >= 127 for c in argv[2]):
                return err("Client names cannot contain spaces, newlines or special characters.")
            conn.name = argv[2]
            return OK
        if sub == b"setinfo" and n == 4:
            attr = argv[2].lower()
            if attr == b"lib-name":
                conn.lib_name = argv[3]
            elif attr == b"lib-ver":
                conn.lib_ver = argv[3]
            else:
                return err("Unrecognized option '%s'" % argv[2].decode("utf-8", "replace"))
            return OK
        if sub == b"list" and n == 2:
            return "".join(_client_line(ctx, c) + "\n" for c in list(ctx.clients.values())).encode()
        if sub == b"info" and n == 2:
            return (_client_line(ctx, conn) + "\n").encode()
        if sub == b"kill":
            return _client_kill(ctx, conn, argv)
        return err("Syntax error, try CLIENT (LIST | KILL ip:port | ID | GETNAME | SETNAME connection-name | SETINFO)")

    def config(conn: "Connection", argv: list[bytes]) -> Any:
        sub = argv[1].lower()
        cfg = ctx.config
        try:
            if sub == b"get" and len(argv) == 3:
                # a dict: a map in RESP3 (as Redis 7 answers, and redis-py 8 expects), a flat array in RESP2
                flat = config_get(cfg, argv[2])
                return dict(zip(flat[0::2], flat[1::2]))
            if sub == b"set" and len(argv) == 4:
                config_set(cfg, argv[2], argv[3])
                return OK
            if sub == b"rewrite" and len(argv) == 2:
                rewrite_config(cfg)
                log.info("CONFIG REWRITE executed with success.")
                return OK
            if sub == b"resetstat" and len(argv) == 2:
                for key in ctx.stats:
                    ctx.stats[key] = 0
                ctx.cmdstats.reset()  # the slow log stays, as Redis's
                return OK
        except ConfigError as exc:
            return err(str(exc))
        except OSError as exc:
            log.warning("CONFIG REWRITE failed: %s", exc)
            return err("Rewriting config file: %s" % exc)
        return err("CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")

    def shutdown(conn: "Connection", argv: list[bytes]) -> Any:
        if len(argv) > 2 or (len(argv) == 2 and argv[1].lower() not in (b"save", b"nosave", b"rewrite-aof")):
            bad = argv[1] if argv[1].lower() not in (b"save", b"nosave", b"rewrite-aof") else argv[2]
            return syntax_error(bad, "SHUTDOWN takes SAVE, NOSAVE or REWRITE-AOF")
        if len(argv) == 2 and argv[1].lower() == b"rewrite-aof" and ctx.aof is not None:
            ctx.aof.shutdown_rewrite = True  # a fresh AOF from the table, AOF on or off (Aof.close)
        log.warning("SHUTDOWN%s requested by client id=%d addr=%s", " REWRITE-AOF" if len(argv) == 2 and
                    argv[1].lower() == b"rewrite-aof" else "", conn.id, conn.addr)  # fmt: skip
        ctx.request_shutdown()
        conn.closing = True
        return NO_REPLY

    def debug(conn: "Connection", argv: list[bytes]) -> Any:
        sub = argv[1].lower()
        if sub == b"flushall" and len(argv) == 2:
            ctx.node.flushall()
            log.warning("DEBUG FLUSHALL: all jobs and queues removed")
            return OK
        if sub == b"error" and len(argv) == 3:
            return Error(argv[2].decode("utf-8", "replace"))
        if sub == b"sleep" and len(argv) == 3:
            try:
                seconds = float(argv[2])
            except ValueError:
                return err("value is not a valid float")
            time.sleep(max(0.0, min(seconds, 60.0)))  # blocks the node on purpose, as Disque
            return OK
        if sub == b"gc" and len(argv) == 2:
            # a full collection now (blocks the node while it runs): the number of objects freed
            return gcpolicy.policy.full_collect("DEBUG GC by client id=%d" % conn.id)
        if sub in (b"jump-clock", b"fail-fsync"):  # the chaos tests' fault hooks (server.faults)
            result = faults.debug(argv[1:])
            if isinstance(result, str):
                return err(result)
            log.warning("DEBUG %s %s (fault hook)", sub.decode().upper(), argv[2].decode("utf-8", "replace"))
            return result
        return err("DEBUG subcommand must be one of FLUSHALL, ERROR <text>, SLEEP <seconds>, GC")

    def bgrewriteaof(conn: "Connection", argv: list[bytes]) -> Any:
        aof = ctx.aof
        if aof is None:
            return err("no append only file in this node")
        if aof.rewrite_pid:
            return err("Background append only file rewriting already in progress")
        if not aof.start_rewrite():
            return err("Can't start the background append only file rewrite, check the logs")
        return Status(b"Background append only file rewriting started")

    def acl_(conn: "Connection", argv: list[bytes]) -> Any:
        return acl_command(ctx, conn, argv)

    def slowlog(conn: "Connection", argv: list[bytes]) -> Any:
        return slowlog_command(ctx, argv)

    def latency(conn: "Connection", argv: list[bytes]) -> Any:
        return latency_command(ctx, argv)

    handlers = locals()
    return bind(COMMANDS, handlers.__getitem__)


def login(ctx: AdminContext, conn: "Connection", name: bytes, password: bytes, *, deauth: bool = True) -> bool:
    """AUTH and HELLO ... AUTH: authenticate ``conn`` as ``name``, or count a failure.

    A failed AUTH leaves the connection unauthenticated (as Disque's does; ``deauth``), a
    failed HELLO ... AUTH as it was; the ``AUTH_FAILURE_LIMIT``-th failure in a row closes
    the connection once the reply is sent."""
    acl = ctx.acl
    user = acl.authenticate(name, password)
    if user is not None:
        conn.authenticated = True
        conn.user = user.name
        conn.perms = acl.perms_of(user)
        conn.auth_failures = 0
        return True
    if deauth:
        conn.authenticated = False
    conn.auth_failures += 1
    ctx.stats["acl_access_denied_auth"] = ctx.stats.get("acl_access_denied_auth", 0) + 1
    if conn.auth_failures >= AUTH_FAILURE_LIMIT:
        log.warning("Closing client id=%d addr=%s after %d failed AUTH attempts in a row",
                    conn.id, conn.addr, conn.auth_failures)  # fmt: skip
        conn.closing = True
    return False


def acl_command(ctx: AdminContext, conn: "Connection", argv: list[bytes]) -> Any:
    """ACL SETUSER | DELUSER | LIST | USERS | WHOAMI | CAT, as Redis's (a subset)."""
    acl = ctx.acl
    sub = argv[1].lower()
    n = len(argv)
    if sub == b"whoami" and n == 2:
        return conn.user
    if sub == b"users" and n == 2:
        return sorted(acl.users)
    if sub == b"list" and n == 2:
        return [("user %s %s" % (name.decode("utf-8", "replace"), " ".join(user.describe()))).encode()
                for name, user in sorted(acl.users.items())]  # fmt: skip
    categories = acl.rights.categories
    if sub == b"cat" and n == 2:
        return [c.encode() for c in categories]
    if sub == b"cat" and n == 3:
        cat = argv[2].decode("utf-8", "replace").lower()
        if cat not in categories:
            return err("Unknown category '%s'" % cat)
        return [c.encode() for c in sorted(categories[cat])]
    if sub == b"setuser" and n >= 3:
        try:
            user, existed = acl.setuser(argv[2], argv[3:])
        except AclError as exc:
            return err(str(exc))
        if existed:  # its connections: checked against the new rights, closed if it is now off
            perms = acl.perms_of(user)
            for c in list(ctx.clients.values()):
                if c.authenticated and c.user == user.name:
                    if user.enabled:
                        c.perms = perms
                    else:
                        c.authenticated = False
                        ctx.close_client(c)
        ctx.config.user = acl.config_lines()  # what CONFIG REWRITE saves
        log.info("ACL SETUSER %s by client id=%d addr=%s", user.name.decode("utf-8", "replace"), conn.id, conn.addr)
        return OK
    if sub == b"deluser" and n >= 3:
        removed = 0
        try:
            for name in argv[2:]:
                if acl.deluser(name):
                    removed += 1
                    for c in list(ctx.clients.values()):  # as Redis: its connections are closed
                        if c.authenticated and c.user == name:
                            c.authenticated = False
                            ctx.close_client(c)
        except AclError as exc:
            return err(str(exc))
        if removed:
            ctx.config.user = acl.config_lines()
        return removed
    return err("Unknown subcommand or wrong number of arguments for '%s'. Try ACL SETUSER, DELUSER, "
               "LIST, USERS, WHOAMI, CAT." % argv[1].decode("utf-8", "replace"))


def _unknown_sub(command: str, argv: list[bytes]) -> Error:
    return err("unknown subcommand or wrong number of arguments for '%s'. Try %s HELP."
               % (argv[1].decode("utf-8", "replace")[:128], command))  # fmt: skip


def slowlog_command(ctx: AdminContext, argv: list[bytes]) -> Any:
    """SLOWLOG GET [count] | LEN | RESET | HELP, with Redis's replies (server/slowlog.py)."""
    sub = argv[1].lower()
    n = len(argv)
    if sub == b"get" and n in (2, 3):
        count = 10
        if n == 3:
            try:
                count = int(argv[2])
            except ValueError:
                return err("value is not an integer or out of range")
            if count < -1:
                return err("count should be greater than or equal to -1")
        return ctx.slowlog.get(count)
    if sub == b"len" and n == 2:
        return len(ctx.slowlog)
    if sub == b"reset" and n == 2:
        ctx.slowlog.reset()
        return OK
    if sub == b"help" and n == 2:
        return [Status(line) for line in SLOWLOG_HELP]
    return _unknown_sub("SLOWLOG", argv)


def latency_command(ctx: AdminContext, argv: list[bytes]) -> Any:
    """LATENCY LATEST | HISTORY event | RESET [event ...] | DOCTOR | HELP (server/latency.py)."""
    sub = argv[1].lower()
    n = len(argv)
    latency = ctx.latency
    if sub == b"latest" and n == 2:
        return latency.latest()
    if sub == b"history" and n == 3:
        return latency.history(argv[2].decode("utf-8", "replace"))
    if sub == b"reset" and n >= 2:
        return latency.reset([a.decode("utf-8", "replace") for a in argv[2:]] if n > 2 else None)
    if sub == b"doctor" and n == 2:
        return latency.doctor().encode()
    if sub == b"help" and n == 2:
        return [Status(line) for line in LATENCY_HELP]
    return _unknown_sub("LATENCY", argv)


def hello_handshake(ctx: AdminContext, conn: "Connection", argv: list[bytes]) -> Any:
    """Redis 6 ``HELLO protover [AUTH user pass] [SETNAME name]``.

    Disque's ``HELLO`` takes no argument and lists the cluster; with
    arguments it is the handshake newer Redis clients (redis-py 5+ with
    RESP3) send on connect. Both are answered: protocol 2 keeps RESP2
    replies, protocol 3 switches this connection to RESP3 encoding.
    """
    from ..protocol.resp import encode_reply, encode_reply3

    try:
        version = int(argv[1])
    except ValueError:
        return err("Protocol version is not an integer or out of range")
    if version not in (2, 3):
        return Error("NOPROTO sorry, this protocol version is not supported.")
    if conn.perms is PERMS_UNSET and not ctx.acl.default_open:  # let in by the acceptor: see dispatch
        conn.authenticated = False
        conn.perms = None
    i = 2
    name = None
    while i < len(argv):
        opt = argv[i].lower()
        if opt == b"auth" and i + 2 < len(argv):
            user, password = argv[i + 1], argv[i + 2]
            acl = ctx.acl
            if len(acl.users) == 1 and acl.default.nopass and not acl.default.passwords:
                return err("AUTH <password> called without any password configured for the default user.")
            if not login(ctx, conn, user, password, deauth=False):
                return Error(WRONGPASS)
            i += 3
        elif opt == b"setname" and i + 1 < len(argv):
            name = argv[i + 1]
            i += 2
        else:
            return err("Syntax error in HELLO option '%s'" % argv[i].decode("utf-8", "replace"))
    if not conn.authenticated:
        if not ctx.acl.default_open:
            return Error("NOAUTH HELLO must be called with the client already authenticated, "
                         "otherwise the HELLO <proto> AUTH <user> <pass> option can be used to "
                         "authenticate the client and select the RESP protocol version at the same time")
        conn.authenticated = True
        conn.user = b"default"
        conn.perms = ctx.acl.perms_of(ctx.acl.default)
    if name is not None:
        conn.name = name
    conn.encode = encode_reply3 if version == 3 else encode_reply
    return {
        b"server": b"disque",
        b"version": DISQUE_COMPAT_VERSION.encode(),
        b"proto": version,
        b"id": conn.id,
        b"mode": b"cluster",
        b"role": b"master",
        b"modules": [],
        b"node": ctx.node.id.encode(),
    }


def _command_reply(commands: tuple[CommandSpec, ...]) -> dict[bytes, list]:
    """COMMAND's entries, from the declarations: [name, arity, flags, first key, last key, step]."""
    return {
        spec.name: [spec.name, spec.arity, [Status(f.encode()) for f in spec.flags], 0, 0, 0]
        for spec in commands
    }


def _client_line(ctx: AdminContext, c: "Connection") -> str:
    now = trio.current_time()
    flags = "b" if c.blocked else "N"
    return (
        "id=%d addr=%s laddr=%s fd=%d name=%s age=%d idle=%d flags=%s qbuf=0 qbuf-free=0 "
        "obl=0 oll=0 omem=%d events=r cmd=%s lib-name=%s lib-ver=%s"
        % (
            c.id,
            c.addr,
            c.laddr,
            c.sock.fileno(),
            c.name.decode("utf-8", "replace"),
            now - c.created,
            now - c.last_active,
            flags,
            len(c.out),
            c.last_cmd.decode("utf-8", "replace"),
            c.lib_name.decode("utf-8", "replace"),
            c.lib_ver.decode("utf-8", "replace"),
        )
    )


def _client_kill(ctx: AdminContext, me: "Connection", argv: list[bytes]) -> Any:
    if len(argv) == 3:  # old form: CLIENT KILL ip:port
        addr = argv[2].decode("utf-8", "replace")
        for c in list(ctx.clients.values()):
            if c.addr == addr:
                ctx.close_client(c)
                return OK
        return err("No such client")
    if len(argv) < 4 or len(argv) % 2 != 0:
        return syntax_error(argv[-1], "CLIENT KILL takes ip:port, or pairs of ID, ADDR, LADDR or SKIPME and its value")
    want_id = want_addr = want_laddr = None
    skipme = True
    for i in range(2, len(argv), 2):
        key, value = argv[i].lower(), argv[i + 1]
        if key == b"id":
            try:
                want_id = int(value)
            except ValueError:
                return err("client-id should be greater than 0")
        elif key == b"addr":
            want_addr = value.decode("utf-8", "replace")
        elif key == b"laddr":
            want_laddr = value.decode("utf-8", "replace")
        elif key == b"skipme":
            if value.lower() not in (b"yes", b"no"):
                return syntax_error(value, "SKIPME takes YES or NO")
            skipme = value.lower() == b"yes"
        else:
            return syntax_error(argv[i])
    killed = 0
    for c in list(ctx.clients.values()):
        if want_id is not None and c.id != want_id:
            continue
        if want_addr is not None and c.addr != want_addr:
            continue
        if want_laddr is not None and c.laddr != want_laddr:
            continue
        if c is me and skipme:
            continue
        ctx.close_client(c)
        killed += 1
    return killed


def info_text(ctx: AdminContext, section: str, peak: list[int]) -> str:
    everything = section in ("all", "everything")
    if everything:
        wanted: tuple[str, ...] = INFO_SECTIONS + INFO_EXTRA_SECTIONS
    else:
        wanted = INFO_SECTIONS if section == "default" else (section,)
    node = ctx.node
    cfg = ctx.config
    parts: list[str] = []

    def emit(title: str, fields: dict[str, Any]) -> None:
        parts.append("# %s\r\n" % title + "".join("%s:%s\r\n" % kv for kv in fields.items()))

    uptime = int(time.time() - ctx.start_time)
    for name in wanted:
        if name == "server":
            emit("Server", {
                "disque_version": DISQUE_COMPAT_VERSION,
                "disque_py_version": __version__,
                "disque_git_sha1": "00000000",
                "disque_git_dirty": 0,
                "os": "%s %s %s" % (platform.system(), platform.release(), platform.machine()),
                "arch_bits": 64 if sys.maxsize > 2**32 else 32,
                "multiplexing_api": "trio",
                "python_version": platform.python_version(),
                # which runs: "compiled (N modules)" or "pure (why)" (disque_py/_build.py)
                "build": build_description(),
                "process_id": os.getpid(),
                "run_id": ctx.node.id,
                "tcp_port": cfg.port,
                "tls_port": cfg.tls_port,
                "uptime_in_seconds": uptime,
                "uptime_in_days": uptime // 86400,
                "hz": cfg.hz,
                "executable": sys.argv[0] if sys.argv else "",
                "config_file": cfg.config_file or "",
            })  # fmt: skip
        elif name == "clients":
            emit("Clients", {
                "connected_clients": len(ctx.clients),
                "client_longest_output_list": max((len(c.out) for c in ctx.clients.values()), default=0),
                "client_biggest_input_buf": 0,
                "blocked_clients": node.blocked_clients,
                "connected_workers": ctx.connected_workers(),  # ours: WORKER BEAT (server/workers.py)
            })  # fmt: skip
        elif name == "memory":
            # used_memory is what the maxmemory policy reads: the estimate of the node's data
            # (core/memory.py says why not the RSS, which is shown beside it).
            rss = rss_bytes()
            memory = node.memory
            used = memory.estimate()
            peak[0] = max(peak[0], used)
            emit("Memory", {
                "used_memory": used,
                "used_memory_human": _human(used),
                "used_memory_estimate": used,
                "used_memory_rss": rss,
                "used_memory_rss_human": _human(rss),
                "used_memory_peak": peak[0],
                "used_memory_peak_human": _human(peak[0]),
                "mem_fragmentation_ratio": "%.2f" % (rss / used if used else 0.0),
                "mem_allocator": "pymalloc",
                "maxmemory": cfg.maxmemory,
                "maxmemory_human": _human(cfg.maxmemory),
                "maxmemory_policy": cfg.maxmemory_policy,
                "maxmemory_measure": "estimate",
                "used_memory_percentage": "%.2f" % (100.0 * used / cfg.maxmemory if cfg.maxmemory else 0.0),
                **memory.info(),
                **gcpolicy.policy.info(),
                "timer_heap_entries": node.store.timer_entries,
            })  # fmt: skip
        elif name == "jobs":
            emit("Jobs", node.info_fields()["jobs"])
        elif name == "queues":
            emit("Queues", node.info_fields()["queues"])
        elif name == "persistence" and ctx.aof is not None:
            emit("Persistence", ctx.aof.info())
        elif name == "persistence":
            emit("Persistence", {
                "loading": 0,
                "aof_enabled": 0,
                "aof_state": "off",
                "aof_rewrite_in_progress": 0,
                "aof_rewrite_scheduled": 0,
                "aof_last_rewrite_time_sec": -1,
                "aof_current_rewrite_time_sec": -1,
                "aof_last_bgrewrite_status": "ok",
                "aof_last_write_status": "ok",
            })  # fmt: skip
        elif name == "stats":
            stats = dict(ctx.stats)
            emit("Stats", {
                "total_connections_received": stats["total_connections_received"],
                "total_commands_processed": stats["total_commands_processed"],
                "instantaneous_ops_per_sec": ctx.ops_per_sec(),
                "total_net_input_bytes": stats["total_net_input_bytes"],
                "total_net_output_bytes": stats["total_net_output_bytes"],
                "rejected_connections": stats["rejected_connections"],
                "accept_errors": stats["accept_errors"],
                "protocol_errors": stats["protocol_errors"],
                "internal_errors": stats["internal_errors"],
                "client_output_buffer_limit_disconnections": stats["client_output_buffer_limit_disconnections"],
                "tls_connections_received": stats.get("tls_connections_received", 0),
                "tls_handshake_failures": stats.get("tls_handshake_failures", 0),
                "acl_access_denied_auth": stats.get("acl_access_denied_auth", 0),
                "acl_access_denied_cmd": stats.get("acl_access_denied_cmd", 0),
                "acl_access_denied_key": stats.get("acl_access_denied_key", 0),
                "jobs_added": node.stats["jobs_added"],
                "jobs_delivered": node.stats["jobs_delivered"],
                "jobs_acked": node.stats["jobs_acked"],
                "jobs_requeued": node.stats["jobs_requeued"],
                "jobs_expired": node.stats["jobs_expired"],
                "needjobs_sent": node.stats["needjobs_sent"],
                "needjobs_received": node.stats["needjobs_received"],
                "yourjobs_sent": node.stats["yourjobs_sent"],
                "yourjobs_received": node.stats["yourjobs_received"],
                "jobs_imported": node.stats["jobs_imported"],
                "jobs_exported": node.stats["jobs_exported"],
                "jobs_pushed": node.stats["jobs_pushed"],
                "jobs_returned": node.stats["jobs_returned"],
                # ours: delivery.py, dedup.py
                "jobs_dead_lettered": node.stats["jobs_dead_lettered"],
                "jobs_nack_delayed": node.stats["jobs_nack_delayed"],
                "dedup_hits": node.stats["dedup_hits"],
                "group_units_restored": node.stats["group_units_restored"],
                "dedup_ids_remembered": len(node.lifecycle.gone),
            })  # fmt: skip
        elif name == "cpu":
            ru = resource.getrusage(resource.RUSAGE_SELF)
            emit("CPU", {
                "used_cpu_sys": "%.2f" % ru.ru_stime,
                "used_cpu_user": "%.2f" % ru.ru_utime,
            })  # fmt: skip
        elif name == "commandstats":
            emit("Commandstats", ctx.cmdstats.info_fields())
    return "\r\n".join(parts)


__all__ = [
    "AdminContext", "build_table", "hello_handshake", "acl_command", "slowlog_command", "latency_command",
    "login", "info_text", "NO_REPLY", "COMMANDS",
]  # fmt: skip
