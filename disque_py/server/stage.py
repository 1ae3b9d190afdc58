"""The synchronous part of the client loop's pass, typed for the compiled build.

Everything a pass does per command and per client, without trio or a system call of its
own but the socket's ``recv`` and ``send``: read, parse, run (the dispatcher's fast path:
the name lowered once, ``Node.execute_named``, the reply encoded, cmdstats), carry out the
core's effects, run held commands, release the replies and the held bus messages. Two
final classes, each owned by the part of the shell that the rest of the node sees:

* :class:`CommandStage`, owned by the dispatcher (:mod:`.dispatch`): ``run_commands`` and
  ``apply_effects``. What it does not do itself (a command that is not on the fast path,
  the memory measure, the slow log, an internal error's log line) it hands back to the
  dispatcher, which also keeps the settings it reads current (``not_fast``, ``watch_us``,
  ``mem_next``).
* :class:`PassStage`, owned by the client loop (:mod:`.clients`): the pass
  (``run_pass``) and its stages 1, 3 and 5 with what they call on the hot path
  (``process``, ``run``, ``send_now``, ``woken``, ``send_item``, ``release``). The loop keeps
  what is cold or talks to epoll, trio and the log (``close``, ``_arm``, the output limits,
  ``_writable``, a failure), and the stage calls back into it (``loop``) for those.

The pass's order, its six stages and the holding of replies for the AOF commit are the
loop's, documented there (``ClientLoop``); this module is where they run. Compiled, the
calls between these classes, the connections (:class:`.connection.Connection`), the
command stats, the parser and the core are direct C calls; pure Python runs the same code.
"""

from __future__ import annotations

import math
import select
from bisect import bisect_left
from collections import deque
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable, Final, Sequence, final

from ..core.effects import BLOCKED, NO_REPLY, Reply, Send
from ..core.statics import ERROR
from ..protocol.resp import ProtocolError
from .cmdstats import LATENCY_BUCKETS_US, SMALL_BUCKETS, CommandStats
from .connection import OUT_HOLD, Connection
from .contracts import BusHolder, Commit, now_ms

if TYPE_CHECKING:
    from ..core.node import Node
    from .waiting import DirectWait

__all__ = ["CommandStage", "PassStage", "READ_SIZE"]

READ_SIZE: Final = 65536
EV_IN: Final[int] = select.EPOLLIN
EV_OUT: Final[int] = select.EPOLLOUT
EV_ERR: Final[int] = select.EPOLLERR | select.EPOLLHUP
EV_RDHUP: Final[int] = select.EPOLLRDHUP  # the only event asked for while reading is paused: the client hung up


def _no_woken(conn: Connection, depends: bool) -> None:
    pass


def _no_send(node_id: str, item: bytes, watch: object = None) -> bool:
    return False


@final
class CommandStage:
    """The dispatcher's per-command path: ``run_commands`` and ``apply_effects``.

    ``dispatcher``: the :class:`.dispatch.Dispatcher` it belongs to, for what is not on the
    fast path (``dispatch``, ``measure_memory``, ``_slow_command``, ``_internal_error``);
    ``send_item_of``: a ``Send`` effect's message as the bus item and its watch token.
    """

    def __init__(
        self,
        node: "Node",
        dispatcher: Any,  # the Dispatcher (a shell part this module may not import), called back
        stats: dict[str, int],
        cmdstats: CommandStats,
        send_item_of: Callable[[tuple], tuple[bytes, object]],
    ) -> None:
        self.node = node
        self.dispatcher = dispatcher
        self.stats = stats
        self.cmdstats = cmdstats
        self.not_fast: frozenset[bytes] = frozenset()  # what the fast path leaves to dispatch
        self.watch_us = 1 << 62  # a command this slow (us) goes on to the slow log / latency monitor
        self.mem_next = 0  # when (ms) the memory level is measured again, before commands
        # where effects go (Dispatcher.wire: the client loop's)
        self.clients: dict[int, Connection] = {}
        self.woken: Callable[[Connection, bool], None] = _no_woken
        self.send_item: Callable[..., bool] = _no_send
        self.send_item_of = send_item_of
        # The clocks read per command, held by the stage (compiled, a field is read directly, a
        # name imported from an interpreted module is a dict lookup at every use; core/statics.py
        # says why): the shell's (the core's inputs are stamped with it) and the command timer.
        self._clock: Callable[[], int] = now_ms
        self._timer: Callable[[], int] = perf_counter_ns

    def run_commands(self, conn: Connection, commands: list[list[bytes]]) -> bool:
        """Dispatcher.run_commands (see there)."""
        out = conn.out
        now = self._clock()
        dispatcher = self.dispatcher
        if now >= self.mem_next:
            dispatcher.measure_memory(now)
        node = self.node
        not_fast = self.not_fast
        cid = conn.id
        journal = node.ctx.journal  # with an AOF: a reply waits for the records it made
        before = len(journal) if journal is not None else 0
        # What each command costs (cmdstats.py): from its start to its reply encoded, one clock
        # read per command (its end is the next one's start), rounded to the nearest
        # microsecond so that sums stay unbiased; a command that took watch_us or more goes
        # on to the slow log and the latency monitor.
        cmdstats = self.cmdstats
        by_wire = cmdstats.by_wire
        small = SMALL_BUCKETS
        watch_us = self.watch_us
        fast = 0  # commands run on the fast path (dispatch counts its own)
        timer = self._timer
        start = timer()
        i = 0
        for argv in commands:
            if conn.blocked or conn.closing or len(out) >= OUT_HOLD:
                if not conn.closing or conn.blocked:
                    conn.pending.extend(commands[i:])
                break
            i += 1
            # The fast path: an authenticated client with every right, a core command. It does
            # what dispatch does for one, without the checks that cannot apply.
            name = argv[0].lower() if argv else b""  # empty (the parser skips them): an internal error below
            if conn.perms is None and conn.authenticated and name not in not_fast:
                conn.last_cmd = name
                fast += 1
                try:
                    reply = node.execute_named(cid, name, argv, now)
                except Exception:
                    reply = dispatcher._internal_error(argv)
            else:
                if fast:  # INFO (or anything else the shell answers) reads an exact count
                    self.stats["total_commands_processed"] += fast
                    fast = 0
                reply = dispatcher.dispatch(conn, argv, now)
                name = conn.last_cmd
            if reply is BLOCKED:
                conn.blocked = True
            elif reply is not NO_REPLY:
                conn.encode(reply, out)  # HELLO 3 may just have switched it
            end = timer()
            usec = (end - start + 500) // 1000
            start = end
            stat = by_wire.get(name)
            if stat is None:
                stat = cmdstats.stat_for(name)
            stat.usec += usec
            stat.buckets[small[usec] if usec < 1001 else bisect_left(LATENCY_BUCKETS_US, usec)] += 1
            if type(reply) is ERROR:
                stat.errors += 1
            if usec >= watch_us:
                dispatcher._slow_command(conn, argv, usec)
                start = timer()
        if fast:
            self.stats["total_commands_processed"] += fast
        # (a command may turn the AOF on or off: the journal it ran with is the one compared)
        return journal is not None and len(journal) != before

    def apply_effects(self) -> None:
        """Dispatcher.apply_effects (see there)."""
        node = self.node
        effects = node.take_effects()
        if not effects:
            return
        journal = node.ctx.journal
        clients = self.clients
        last_message: tuple | None = None
        item = b""
        watch: object = None
        while effects:
            for effect in effects:
                if isinstance(effect, Reply):
                    conn = clients.get(effect.client)
                    if conn is None:
                        continue
                    conn.blocked = False
                    conn.encode(effect.value, conn.out)
                    # records of this input not committed yet: the answer waits for them
                    self.woken(conn, bool(journal))
                elif isinstance(effect, Send):
                    message = effect.message
                    if message is not last_message:  # the core fans one message out to several peers
                        item, watch = self.send_item_of(message)
                        last_message = message
                    self.send_item(effect.to, item, watch)
            effects = node.take_effects()


@final
class PassStage:
    """The client loop's pass (``ClientLoop``'s docstring tells its stages).

    ``loop``: the :class:`.clients.ClientLoop` it belongs to, called back for what is cold
    or not synchronous work on the pass's data (closing, epoll, output limits, a failure).
    ``run_commands``/``apply_effects``: the runner's (``CommandRunner``).
    """

    def __init__(
        self,
        loop: Any,  # the ClientLoop (a shell part this module may not import), called back
        stats: dict[str, int],
        run_commands: Callable[[Connection, list[list[bytes]]], bool],
        apply_effects: Callable[[], None],
        links: BusHolder,
        direct: "DirectWait",
        clock_time: Callable[[], float],
    ) -> None:
        self.loop = loop
        self.stats = stats
        self.run_commands = run_commands
        self.apply_effects = apply_effects
        self.links = links  # the bus owner (BusHolder)
        self.direct = direct  # waiting.DirectWait: its trio_fd, trio_ready
        self.clock_time = clock_time  # trio's clock (a connection's last_active)
        self.clients: dict[int, Connection] = {}  # by client id: every open connection
        self.by_fd: dict[int, Connection] = {}
        self.others: dict[int, tuple[Callable[[], None], Callable[[], None]]] = {}  # fd -> (on_readable, on_writable): bus links
        self.current: Connection | None = None  # the client whose commands are running
        self.commit: Commit | None = None  # the commit stage (the node's AOF); None: none
        self.in_pass = False
        self.touched: dict[int, Connection] = {}  # this pass: clients with replies to send, in order
        self.depends: set[int] = set()  # this pass: those whose replies wait for its records
        self.runnable: deque[Connection] = deque()  # clients whose held commands may run again
        # Across passes: output waiting for an AOF batch, by client id: (ticket, conn); bus
        # messages waiting, in order: [ticket (None: this pass's), node id, item, watch].
        self.held: dict[int, tuple[int, Connection]] = {}
        self.bus_held: deque[list[Any]] = deque()

    # ------------------------------------------------------------- the pass
    def run_pass(self, ready: Sequence[tuple[int, int]] = (), timers_due: Callable[[], float] | None = None) -> float:
        """One pass, stages 1 to 6 (``ClientLoop._pass`` tells them); the seconds until the
        core's next timer (inf: none, or not ours)."""
        bus = self.links.bus
        if bus is not None:
            bus.hold()
        self.in_pass = True
        limit = math.inf
        try:
            if ready:
                self.serve(ready)  # 1
            if timers_due is not None:
                limit = timers_due()  # 2
            commit = self.commit
            while True:
                if self.runnable:
                    self.run_held()  # 3
                ticket: int = commit.commit() if commit is not None else 0  # 4
                self.release_pass(ticket)  # 5
                if not self.touched and not self.runnable:
                    break  # (a client closed while releasing can wake another)
        finally:
            self.in_pass = False
            if bus is not None:
                bus.release()  # 6
        return limit

    def serve(self, ready: Sequence[tuple[int, int]]) -> None:
        """Stage 1: what each ready socket has: read, parse, run."""
        by_fd = self.by_fd
        others = self.others
        direct = self.direct
        trio_fd: int | None = direct.trio_fd  # None: direct waiting is off
        loop = self.loop
        for fd, events in ready:
            conn = by_fd.get(fd)
            if conn is None:
                if fd == trio_fd:
                    direct.trio_ready = True  # the next wait lets trio handle it
                    continue
                handlers = others.get(fd)
                if handlers is not None:
                    if events & EV_OUT:
                        handlers[1]()
                    if events & (EV_IN | EV_ERR) and fd in others:
                        handlers[0]()
                continue
            try:
                if events & EV_OUT:
                    loop._writable(conn)
                elif conn.read_paused:
                    if events & (EV_RDHUP | EV_ERR):
                        loop.close(conn)  # as a read of EOF would: pending commands dropped
                elif events & (EV_IN | EV_ERR):
                    self.readable(conn)
            except Exception:  # a bug costs this client its connection, not the node
                loop._failed(conn)

    def readable(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self.loop.close(conn)
            return
        if not data:
            self.loop.close(conn)
            return
        self.process(conn, data)

    def process(self, conn: Connection, data: bytes) -> None:
        parser = conn.parser
        assert parser is not None  # every connection the loop reads has one
        self.stats["total_net_input_bytes"] += len(data)
        conn.last_active = self.clock_time()
        parser.feed(data)
        commands: list[list[bytes]] | None
        try:
            commands = parser.commands()
        except ProtocolError as exc:
            # nothing complete before the bad bytes; the error follows. The parser keeps
            # the exception: without this, its traceback (this frame, the connection, the
            # parser) would make a reference cycle that only a full collection frees
            exc.__traceback__ = None
            commands = None
        if commands:
            if conn.blocked or conn.pending:
                conn.pending.extend(commands)
            else:
                self.run(conn, commands)
            if conn.pending:  # blocked, or held back by its output: read no more for now
                self.loop.pause_reading(conn)
        error = parser.error
        if error is not None:
            self.loop._protocol_error(conn, error)
        self.touched[conn.id] = conn  # its replies leave at the pass's end

    def run(self, conn: Connection, commands: list[list[bytes]]) -> None:
        """Run ``conn``'s commands in the core and carry out their effects for others."""
        self.current = conn
        try:
            if self.run_commands(conn, commands):
                self.depends.add(conn.id)  # they journaled: their replies wait for the commit
            self.apply_effects()
        finally:
            self.current = None

    def run_held(self) -> None:
        """Stage 3, the one place commands held back run again: those a client pipelined behind
        a blocking command (it was served: ``woken``) or behind output over ``OUT_HOLD`` (its
        socket took it: ``ClientLoop._writable``)."""
        runnable = self.runnable
        while runnable:
            conn = runnable.popleft()
            if conn.closed or conn.blocked or not conn.pending:
                continue
            commands = list(conn.pending)
            conn.pending.clear()
            try:
                self.run(conn, commands)
                self.touched[conn.id] = conn
                if conn.read_paused and not conn.pending:
                    self.loop.resume_reading(conn)
            except Exception:  # as in serve: this client's connection, not the node
                self.loop._failed(conn)

    def release_pass(self, ticket: int) -> None:
        """Stage 5 (and the bus's part of 6): send the pass's replies, hold those that wait.

        A client's output waits when its commands journaled (or its wake-up came from an input
        that did) and the commit left a ticket, or when earlier output of its waits already
        (order). Others leave now, whatever the disk does."""
        touched = self.touched
        self.touched = {}
        held = self.held
        depends = self.depends
        if not depends and not held:  # nothing waits for the disk: every client's output leaves
            for conn in touched.values():
                if conn.out:
                    self.send_now(conn)
                elif conn.closing and not conn.closed and not conn.waiting_write:
                    self.loop.close(conn)
            if self.bus_held:
                self.release_bus(ticket)
            return
        self.depends = set()
        for conn in touched.values():
            if conn.closed:
                continue
            cid = conn.id
            waiting = held.get(cid)
            if waiting is not None:  # earlier output waits: this waits behind it
                if ticket > waiting[0] and cid in depends:
                    held[cid] = (ticket, conn)
                continue
            if ticket and cid in depends and conn.out:
                held[cid] = (ticket, conn)
                continue
            if conn.out:
                self.send_now(conn)
            elif conn.closing and not conn.waiting_write:
                self.loop.close(conn)
        if self.bus_held:
            self.release_bus(ticket)

    def release_bus(self, ticket: int) -> None:
        """The bus's part of stage 6: messages made while records were pending wait for the
        pass's ticket (or the one before them on their link)."""
        bus_held = self.bus_held
        if bus_held[-1][0] is None:  # this pass's messages made while records were pending
            floor = 0
            for entry in bus_held:
                if entry[0] is None:
                    entry[0] = max(ticket, floor)
                else:
                    floor = entry[0]
            if not bus_held[0][0]:  # nothing waits (written now, or nothing to wait for)
                self.release(0)

    def send_now(self, conn: Connection) -> None:
        """Send what ``conn`` has now; what its socket does not take waits for writability."""
        if conn.closed or not conn.out:
            return
        loop = self.loop
        if conn.waiting_write:  # the socket takes nothing now: what was just added waits
            if not loop.over_output_limit(conn):
                loop._arm(conn)  # at OUT_HOLD: read no more until the client reads
            return
        out = conn.out
        sent: int
        try:
            sent = conn.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError:
            loop.close(conn)
            return
        self.stats["total_net_output_bytes"] += sent  # what the socket took: replies of every path
        if sent == len(out):
            out.clear()
            conn.soft_since = 0.0
            if conn.closing and conn is not self.current:
                loop.close(conn)
            elif conn.pending and not conn.blocked:
                loop._want_write(conn)  # commands held back by the output: the next pass runs them
        else:
            del out[:sent]
            if loop.over_output_limit(conn):
                return
            loop._want_write(conn)

    def carry_out(self) -> None:
        """Carry out the core's effects for an input the loop did not run (the timer task, a bus
        message read elsewhere, the cron, the admin port): outside a pass, the pass's tail
        follows (held commands, commit, release, bus); in one, its end does it."""
        self.apply_effects()
        if not self.in_pass:
            self.run_pass()

    # --------------------------------------------------- ClientOutput, Commit
    def woken(self, conn: Connection, depends: bool) -> None:
        """``ClientOutput``: a reply for ``conn`` made by another input (it was blocked). It
        leaves at the pass's end; what it pipelined meanwhile runs before that."""
        self.touched[conn.id] = conn
        if depends:
            self.depends.add(conn.id)
        if conn.pending:
            self.runnable.append(conn)

    def send_item(self, node_id: str, item: bytes, watch: object = None) -> bool:
        """``ClientOutput``: a bus message. One made while records are pending (the GOTJOB of a
        copy just stored, say) waits for the pass's ticket, and so does every one after a
        message that waits (order on each link)."""
        bus_held = self.bus_held
        if bus_held or (self.commit is not None and self.commit.pending()):
            bus_held.append([None, node_id, item, watch])
            return True
        return bool(self.links.send_item(node_id, item, watch))

    def release(self, seq: int) -> None:
        """The AOF's batch ``seq`` is done (``Commit``'s callback): the replies and bus
        messages that waited for it, or for an earlier one, leave now."""
        held = self.held
        if held:
            for cid, entry in list(held.items()):
                ticket, conn = entry
                if ticket > seq:
                    continue
                # (a nested release took it: compared by value, as compiled code holds the
                # (ticket, conn) pairs unboxed, so a pair is not the same object twice)
                now = held.get(cid)
                if now is None or now[0] != ticket or now[1] is not conn:
                    continue
                del held[cid]
                if conn.closed:
                    continue
                self.send_now(conn)
                if conn.closing and not conn.out and not conn.closed:
                    self.loop.close(conn)
        bus_held = self.bus_held
        if bus_held and bus_held[0][0] is not None and bus_held[0][0] <= seq:
            links = self.links
            bus = links.bus
            if bus is not None:
                bus.hold()
            lost = False
            try:
                while bus_held and bus_held[0][0] is not None and bus_held[0][0] <= seq:
                    _, node_id, item, watch = bus_held.popleft()
                    if not links.send_item(node_id, item, watch) and watch is not None:
                        lost = True  # handed back to the core (on_moves_unsent): its effects
            finally:
                if bus is not None:
                    bus.release()
            if lost:
                self.carry_out()
