"""Client connections: bytes in -> commands -> replies out, for all clients in one task.

Every client socket is a plain non-blocking stdlib socket registered in one
``select.epoll`` of our own (:class:`ClientLoop`). A single trio task waits
for that epoll's descriptor to become readable (trio's ``wait_readable``
works on any pollable descriptor), then takes every ready client in one
``poll(0)``: it reads what arrived, parses it, runs the commands
synchronously against the core and sends the replies with one ``send``
per client. This is Redis's own design: a request that can be answered at
once costs a ``recv`` and a ``send``, not a trio task switch, a checkpoint
and an epoll registration change as a task per connection did (measured:
~30k unpipelined ADDJOB/s with a task per client against ~50k with one
loop, same core, see BENCHMARKS.md). Other trio tasks (the cluster bus's
handshakes, the cron) run between two batches of clients. When none of
them has anything to do, the loop waits in its epoll directly instead of
through trio, which saves a scheduler round per wake-up (:mod:`.waiting`);
it then also runs the core's timers itself after each pass, and waits no
longer than until the next one (``Server.timers_due``).

The same epoll serves the cluster bus's TCP links once they are through
their handshake (the bus's ``Reactor``: ``add_fd``/``want_writable``/
``remove_fd``): a pass delivers what peers sent along with what clients
sent, and every bus message the pass produced leaves at its end, one write
per peer (``Bus.hold``/``release`` around the pass).

Replies produced for a client by somebody else (a blocked GETJOB served by
an ADDJOB elsewhere, a replicated ADDJOB confirmed by GOTJOBs) are sent at
once with :meth:`ClientLoop.send_soon`.

Back-pressure: what a client's socket does not take stays in ``out``; the
loop then waits for that client to become writable and stops reading from
it until everything is sent, so a client that does not read its replies
cannot make the node buffer without bound. Within one read, commands stop
running once ``out`` holds ``OUT_HOLD`` bytes: the rest wait in ``pending``
and run as the socket takes the output (a 64 KB read can hold thousands of
small commands with big replies, such as ``QPEEK q 1000``). One big reply
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
from typing import TYPE_CHECKING

import trio

from ..protocol.resp import ProtocolError, encode_reply
from .logs import log
from .waiting import DirectWait

if TYPE_CHECKING:
    from .app import Server

__all__ = ["Connection", "ClientLoop"]

READ_SIZE = 65536
OUT_HOLD = 1 << 20  # a client's commands wait while this much of its output is unsent
_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_ERR = select.EPOLLERR | select.EPOLLHUP
_RDHUP = select.EPOLLRDHUP  # the only event asked for while reading is paused: the client hung up


class Connection:
    __slots__ = (
        "id",
        "sock",
        "fd",
        "addr",
        "laddr",
        "name",
        "lib_name",
        "lib_ver",
        "created",
        "last_active",
        "authenticated",
        "out",
        "blocked",
        "pending",
        "closing",
        "closed",
        "waiting_write",
        "read_paused",
        "last_cmd",
        "parser",
        "encode",
        "soft_since",
    )

    def __init__(self, cid: int, sock: socket.socket, addr: str, laddr: str, now: float, parser) -> None:
        self.id = cid
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.laddr = laddr
        self.name = b""
        self.lib_name = b""
        self.lib_ver = b""
        self.created = now
        self.last_active = now
        self.authenticated = False
        self.out = bytearray()
        self.blocked = False
        self.pending: deque[list[bytes]] = deque()
        self.closing = False  # close once ``out`` is sent
        self.closed = False
        self.waiting_write = False  # registered for EPOLLOUT, not reading
        self.read_paused = False  # commands pending (blocked, or held back by output): not read until they run
        self.last_cmd = b"NULL"
        self.parser = parser
        self.encode = encode_reply  # encode_reply3 after HELLO 3
        self.soft_since = 0.0  # when its unsent output first reached the soft limit (0: below it)


class ClientLoop:
    """Every client connection of a server, driven from one trio task."""

    def __init__(self, server: "Server") -> None:
        self.server = server
        self.stats = server.stats
        self.ep = select.epoll()
        self.by_fd: dict[int, Connection] = {}
        self.others: dict[int, tuple] = {}  # fd -> (on_readable, on_writable): cluster bus links
        self.current: Connection | None = None  # the client whose commands are running
        self.direct = DirectWait(self.ep)  # waits without a trio round when trio is idle (waiting.py)
        self.limit_hard = self.limit_soft = self.limit_soft_seconds = 0  # client-output-buffer-limit

    # ----------------------------------------------------------- membership
    def add(self, conn: Connection) -> None:
        self.by_fd[conn.fd] = conn
        self.ep.register(conn.fd, _IN)

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
        server = self.server
        server.clients.pop(conn.id, None)
        server.node.client_closed(conn.id)
        server.apply_effects()
        try:
            conn.sock.close()
        except OSError:
            pass

    def close_when_sent(self, conn: Connection) -> None:
        """CLIENT KILL, idle timeout: close after what is already buffered has gone out."""
        conn.closing = True
        if conn is self.current or conn.closed:
            return  # the loop closes it after this batch of its commands
        if not conn.out:
            self.close(conn)

    def _arm(self, conn: Connection) -> None:
        """Ask epoll for what ``conn`` waits for now: writability, else only its hang-up while
        reading is paused, else input."""
        self.ep.modify(conn.fd, _OUT if conn.waiting_write else _RDHUP if conn.read_paused else _IN)

    def pause_reading(self, conn: Connection) -> None:
        """Read nothing more from ``conn`` (commands pending) until :meth:`resume_reading`."""
        if conn.read_paused or conn.closed:
            return
        conn.read_paused = True
        if not conn.waiting_write:
            self._arm(conn)

    def resume_reading(self, conn: Connection) -> None:
        if not conn.read_paused or conn.closed:
            return
        conn.read_paused = False
        if not conn.waiting_write:
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
        self.server.stats["client_output_buffer_limit_disconnections"] += 1
        log.warning("Closing client id=%d addr=%s: %d bytes of replies not read, over its %s output "
                    "buffer limit (client-output-buffer-limit)", conn.id, conn.addr, held, which)  # fmt: skip
        self.close(conn)
        return True

    def send_soon(self, conn: Connection) -> None:
        """Send ``conn.out`` now as far as the socket takes it; wait for writable for the rest."""
        if conn.closed or not conn.out:
            return
        if conn.waiting_write:  # the socket takes nothing now: what was just added waits
            self.over_output_limit(conn)
            return
        out = conn.out
        try:
            sent = conn.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close(conn)
            return
        self.stats["total_net_output_bytes"] += sent  # what the socket took: replies of every path
        if sent == len(out):
            out.clear()
            conn.soft_since = 0.0
            if conn.closing and conn is not self.current:
                self.close(conn)
            elif conn.pending and not conn.blocked:
                self._want_write(conn)  # commands held back by the output: the next pass runs them
        else:
            del out[:sent]
            if self.over_output_limit(conn):
                return
            self._want_write(conn)

    def _writable(self, conn: Connection) -> None:
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
            self.over_output_limit(conn)
            return
        out.clear()
        conn.soft_since = 0.0
        if conn.closing:
            self.close(conn)
            return
        if conn.pending and not conn.blocked:
            self._run_pending(conn)
            return
        conn.waiting_write = False
        conn.read_paused = bool(conn.pending)  # blocked with commands pending: still not read
        self._arm(conn)  # what arrived meanwhile waits in the socket

    def _failed(self, conn: Connection) -> None:
        self.current = None
        self.server.stats["internal_errors"] += 1
        log.exception("Internal error serving client id=%d addr=%s; connection closed", conn.id, conn.addr)
        try:
            self.close(conn)
        except Exception:  # noqa: BLE001 - already failing: forget it whatever happens
            self.by_fd.pop(conn.fd, None)
            self.server.clients.pop(conn.id, None)

    def _want_write(self, conn: Connection) -> None:
        """Be called back (``_writable``) when the socket takes output: at once if it can now."""
        if not conn.waiting_write:
            conn.waiting_write = True
            self._arm(conn)

    def _run_pending(self, conn: Connection) -> None:
        """Run the commands held back while ``conn``'s output was over ``OUT_HOLD``. Its output is
        sent and it stays registered for writability: the next pass sends what these produce
        (the socket is writable, so at once) and, from ``_writable``, goes on or reads again."""
        server = self.server
        commands = list(conn.pending)
        conn.pending.clear()
        self.current = conn
        try:
            server.run_commands(conn, commands)
            server.apply_effects()
        finally:
            self.current = None

    # ---------------------------------------------------------------- input
    def _readable(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self.close(conn)
            return
        if not data:
            self.close(conn)
            return
        self._process(conn, data)

    def _process(self, conn: Connection, data: bytes) -> None:
        server = self.server
        stats = server.stats
        parser = conn.parser
        stats["total_net_input_bytes"] += len(data)
        conn.last_active = trio.current_time()
        parser.feed(data)
        self.current = conn
        try:
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
                    server.run_commands(conn, commands)
                    server.apply_effects()
                if conn.pending:  # blocked, or held back by its output: read no more for now
                    self.pause_reading(conn)
            error = parser.error
            if error is not None:
                server.protocol_error(conn, error)
        finally:
            self.current = None
        if conn.closed:
            return
        if conn.out:
            self.send_soon(conn)
            if conn.closed or conn.waiting_write:
                return
        if conn.closing:
            self.close(conn)

    # ----------------------------------------------------------------- loop
    async def run(self) -> None:
        by_fd = self.by_fd
        others = self.others
        server = self.server
        cluster = server.cluster
        direct = self.direct
        owns_timers = False  # the core's timers run here while waiting directly (Server.hand_timers)
        limit = math.inf
        try:
            await direct.start()
            while True:
                if direct.active != owns_timers:
                    owns_timers = direct.active
                    server.hand_timers(owns_timers)
                    limit = server.timers_due() if owns_timers else math.inf
                ready = await direct.wait(limit)
                trio_fd = direct.trio_fd
                bus = cluster.bus
                if bus is not None:
                    bus.hold()
                try:
                    for fd, events in ready:
                        conn = by_fd.get(fd)
                        if conn is None:
                            if fd == trio_fd:
                                direct.trio_ready = True  # the next wait lets trio handle it
                                continue
                            handlers = others.get(fd)
                            if handlers is not None:
                                if events & _OUT:
                                    handlers[1]()
                                if events & (_IN | _ERR) and fd in others:
                                    handlers[0]()
                            continue
                        try:
                            if events & _OUT:
                                self._writable(conn)
                            elif conn.read_paused:
                                if events & (_RDHUP | _ERR):
                                    self.close(conn)  # as a read of EOF would: pending commands dropped
                            elif events & (_IN | _ERR):
                                self._readable(conn)
                        except Exception:  # a bug costs this client its connection, not the node
                            self._failed(conn)
                    if owns_timers:
                        limit = server.timers_due()  # its bus messages leave with the pass's
                finally:
                    if bus is not None:
                        bus.release()
                if not owns_timers:
                    server._poke_timer()
        finally:
            if owns_timers:
                server.hand_timers(False)
            direct.close()  # the epoll stays open: bus links may still register or leave (Server.run closes it)

