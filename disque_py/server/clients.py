"""Client connections: bytes in -> commands -> replies out, for all clients in one task.

Owns the client sockets: :class:`Acceptor` takes what trio's listeners
accept (``maxclients``, keepalive, the request parser's limits) and hands it
to :class:`ClientLoop`, which reads, parses, hands the commands to its
runner (:class:`.contracts.CommandRunner`: the node's dispatcher, or a
test's) and sends what they produced. The loop also answers malformed
requests (an error, then the link is closed) and enforces the output
limits; the cron asks it to check idle clients (``check_clients``). It
knows nothing of the core: the runner, the core's timers
(:class:`.contracts.TimerControl`) and the bus owner
(:class:`.contracts.BusHolder`) are handed to it by the node (:mod:`.app`).

Every client socket is a plain non-blocking stdlib socket registered in one
``select.epoll`` of our own (:class:`ClientLoop`). A single trio task waits
for that epoll's descriptor to become readable (trio's ``wait_readable``
works on any pollable descriptor), then takes every ready client in one
``poll(0)``: it reads what arrived, parses it, runs the commands
synchronously against the core and, at the end of the pass, sends the
replies with one ``send`` per client. This is Redis's own design: a request that can be answered at
once costs a ``recv`` and a ``send``, not a trio task switch, a checkpoint
and an epoll registration change as a task per connection did (measured:
~30k unpipelined ADDJOB/s with a task per client against ~50k with one
loop, same core; docs/benchmarks-history.md, "Single node"). Other trio tasks (the cluster bus's
handshakes, the cron) run between two batches of clients. When none of
them has anything to do, the loop waits in its epoll directly instead of
through trio, which saves a scheduler round per wake-up (:mod:`.waiting`);
it then also runs the core's timers itself after each pass, and waits no
longer than until the next one (``TimerControl.due``).

The same epoll serves the cluster bus's TCP links once they are through
their handshake (the bus's ``Reactor``: ``add_fd``/``want_writable``/
``remove_fd``): a pass delivers what peers sent along with what clients
sent, and every bus message the pass produced leaves at its end, one write
per peer (``Bus.hold``/``release`` around the pass).

Every pass is one pipeline (:meth:`ClientLoop._pass`): read, parse and run what the
ready sockets sent, the core's timers that are due, the commands held back until now,
then commit (the node's AOF, :mod:`.aof`, takes what the pass journaled: ``Commit``),
release (every client's replies leave, one ``send`` each) and the bus's flush. Replies
leave at the end of the pass, as Redis sends them before it sleeps: a pass serving many
clients makes its system calls back to back. With an AOF, the replies of a client whose
commands journaled wait, past the pass, until the commit's ticket is done (``held``, until
the AOF calls ``ClientLoop.release``), and so do bus messages made while records were
pending; nothing else waits for the disk. The pass's synchronous work runs in
:class:`.stage.PassStage` (compiled in the compiled build; :meth:`ClientLoop._pass` tells
which of its methods is which stage); this class keeps trio, epoll and the cold paths.

Replies produced for a client by somebody else (a blocked GETJOB served by an ADDJOB
elsewhere, a replicated ADDJOB confirmed by GOTJOBs) are put in its output by the
dispatcher, which hands the client to ``ClientLoop.woken``: they leave at the end of
the pass, after what the client pipelined behind its blocking command has run
(``run_held``, the one place held commands run again).

Back-pressure: what a client's socket does not take stays in ``out``; the
loop then waits for that client to become writable, and goes on reading and
running its commands meanwhile until ``out`` holds ``OUT_HOLD`` bytes (64 MB),
as Redis and Disque read a client whatever it has not read yet: a client
library writes a whole pipeline before it reads the first reply, and a node
that stopped reading at the first full socket buffer deadlocked with it
(redis-py, 50,000 ADDJOBs in one pipeline). Past ``OUT_HOLD`` it stops reading
until the client reads, so a client that never reads its replies costs at
most that much. Within one read too, commands stop running once ``out`` holds
``OUT_HOLD`` bytes: the rest wait in ``pending`` and run as the socket takes
the output (a 64 KB read can hold thousands of small commands with big
replies, such as ``QPEEK q 1000``). One big reply
is still built whole; ``client-output-buffer-limit`` (off by default, as in
Disque) closes a client whose unsent output stays over it
(:meth:`ClientLoop.over_output_limit`).

A client blocked (GETJOB, or ADDJOB waiting for its copies) with pipelined
commands after the blocking one keeps them in ``pending`` and runs them, in
order, as soon as it is unblocked, which is what Redis clients expect. The
loop stops reading from it meanwhile (``read_paused``: epoll then reports
only the peer's hang-up), so a blocked client that keeps sending holds at
most one read's worth of commands, not everything it sends: 75 MB of
pipelined PINGs behind a GETJOB once grew a node by 2.5 GB.
"""

from __future__ import annotations

import math
import select
import socket
from collections import deque
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable

import trio

from cluster_bus.links import accept_batches

from ..protocol.resp import ProtocolError, RequestParser, encode_reply
from .connection import OUT_HOLD, Connection
from .logs import log
from .protection import DENIED, is_loopback, protected
from .stage import EV_ERR, EV_IN, EV_OUT, EV_RDHUP, READ_SIZE, PassStage
from .waiting import DirectWait

if TYPE_CHECKING:
    from ..config import Config
    from .contracts import BusHolder, CommandRunner, TimerControl

__all__ = ["Acceptor", "ClientLoop", "LOOP_STATS"]

_IN = EV_IN
_OUT = EV_OUT
_ERR = EV_ERR
_RDHUP = EV_RDHUP  # the only event asked for while reading is paused: the client hung up

#: The client checks (``ClientLoop.check_clients``): at least this many clients a call, looked at
#: this many at a time, for no longer than this (ns) a call.
CHECK_MIN = 64
CHECK_CHUNK = 32
CHECK_SLICE_NS = 30_000

#: The counters the loop and the acceptor keep in the stats dict they are given (INFO stats).
LOOP_STATS = (
    "total_connections_received",
    "total_net_input_bytes",
    "total_net_output_bytes",
    "rejected_connections",
    "rejected_connections_protected",
    "accept_errors",
    "protocol_errors",
    "internal_errors",
    "client_output_buffer_limit_disconnections",
)


def _on_stage(name: str, doc: str) -> Any:
    """A ``ClientLoop`` attribute kept on its stage (``PassStage``), read and set there."""
    return property(lambda self: getattr(self._stage, name), lambda self, value: setattr(self._stage, name, value),
                    doc=doc)  # fmt: skip


class _NoTimers:
    """The timers of a loop given none (tests): nothing is ever due."""

    def hand_over(self, to_loop: bool) -> None:
        pass

    def due(self) -> float:
        return math.inf

    def poke(self) -> None:
        pass


class _NoBus:
    bus = None

    @staticmethod
    def send_item(node_id: str, item: bytes, watch: Any = None) -> bool:
        return False


class ClientLoop:
    """Every client connection of a node, driven from one trio task.

    ``runner`` runs the commands read and carries out their effects (the
    node's :class:`.dispatch.Dispatcher`; a test passes its own); its three
    methods are bound here once. ``stats``: the dict the loop counts in
    (:data:`LOOP_STATS`). ``timers``: the core's timers, run by the loop while
    it waits directly (none: nothing to run). ``links``: whoever owns the
    cluster bus (its output is held during a pass and leaves at the end; may
    be set after construction, before :meth:`run`).
    """

    # Bound on the instance to the pass's stage (stage.PassStage), called without a frame of
    # this class's: ClientOutput (woken, send_item), the Commit's callback (release), and
    # apply_effects. See the stage's methods of the same names.
    woken: Callable[[Connection, bool], None]
    send_item: Callable[..., bool]
    release: Callable[[int], None]
    apply_effects: Callable[[], None]

    def __init__(
        self,
        runner: "CommandRunner",
        stats: dict[str, int],
        *,
        timers: "TimerControl | None" = None,
        links: "BusHolder | None" = None,
    ) -> None:
        for key in LOOP_STATS:
            stats.setdefault(key, 0)
        self.stats = stats
        self._client_closed = runner.client_closed
        self.timers: "TimerControl" = timers if timers is not None else _NoTimers()
        self.ep = select.epoll()
        self.direct = DirectWait(self.ep)  # waits without a trio round when trio is idle (waiting.py)
        self.limit_hard = self.limit_soft = self.limit_soft_seconds = 0  # client-output-buffer-limit
        # The pass (see _pass) and its state live in the stage; trio's clock is read once per read
        # of a client (its last_active); run() binds the run's clock object, one Python frame
        # instead of trio.current_time()'s three.
        self._stage = stage = PassStage(
            self, stats, runner.run_commands, runner.apply_effects,
            links if links is not None else _NoBus(), self.direct, trio.current_time,
        )  # fmt: skip
        self.clients: dict[int, Connection] = stage.clients  # by client id: every open connection
        self.by_fd: dict[int, Connection] = stage.by_fd
        self.others: dict[int, tuple] = stage.others  # fd -> (on_readable, on_writable): cluster bus links
        # Across passes: output waiting for an AOF batch, by client id: (ticket, conn) (and bus
        # messages waiting, in order, in the stage's bus_held).
        self.held: dict[int, tuple[int, Connection]] = stage.held
        self._runnable = stage.runnable  # clients whose held commands may run again
        self._check_order: list[int] = []  # check_clients' round: the client ids when it began ...
        self._check_at = 0  # ... and how far it went
        self.woken = stage.woken
        self.send_item = stage.send_item
        self.release = stage.release
        self.apply_effects = stage.carry_out

    # The pass's state lives on its compiled stage; the loop reads and sets it there.
    current = _on_stage("current", "The client whose commands are running.")
    commit = _on_stage("commit", "The pass's commit stage: the node's AOF (server/aof.py); None: none.")
    links = _on_stage("links", "Whoever owns the cluster bus (may be set after construction, before run).")

    @property
    def in_pass(self) -> bool:
        return self._stage.in_pass

    @property
    def _run_commands(self) -> Callable[[Connection, list[list[bytes]]], Any]:
        """The runner's run_commands, bound at construction (a test swaps it)."""
        return self._stage.run_commands

    @_run_commands.setter
    def _run_commands(self, run_commands: Callable[[Connection, list[list[bytes]]], Any]) -> None:
        self._stage.run_commands = run_commands

    # ----------------------------------------------------------- membership
    def add(self, conn: Connection) -> None:
        """Serve ``conn`` (a non-blocking socket) from now on."""
        self.clients[conn.id] = conn
        self.by_fd[conn.fd] = conn
        self.ep.register(conn.fd, _IN)
        conn.armed = _IN

    def close(self, conn: Connection) -> None:
        """Forget a client now (idempotent): unregister, tell the core, close the socket."""
        if conn.closed:
            return
        conn.closed = True
        self.by_fd.pop(conn.fd, None)
        try:
            self.ep.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        self.clients.pop(conn.id, None)
        self.held.pop(conn.id, None)
        try:
            conn.sock.close()
        except OSError:
            pass
        self._client_closed(conn.id)
        self.apply_effects()

    def close_when_sent(self, conn: Connection) -> None:
        """CLIENT KILL, idle timeout: close after what is already buffered has gone out."""
        conn.closing = True
        if conn is self.current or conn.closed:
            return  # the loop closes it after this batch of its commands
        if not conn.out:
            self.close(conn)

    def _arm(self, conn: Connection) -> None:
        """Ask epoll for what ``conn`` waits for now: writability (and input too, while its
        unsent output is under ``OUT_HOLD`` and nothing is pending), else only its hang-up while
        reading is paused, else input. No system call when that is what it waits for already."""
        if conn.waiting_write:
            events = _OUT if conn.read_paused or len(conn.out) >= OUT_HOLD else _OUT | _IN
        else:
            events = _RDHUP if conn.read_paused else _IN
        if events != conn.armed:
            conn.armed = events
            self.ep.modify(conn.fd, events)

    def pause_reading(self, conn: Connection) -> None:
        """Read nothing more from ``conn`` (commands pending) until :meth:`resume_reading`."""
        if conn.read_paused or conn.closed:
            return
        conn.read_paused = True
        self._arm(conn)

    def resume_reading(self, conn: Connection) -> None:
        if not conn.read_paused or conn.closed:
            return
        conn.read_paused = False
        self._arm(conn)

    # ------------------------------------------------- other sockets (Reactor)
    def add_fd(self, fd: int, on_readable, on_writable) -> None:
        self.others[fd] = (on_readable, on_writable)
        self.ep.register(fd, _IN)

    def want_writable(self, fd: int, on: bool) -> None:
        self.ep.modify(fd, _IN | _OUT if on else _IN)

    def remove_fd(self, fd: int) -> None:
        if self.others.pop(fd, None) is not None:
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass

    def close_all(self) -> None:
        for conn in list(self.by_fd.values()):
            conn.closed = True
            try:
                conn.sock.close()
            except OSError:
                pass
        self.by_fd.clear()
        self.ep.close()

    # --------------------------------------------------------------- output
    def set_output_limit(self, hard: int, soft: int, soft_seconds: int) -> None:
        """``client-output-buffer-limit normal <hard> <soft> <soft-seconds>`` (0: no limit)."""
        self.limit_hard, self.limit_soft, self.limit_soft_seconds = hard, soft, soft_seconds

    def over_output_limit(self, conn: Connection) -> bool:
        """Close ``conn`` if the output its socket has not taken is over a limit; True if closed.

        As Disque: at or above the hard limit at once; at or above the soft limit once it has
        stayed there for more than the soft seconds. Only output left unsent counts, so a
        client that reads what it asked for is never closed for the size of one reply. Checked
        whenever output stays behind (here and from the cron for clients that stopped reading);
        the client whose commands are running is checked when they are done.
        """
        held = len(conn.out)
        hard = self.limit_hard
        soft = self.limit_soft
        if hard and held >= hard:
            which = "hard"
        elif soft and held >= soft:
            now = trio.current_time()
            if not conn.soft_since:
                conn.soft_since = now
                return False
            if now - conn.soft_since <= self.limit_soft_seconds:
                return False
            which = "soft"
        else:
            conn.soft_since = 0.0
            return False
        if conn is self.current or conn.closed:
            return False
        self.stats["client_output_buffer_limit_disconnections"] += 1
        limit = ("%d bytes" % hard if which == "hard"
                 else "%d bytes for over %d s" % (soft, self.limit_soft_seconds))  # fmt: skip
        log.warning("Closing client id=%d addr=%s: %d bytes of replies not read, over its %s output "
                    "buffer limit of %s (client-output-buffer-limit normal %d %d %d)", conn.id, conn.addr,
                    held, which, limit, hard, soft, self.limit_soft_seconds)  # fmt: skip
        self.close(conn)
        return True

    def _writable(self, conn: Connection) -> None:
        if conn.id in self.held:  # what is left waits for the AOF: stop asking
            conn.waiting_write = False
            conn.read_paused = bool(conn.pending)
            self._arm(conn)
            return
        out = conn.out
        try:
            sent = conn.sock.send(out) if out else 0
        except BlockingIOError:
            return
        except OSError:
            self.close(conn)
            return
        self.stats["total_net_output_bytes"] += sent
        if sent < len(out):
            del out[:sent]
            if not self.over_output_limit(conn):
                self._arm(conn)  # back under OUT_HOLD: read again
            return
        out.clear()
        conn.soft_since = 0.0
        if conn.closing:
            self.close(conn)
            return
        conn.waiting_write = False
        conn.read_paused = bool(conn.pending)  # commands pending: still not read
        if conn.pending and not conn.blocked:
            self._runnable.append(conn)  # held back by its output: this pass runs them (run_held)
        self._arm(conn)  # what arrived meanwhile waits in the socket

    def _failed(self, conn: Connection) -> None:
        self.current = None
        self.stats["internal_errors"] += 1
        log.exception("Internal error serving client id=%d addr=%s; connection closed", conn.id, conn.addr)
        try:
            self.close(conn)
        except Exception:  # noqa: BLE001 - already failing: forget it whatever happens
            self.by_fd.pop(conn.fd, None)
            self.clients.pop(conn.id, None)

    def _want_write(self, conn: Connection) -> None:
        """Be called back (``_writable``) when the socket takes output: at once if it can now."""
        if not conn.waiting_write:
            conn.waiting_write = True
            self._arm(conn)

    def _protocol_error(self, conn: Connection, error: ProtocolError) -> None:
        """Commands before the bad bytes were answered; now the error, then the link is closed (as Redis does)."""
        self.stats["protocol_errors"] += 1
        log.log(15, "Protocol error from client id=%d addr=%s: %s", conn.id, conn.addr, error.reply_text)
        encode_reply(error.reply, conn.out)
        conn.closing = True

    def check_clients(self, idle_timeout: float, hz: int = 1) -> bool:
        """From the cron, at every step: output limits of clients that stopped reading (the loop
        does not see them), and clients idle for over ``idle_timeout`` seconds (0: never).

        In slices, as Redis's clientsCron: a round over the clients takes their ids (a call of its
        own), then each call goes on from where the previous one stopped and looks at
        ``clients / hz`` of them (``hz``: the caller's calls a second), at least
        ``CHECK_MIN``, so that each client is looked at about once a second; and it stops
        early once it has run for ``CHECK_SLICE_NS``, so that a job arriving meanwhile waits no
        longer than that, however many clients there are (the round then takes longer than a
        second). True when the round is done (a new one begins at the next call)."""
        if not (self.limit_soft or idle_timeout):
            self._check_order = []
            return True
        order = self._check_order
        at = self._check_at
        if at >= len(order):  # a new round: its ids are this call's slice (30 µs for 8,000)
            self._check_order = list(self.clients)
            self._check_at = 0
            return not self._check_order
        stop = min(len(order), at + max(CHECK_MIN, -(-len(order) // max(hz, 1))))
        clients = self.clients
        soft = self.limit_soft
        limit = trio.current_time() - idle_timeout if idle_timeout else -math.inf
        deadline = perf_counter_ns() + CHECK_SLICE_NS
        while at < stop:
            end = min(at + CHECK_CHUNK, stop)
            for cid in order[at:end]:
                conn = clients.get(cid)
                if conn is None or conn.closed:
                    continue
                if soft and conn.waiting_write and self.over_output_limit(conn):
                    continue
                if idle_timeout and not conn.blocked and conn.last_active < limit:
                    log.log(15, "Closing idle client id=%d addr=%s", conn.id, conn.addr)
                    self.close_when_sent(conn)
            at = end
            if perf_counter_ns() > deadline:
                break
        self._check_at = at
        if at >= len(order):
            self._check_order = []
            return True
        return False

    # ---------------------------------------------------------------- input
    # (read, parse, run: the stage's readable, process and run)

    # ----------------------------------------------------------------- loop
    async def run(self) -> None:
        direct = self.direct
        timers = self.timers
        hand_over, timers_due, poke = timers.hand_over, timers.due, timers.poke
        owns_timers = False  # the core's timers run here while waiting directly (TimerControl.hand_over)
        limit = math.inf
        stage = self._stage
        run_pass = stage.run_pass
        stage.clock_time = trio.lowlevel.current_clock().current_time
        try:
            await direct.start()
            while True:
                if direct.active != owns_timers:
                    owns_timers = direct.active
                    hand_over(owns_timers)
                    limit = timers_due() if owns_timers else math.inf
                ready = await direct.wait(limit)
                limit = run_pass(ready, timers_due if owns_timers else None)
                if not owns_timers:
                    poke()
        finally:
            if owns_timers:
                hand_over(False)
            direct.close()  # the epoll stays open: bus links may still register or leave (close_all, by the owner)

    def _pass(self, ready=(), timers_due=None) -> float:
        """One pass of the loop, the whole way from bytes in to bytes out:

        1. read, parse, and run in the core what every ready socket sent (``serve``: client
           commands, and the bus links' messages), each client's effects carried out for
           others at once (a blocked client served, a bus message queued);
        2. the core's timers that are due (while the loop owns them);
        3. the commands held back until now (``run_held``: pipelined behind a blocking
           command whose client was served, or behind output its socket has now taken);
        4. commit: what the pass journaled goes to the AOF (``Commit.commit``: written now
           with everysec/no, handed to the writer task with always); its ticket;
        5. release: every client's replies leave, one ``send`` each, except those whose
           commands journaled, while their ticket is not done (``held``, until ``release``);
        6. flush the bus: what the pass queued for peers leaves, one write per peer, except
           messages made while records were pending, held like replies.

        Called with nothing ready (``apply_effects`` outside a pass) it is the tail: 3 to 6 for
        what the timer task, the cron or the admin port produced. Returns the seconds until
        the core's next timer (inf: none, or not ours).

        The pass runs in the stage (:class:`.stage.PassStage`, compiled in the compiled build):
        ``run_pass``; stage 1 is its ``serve`` (``readable``, ``process``, ``run``: the
        runner's ``run_commands`` and ``apply_effects`` for one client's commands), 3 its
        ``run_held``, 5 its ``release_pass`` and ``send_now``. It calls back here for what is
        cold or talks to epoll, trio or the log (``close``, ``_arm``, ``pause_reading``,
        ``over_output_limit``, ``_writable``, ``_failed``, ``_protocol_error``).

        ``apply_effects`` (the stage's ``carry_out``) carries out the core's effects for an
        input the loop did not run (the timer task, a bus message read elsewhere, the cron, the
        admin port): outside a pass, the pass's tail follows (held commands, commit, release,
        bus); in one, its end does it. ``woken`` (``ClientOutput``): a reply for a client made
        by another input (it was blocked) leaves at the pass's end; what it pipelined
        meanwhile runs before that. ``send_item`` (``ClientOutput``): a bus message made while
        records are pending (the GOTJOB of a copy just stored, say) waits for the pass's
        ticket, and so does every one after a message that waits (order on each link).
        ``release`` (``Commit``'s callback): the AOF's batch ``seq`` is done; the replies and
        bus messages that waited for it, or for an earlier one, leave now.
        """
        return self._stage.run_pass(ready, timers_due)


class Acceptor:
    """Takes the connections trio's listeners accept and hands them to ``loop``.

    Applies ``config`` as it is at each accept (protected mode, ``maxclients``,
    ``requirepass``, ``tcp-keepalive``, the request parser's limits), so CONFIG SET
    takes effect for the next client. Protected mode (:mod:`.protection`) refuses a
    client that is not on loopback when nobody secured the node: one ``-DENIED`` line
    saying how to open up, then the link is closed. Started by the node (:mod:`.app`),
    one task per listener.
    """

    def __init__(self, loop: ClientLoop, config: "Config", stats: dict[str, int]) -> None:
        self.loop = loop
        self.config = config
        self.stats = stats
        self._next_client_id = 0
        self.acl: Any = None  # the node's users (server.acl.Acl): a default user with a password ends protected mode

    async def serve(self, listener: trio.SocketListener) -> None:
        def failed() -> None:
            self.stats["accept_errors"] += 1

        # Our address is the listener's when it is bound to one (not a wildcard): no getsockname
        # per connection then.
        laddr = ""
        try:
            local = listener.socket.getsockname()
            if isinstance(local, tuple) and local[0] not in ("0.0.0.0", "::"):
                laddr = "%s:%d" % (local[0], local[1])
        except OSError:
            pass

        def accepted(sock: socket.socket, address: Any) -> None:
            self.adopt(sock, "%s:%d" % (address[0], address[1]) if isinstance(address, tuple) else "", laddr)

        # Plain sockets, many per wake-up: the client loop drives them, no trio stream is made.
        await accept_batches(listener, accepted, what="client", log=log, on_error=failed)

    @staticmethod
    def _peer_is_local(sock: Any) -> bool:
        try:
            return is_loopback(sock.getpeername())
        except OSError:  # already gone: nobody to serve
            return False

    @staticmethod
    def _refuse(sock: socket.socket, line: bytes) -> None:
        """Send one error line and close. What the client already sent is read first: closing
        with unread input would reset the link, and the client could lose the line."""
        try:
            sock.recv(READ_SIZE)
        except OSError:
            pass
        try:
            sock.send(line)
            if isinstance(sock, socket.socket):  # a TLS link just closes (its close_notify ends it)
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()

    def adopt(self, sock: Any, addr: str = "", laddr: str = "") -> None:
        """Serve an accepted connection: a plain socket (:meth:`accepted`) or one accepted
        elsewhere (a TLS client through its handshake: :mod:`.tls`). ``sock`` behaves as a
        non-blocking socket (``recv``/``send``/``fileno``/``close``/``getpeername``);
        ``addr``/``laddr`` are the peer's address and ours, for CLIENT LIST and the logs (read
        from the socket when empty). Counted, refused in protected mode, limited."""
        self.stats["total_connections_received"] += 1
        cfg = self.config
        if protected(cfg, self.acl) and not self._peer_is_local(sock):
            self.stats["rejected_connections"] += 1
            self.stats["rejected_connections_protected"] += 1
            self._refuse(sock, DENIED)
            return
        if len(self.loop.clients) >= cfg.maxclients:
            self.stats["rejected_connections"] += 1
            # Disque's text, which clients match whole at its start, then the directive.
            self._refuse(sock, b"-ERR max number of clients reached (maxclients %d)\r\n" % cfg.maxclients)
            return
        conn = self._new_connection(sock, addr, laddr)
        conn.authenticated = not cfg.requirepass
        self.loop.add(conn)

    def _new_connection(self, sock: Any, addr: str = "", laddr: str = "") -> Connection:
        if not addr or not laddr:
            try:
                if not addr:
                    peer = sock.getpeername()
                    addr = "%s:%d" % (peer[0], peer[1])
                local = sock.getsockname()
                laddr = "%s:%d" % (local[0], local[1])
            except OSError:
                addr, laddr = addr or "?:0", laddr or "?:0"
        cfg = self.config
        if cfg.tcp_keepalive:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_KEEPIDLE"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, cfg.tcp_keepalive)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, cfg.tcp_keepalive // 3))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            except OSError:
                pass
        parser = RequestParser(
            max_bulk_len=cfg.proto_max_bulk_len,
            max_args=cfg.proto_max_multibulk_len,
            max_query_buffer=cfg.client_query_buffer_limit,
        )
        self._next_client_id += 1
        return Connection(self._next_client_id, sock, addr, laddr, trio.current_time(), parser)
