"""The append-only file in a node: writing with group commit, loading, rewrites, INFO.

Theory of operation
-------------------
The core journals what the AOF must learn (``core.store.J_LOAD`` ...) in a list this
module owns (``Aof.journal``, handed to the node with ``Node.set_journal``). The AOF is
the commit stage of the client loop's pass (``clients.py``, ``ClientLoop._pass``): at the
end of every pass, :meth:`Aof.commit` takes what the pass journaled as one *batch* and
returns its *ticket*, the batch number that what depends on it waits for. The loop holds
the replies of the clients whose commands journaled, and the bus messages made while
records were pending, until the AOF calls its ``release(seq)`` (wired by the node); every
other reply leaves at the end of the pass, whatever the disk does. So an ADDJOB's ID, an
ACKJOB's count and a GOTJOB to the replicating node leave after their record. "Done"
depends on ``appendfsync``:

* ``always``: the writer task (:meth:`Aof.run`) takes everything journaled so far as one
  batch, encodes it (``persistence.journal``) and hands it to a worker thread that writes
  and fsyncs it with one ``write`` and one ``fdatasync``: every record of every client
  served meanwhile shares them (group commit). The event loop serves on and journals the
  next batch meanwhile. A power cut loses nothing acknowledged.
* ``everysec``: written by :meth:`Aof.commit` itself, at the end of the pass that
  journaled it (one ``write`` to the OS's cache, as Redis does), so its ticket is done at
  once and the pass's replies leave in the same pass; fsynced by a separate task once a
  second, off the loop. A crash of the process loses nothing acknowledged; a power cut
  about the last 1-2 s.
* ``no``: written the same way, never fsynced by us (a power cut loses what the OS's
  cache held, typically up to 30 s on Linux).

A write that fails (a full disk) is cut back to the last whole record
(``ftruncate``), counted (``aof_last_write_status:err``), logged, and retried every
second by the writer task; meanwhile ADDJOB gets ``-MISCONF Errors writing to the AOF
file: ...`` (as Redis), what waits on the write stays held, so nothing unwritten is
acknowledged, and the node serves on: consumers drain what it holds. An fsync that fails with ``always`` ends the process: after a failed fsync
the kernel may have dropped the pages, so no later success proves anything.

Rewrites (``BGREWRITEAOF``, ``auto-aof-rewrite-*``, ``CONFIG SET appendonly yes``)
fork: the child writes one LOADJOB per job from its copy-on-write view of the table to
a temporary file, fsyncs it and exits; the parent keeps every batch taken since the
fork (``rewrite_buf``), and when the child is done appends them to the new file,
fsyncs it, and renames it over the old one (atomic: a crash at any point leaves a valid
file, the old or the new). ``SHUTDOWN REWRITE-AOF`` writes the snapshot in the process
itself before exiting.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable

import trio

from .. import __version__
from ..core.replies import Error
from . import faults
from .gcpolicy import policy as gc_policy
from .logs import log

if TYPE_CHECKING:
    from ..config import Config
    from .latency import LatencyMonitor
    from ..core.node import Node

__all__ = ["Aof", "AofLoadError"]

READ_CHUNK = 4 << 20
RETRY_WRITE_S = 1.0
CHILD_POLL_S = 0.02
INCREMENTAL_FSYNC_BYTES = 32 << 20  # aof-rewrite-incremental-fsync, as Redis
TAIL_UNDER_LOCK = 256 << 10  # what came during a rewrite is appended in rounds until less is left
TAIL_ROUNDS = 8


class AofLoadError(Exception):
    """The AOF cannot be loaded (corrupt, or truncated with aof-load-truncated no)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Aof:
    """One node's AOF: its state, the writer task, rewrites and loading."""

    def __init__(self, config: "Config", node: "Node") -> None:
        self.config = config
        self.node = node
        self.latency: "LatencyMonitor | None" = None  # set by the node: slow writes/fsyncs are recorded
        self.state = "off"  # off | on | wait-rewrite (appendonly turned on: its first rewrite runs)
        self.journal: list = []
        self._encode_entries: Any = None  # persistence.journal.encode_entries, imported with the first batch
        self.fd = -1
        self.size = 0
        self.base_size = 0
        self.synced_size = 0
        self.batch_seq = 0  # batches taken from the journal
        self.durable_seq = 0  # batches written (and fsynced with always)
        self.writing = False
        self.gating = False  # output waits for its records (AOF on)
        self.inline = False  # everysec / no: written at the end of the pass (commit)
        self._retry: tuple[int, bytes] | None = None  # an inline write that failed: the writer retries
        self._wake = trio.Event()
        self._write_lock = trio.Lock()
        self._fsync_lock = trio.Lock()
        self._fsync_idle: trio.Event | None = None  # the fsync task waits on it while all is synced
        self._nursery: trio.Nursery | None = None
        # Wired by the node (app.py): the client loop's, called when batch ``seq`` is done.
        self.release: Callable[[int], None] = lambda seq: None
        # Status (INFO persistence).
        self.loading = False
        self.last_write_ok = True
        self.fsync_ok = True  # everysec: the last background fsync worked (False refuses new jobs, as Redis)
        self.last_write_error = ""
        self.write_errors = 0
        self.fsyncs = 0
        self.fsync_us_total = 0
        self.fsync_us_max = 0
        self.fsync_us_last = 0
        self.delayed_fsyncs = 0
        self.batches = 0
        self.batch_bytes = 0
        self.rewrite_pid = 0
        self.rewrite_tmp = ""
        self.rewrite_buf: list[bytes] | None = None
        self.rewrite_start = 0.0
        self.rewrite_scheduled = False
        self.last_rewrite_secs = -1
        self.last_bgrewrite_ok = True
        self.rewrites = 0
        self.shutdown_rewrite = False
        # The release that wrote the end of the file (its last VERSION record; "" for none, a
        # file of 0.1.0's; None: no file): one of another release gets ours before our records.
        self.file_release: str | None = None

    # ------------------------------------------------------------------ paths
    @property
    def path(self) -> str:
        return self.config.resolve_path(self.config.appendfilename)

    # ------------------------------------------------------------------ wiring
    def wire(self, release: Callable[[int], None]) -> None:
        """``release``: the client loop's (what waited for batch ``seq`` or an earlier one leaves)."""
        self.release = release

    def settings_changed(self) -> None:
        """appendonly or appendfsync changed (or the state did): who waits for what."""
        self.gating = self.state == "on"
        self.inline = self.config.appendfsync != "always"

    # ------------------------------------------------------------------ the commit stage
    def pending(self) -> bool:
        """Records are journaled and not done, and output waits for them (``Commit``)."""
        return self.gating and bool(self.journal)

    def commit(self) -> int:
        """The end of a client-loop pass (``Commit``): what it journaled goes to the file, and
        the ticket what depends on it waits for (0: nothing waits).

        With everysec and no the write happens here, before the pass's replies leave (as Redis
        does: a write to the OS's cache; the fsync is the separate task's): a crash of the
        process then loses nothing acknowledged, and the ticket is done at once. With always,
        the writer task writes and fsyncs in a thread: the ticket is the batch it takes next.
        While a write is retried (a full disk) the writer keeps the order, and the ticket
        is its next batch too."""
        if not self.journal:
            return 0
        if not self.gating:  # its first rewrite runs: the writer takes them for it, nothing waits
            if self.state != "off":
                self._wake.set()
            return 0
        if self.inline and not self.writing and self.last_write_ok and not self._write_lock.locked():
            return self._write_inline()
        self._wake.set()
        return self.batch_seq + 1

    def _take_batch(self) -> tuple[int, bytes]:
        """Everything journaled so far as the next batch: its number and its records."""
        encode = self._encode_entries
        if encode is None:  # the first batch: a node without the AOF never loads the codec
            from ..persistence.journal import encode_entries

            encode = self._encode_entries = encode_entries
        entries = self.journal[:]
        self.journal.clear()
        data = encode(entries, self.node.ctx.wall_offset)
        self.batch_seq += 1
        if self.rewrite_buf is not None:
            self.rewrite_buf.append(data)
        return self.batch_seq, data

    def _write_inline(self) -> int:
        """everysec / no, from :meth:`commit`: 0 once written; else the batch the writer retries."""
        seq, data = self._take_batch()
        if data:
            size = self.size
            latency = self.latency
            start = time.perf_counter_ns() if latency is not None and latency.threshold_us else 0
            try:
                _write_all(self.fd, data)
                if start:
                    latency.observe("aof-write", start)
            except OSError:
                try:
                    os.ftruncate(self.fd, size)
                except OSError:
                    pass
                # the writer task retries it (and says why); what waits for it stays held
                self._retry = (seq, data)
                self.writing = True
                self._wake.set()
                return seq
            self.size = size + len(data)
            if self._fsync_idle is not None:
                self._fsync_idle.set()  # everysec: an fsync is due within a second
            self.batches += 1
            self.batch_bytes += len(data)
        self.durable_seq = seq
        self.release(seq)
        return 0

    # ------------------------------------------------------------------ the writer
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._fsync_loop)
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if self._retry is not None:
                    seq, data = self._retry
                    self._retry = None
                    await self._finish_batch(seq, data)
                while self.journal and self.state != "off":
                    await self._write_batch()
                self._maybe_auto_rewrite()

    async def _write_batch(self) -> None:
        await self._finish_batch(*self._take_batch())

    async def _finish_batch(self, seq: int, data: bytes) -> None:
        self.writing = True
        try:
            if self.state == "on" and data:
                await self._write_durably(data)
        finally:
            self.writing = False
        self.durable_seq = seq
        self.release(seq)

    async def _write_durably(self, data: bytes) -> None:
        failing_since = 0.0
        while True:
            always = self.config.appendfsync == "always"
            async with self._write_lock:
                if self.state != "on":
                    return  # turned off meanwhile: nothing to wait for
                fd = self.fd
                size = self.size
                try:
                    fsync_us = await trio.to_thread.run_sync(self._write_sync, fd, size, data, always)
                except OSError as exc:
                    fsync_us = -1
                    error = exc
                else:
                    self.size = size + len(data)
                    if self._fsync_idle is not None:
                        self._fsync_idle.set()
                    if always:
                        self.synced_size = self.size
                        self._note_fsync(fsync_us)
                        latency = self.latency
                        if latency is not None and latency.threshold_us and fsync_us >= latency.threshold_us:
                            latency.add("aof-fsync-always", fsync_us // 1000)
            if fsync_us == -2:
                log.critical("Can't persist the AOF: fsync failed with appendfsync always (%s). What was written "
                             "may be lost, so the node stops here; nothing it did not persist was acknowledged.",
                             self.last_write_error)  # fmt: skip
                os._exit(1)
            if fsync_us >= 0:
                self.batches += 1
                self.batch_bytes += len(data)
                if not self.last_write_ok:
                    log.warning("AOF write error solved: %d bytes written after %.1f s; new jobs accepted again",
                                len(data), time.monotonic() - failing_since if failing_since else 0.0)  # fmt: skip
                    self.last_write_ok = True
                    if self.fsync_ok:
                        self.node.refuse_new_jobs(None)
                return
            self.write_errors += 1
            if self.last_write_ok:
                self.node.refuse_new_jobs(Error(
                    "MISCONF Errors writing to the AOF file: %s" % (error.strerror or error)))
            if not failing_since:
                failing_since = time.monotonic()
                log.warning("Error writing to the AOF file %s: %s. ADDJOB is refused (-MISCONF) and replies that depend on it are held until a "
                            "write succeeds; retrying every second.", self.path, error.strerror or error)  # fmt: skip
            self.last_write_ok = False
            self.last_write_error = str(error.strerror or error)
            await trio.sleep(RETRY_WRITE_S)

    def _write_sync(self, fd: int, size: int, data: bytes, fsync: bool) -> int:
        """In a worker thread: write ``data`` at the end (cut back on error); fsync if asked.
        Returns the fsync's microseconds (0 without), -2 if the fsync failed."""
        try:
            _write_all(fd, data)
        except OSError:
            try:
                os.ftruncate(fd, size)  # no partial record stays behind for the retry to follow
            except OSError:
                pass
            raise
        if not fsync:
            return 0
        start = time.perf_counter_ns()
        try:
            faults.fdatasync(fd)
        except OSError as exc:
            self.last_write_error = "fsync: %s" % (exc.strerror or exc)
            return -2
        return max(1, (time.perf_counter_ns() - start) // 1000)

    def _note_fsync(self, us: int) -> None:
        self.fsyncs += 1
        self.fsync_us_total += us
        self.fsync_us_last = us
        if us > self.fsync_us_max:
            self.fsync_us_max = us

    async def _fsync_loop(self) -> None:
        """appendfsync everysec: fsync what was written, once a second, off the event loop. While
        everything written is synced (or the AOF is off) it waits for a write, not for a second: an
        idle node is woken by nothing."""
        while True:
            if self.synced_size == self.size or self.state != "on":
                idle = self._fsync_idle = trio.Event()
                await idle.wait()
                self._fsync_idle = None
            await trio.sleep(1.0)
            if self.state != "on" or self.config.appendfsync != "everysec" or self.synced_size == self.size:
                continue
            if self._fsync_lock.locked():
                self.delayed_fsyncs += 1
                continue
            async with self._fsync_lock:
                fd, size = self.fd, self.size
                start = time.perf_counter_ns()
                try:
                    await trio.to_thread.run_sync(faults.fdatasync, fd)
                except OSError as exc:
                    self.last_write_error = "fsync: %s" % (exc.strerror or exc)
                    if self.fsync_ok:
                        self.fsync_ok = False
                        self.node.refuse_new_jobs(Error("MISCONF Errors fsyncing the AOF file: %s"
                                                        % (exc.strerror or exc)))  # fmt: skip
                        log.warning("AOF fsync failed: %s. ADDJOB is refused (-MISCONF) until an fsync succeeds; "
                                    "retrying every second.", exc.strerror or exc)  # fmt: skip
                    continue
                if not self.fsync_ok:
                    self.fsync_ok = True
                    log.warning("AOF fsync error solved; new jobs accepted again")
                    if self.last_write_ok:
                        self.node.refuse_new_jobs(None)
                self._note_fsync(max(1, (time.perf_counter_ns() - start) // 1000))
                self.synced_size = max(self.synced_size, size)

    # ------------------------------------------------------------------ loading
    def load(self) -> dict[str, int] | None:
        """At start, before anyone is served: rebuild the jobs from the file. None if there is
        no file. Raises AofLoadError (the node must not start) on a corrupt file, or a
        truncated one with aof-load-truncated no."""
        path = self.path
        cfg = self.config
        try:
            total = os.path.getsize(path)
        except OSError:
            log.info("No append only file at %s yet: starting with no jobs", path)
            return None
        from ..persistence.loader import Loader
        from ..persistence.records import CorruptRecord

        log.info("Loading the append only file %s (%d bytes)...", path, total)
        self.loading = True
        start = last = time.monotonic()
        loader = Loader(self.node, __version__)
        try:
            with gc_policy.paused():  # the jobs live long: none examined by the collector (gcpolicy)
                with open(path, "rb") as f:
                    while True:
                        chunk = f.read(READ_CHUNK)
                        if not chunk:
                            break
                        try:
                            loader.feed(chunk)
                        except CorruptRecord as exc:
                            if loader.newer:
                                raise AofLoadError(
                                    "The append only file %s was written in part by disque-py %s, newer than this "
                                    "node's %s, and its record at byte offset %d is one this release cannot read "
                                    "(%s). Start this node with disque-py %s or later. Do not run check-aof --fix on "
                                    "it: it would cut the file there, and every job after that offset would be lost."
                                    % (path, loader.newer, __version__, exc.offset, exc.reason, loader.newer)
                                ) from None
                            raise AofLoadError(
                                "Bad file format reading the append only file %s: corrupt record at byte offset %d "
                                "(%s). Make a backup of it, then run `disque-py check-aof --fix %s`."
                                % (path, exc.offset, exc.reason, path)
                            ) from None
                        now = time.monotonic()
                        if now - last >= 1.0:
                            last = now
                            done = loader.offset
                            log.info("Loading the AOF: %d%% (%d of %d bytes, %d records, %.0f records/s)",
                                     100 * done // max(total, 1), done, total, loader.records,
                                     loader.records / max(now - start, 1e-9))  # fmt: skip
                truncated, counts = loader.finish(cfg.aof_enqueue_jobs_once)
        finally:
            self.loading = False
        self.file_release = loader.last_release
        if loader.newer:
            log.warning("The append only file %s was written in part by disque-py %s, newer than this node's %s: "
                        "every record was read", path, loader.newer, __version__)  # fmt: skip
        if truncated is not None:
            if not cfg.aof_load_truncated:
                raise AofLoadError(
                    "The append only file %s ends inside a record (at byte offset %d, %d bytes) and "
                    "aof-load-truncated is no. Run `disque-py check-aof --fix %s`, or set aof-load-truncated yes "
                    "to load it and drop the partial record." % (path, truncated.offset, truncated.dropped, path)
                )
            log.warning("!!! The append only file %s ends inside a record: %d bytes at byte offset %d dropped, "
                        "and the file truncated there (aof-load-truncated yes)",
                        path, truncated.dropped, truncated.offset)  # fmt: skip
            os.truncate(path, truncated.offset)
        elapsed = time.monotonic() - start
        counts["records"] = loader.records
        counts["expired"] += loader.expired
        log.info("AOF loaded in %.3f s: %d records (%.0f/s), %d jobs restored (%d queued again, %d acked), "
                 "%d expired meanwhile", elapsed, loader.records, loader.records / max(elapsed, 1e-9),
                 counts["jobs"], counts["queued"], counts["acked"], counts["expired"])  # fmt: skip
        return counts

    def open_for_append(self) -> None:
        """appendonly yes at start (after :meth:`load`): append to the file, creating it."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self.file_release != __version__:  # what follows was written by this release
            from ..persistence.records import encode_version

            _write_all(fd, encode_version(__version__))
            self.file_release = __version__
        self.fd = fd
        self.size = self.base_size = self.synced_size = os.fstat(fd).st_size
        self.state = "on"
        self.node.set_journal(self.journal)
        self.settings_changed()

    # ------------------------------------------------------------------ on and off
    def turn_on(self) -> None:
        """CONFIG SET appendonly yes: journal from now on, and start with a rewrite."""
        if self.state != "off":
            return
        self.journal.clear()
        self.node.set_journal(self.journal)
        self.state = "wait-rewrite"
        log.info("AOF turned on: writing the jobs held now with a rewrite first")
        self.rewrite_fresh()

    def rewrite_fresh(self) -> None:
        """A rewrite that starts now: one running was forked too early (before the AOF was
        turned on), so it is abandoned and a new one starts (or is scheduled, if the fork
        fails, and retried)."""
        self._kill_child()
        if not self.start_rewrite():
            self.rewrite_scheduled = True
            self._wake.set()

    def turn_off(self) -> None:
        """CONFIG SET appendonly no: stop writing (a rewrite in progress is abandoned)."""
        if self.state == "off":
            return
        self._kill_child()
        self.state = "off"
        self.settings_changed()
        if not self.last_write_ok or not self.fsync_ok:
            self.last_write_ok = self.fsync_ok = True
            self.node.refuse_new_jobs(None)
        self.node.set_journal(None)
        self.journal.clear()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            if self._nursery is not None:
                self._nursery.start_soon(self._close_later, fd)  # after any thread using it, in one
            else:
                os.close(fd)
        self.batch_seq += 1
        self.durable_seq = self.batch_seq
        self.release(self.durable_seq)
        log.info("AOF turned off")

    async def _close_later(self, fd: int) -> None:
        def sync_and_close() -> None:
            try:
                os.fsync(fd)
            except OSError:
                pass
            os.close(fd)

        async with self._write_lock, self._fsync_lock:
            await trio.to_thread.run_sync(sync_and_close)

    # ------------------------------------------------------------------ rewrites
    def start_rewrite(self) -> bool:
        """BGREWRITEAOF: fork a child that writes the snapshot. False if one is running or the
        fork failed (logged)."""
        if self.rewrite_pid:
            return False
        if self._nursery is None:
            self.rewrite_scheduled = True  # before the writer runs: it starts it
            return True
        tmp = self.config.resolve_path("temp-rewriteaof-bg-%d.aof" % os.getpid())
        buf: list[bytes] = []
        from ..persistence import journal  # noqa: F401 - loaded before the fork: the child imports nothing

        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("Can't rewrite the append only file in the background: fork: %s", exc.strerror or exc)
            self.last_bgrewrite_ok = False
            return False
        if pid == 0:  # the child: write the snapshot and leave, touching nothing else
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                # Let go of every inherited socket and file: a client or peer the parent closes
                # meanwhile must see it closed, and the ports must not stay bound through us.
                os.closerange(3, 1 << 20)
                # Background work: when the child shares a core with the node (pinned, or a
                # busy machine), the scheduler favours the node that serves clients.
                os.nice(10)
                import gc

                gc.disable()
                self._write_snapshot(tmp)
                code = 0
            except BaseException:  # noqa: BLE001 - the parent reads the exit code
                code = 1
            finally:
                os._exit(code)
        self.rewrite_pid = pid
        self.rewrite_tmp = tmp
        self.rewrite_buf = buf
        self.rewrite_start = time.monotonic()
        self.rewrite_scheduled = False
        log.info("Background append only file rewriting started by pid %d", pid)
        self._nursery.start_soon(self._watch_child, pid)
        return True

    def _write_snapshot(self, tmp: str) -> None:
        from ..persistence.journal import snapshot

        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        incremental = self.config.aof_rewrite_incremental_fsync
        unsynced = 0
        try:
            gone = list(self.node.lifecycle.gone.items())
            groups = self.node.limits.records()
            for data in snapshot(self.node.store.values(), self.node.ctx.wall_offset, gone=gone, release=__version__,
                                 groups=groups):  # fmt: skip
                _write_all(fd, data)
                unsynced += len(data)
                if incremental and unsynced >= INCREMENTAL_FSYNC_BYTES:  # no burst of dirty pages at the end
                    os.fdatasync(fd)
                    unsynced = 0
            os.fsync(fd)
        finally:
            os.close(fd)

    async def _watch_child(self, pid: int) -> None:
        while True:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got, status = pid, 1 << 8
            if got == pid:
                break
            await trio.sleep(CHILD_POLL_S)
        if self.rewrite_pid != pid:  # killed (appendonly no, shutdown): nothing to finish
            return
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if ok:
            try:
                await self._finish_rewrite()
            except OSError as exc:
                ok = False
                log.warning("Background AOF rewrite could not be completed: %s", exc.strerror or exc)
        else:
            log.warning("Background AOF rewrite child %d failed (status %d); the old file stays as it is", pid, status)
        if not ok:
            self.last_bgrewrite_ok = False
            self._discard_rewrite()
            if self.state == "wait-rewrite":
                self.rewrite_scheduled = True  # tried again by the writer in a second
                self._nursery.start_soon(self._retry_rewrite_later)
        self.rewrite_pid = 0
        if self.rewrite_scheduled:
            self._wake.set()  # the writer starts it (_maybe_auto_rewrite)

    async def _retry_rewrite_later(self) -> None:
        await trio.sleep(1.0)
        if self.rewrite_scheduled and not self.rewrite_pid:
            self.start_rewrite()

    def _discard_rewrite(self) -> None:
        self.rewrite_buf = None
        if self.rewrite_tmp:
            try:
                os.unlink(self.rewrite_tmp)
            except OSError:
                pass
            self.rewrite_tmp = ""

    async def _finish_rewrite(self) -> None:
        """The child wrote the snapshot: add what came since, switch files atomically.

        What came since is appended in rounds while batches go on (each round's fsync off
        the loop, nothing held), until what is left is small; only that last bit is written
        under the locks, when no batch may be written (replies that wait for one wait for
        it: a few ms, not the hundreds a rewrite's whole tail took to fsync)."""
        tmp = self.rewrite_tmp
        done = 0  # batches of rewrite_buf already in the new file
        appended = 0
        for _ in range(TAIL_ROUNDS):
            buf = self.rewrite_buf or []
            part = b"".join(buf[done:])
            if len(part) < TAIL_UNDER_LOCK:
                break
            await trio.to_thread.run_sync(self._append_sync, tmp, part)
            done = len(buf)
            appended += len(part)
        async with self._write_lock:
            async with self._fsync_lock:
                # No batch is being written now: rewrite_buf holds every batch taken since the fork.
                # (What is still in the journal goes to the new file with the next batch.)
                tail = b"".join((self.rewrite_buf or [])[done:])
                appended += len(tail)
                tmp, path = self.rewrite_tmp, self.path
                keep_open = self.state != "off"
                new_fd, size = await trio.to_thread.run_sync(self._switch_sync, tmp, path, tail, keep_open)
                old = self.fd
                self.fd = new_fd
                self.rewrite_buf = None
                self.rewrite_tmp = ""
                self.last_rewrite_secs = int(time.monotonic() - self.rewrite_start)
                self.last_bgrewrite_ok = True
                self.rewrites += 1
                if keep_open:
                    self.size = self.base_size = self.synced_size = size
                    if self.state == "wait-rewrite":
                        self.state = "on"
                        self.settings_changed()
                        log.info("AOF is on: the rewrite that started it is done (%d bytes)", size)
        if old >= 0:
            # The old file's last reference: closing it frees its pages (tens of ms for a big
            # file), so a worker thread does it, after the locks, as Redis's background close.
            await trio.to_thread.run_sync(os.close, old)
        log.info("Background AOF rewrite finished successfully: %s, %d bytes, %d bytes of new records appended "
                 "(%d of them at the switch)", path, size, appended, len(tail))  # fmt: skip

    @staticmethod
    def _append_sync(tmp: str, data: bytes) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _switch_sync(tmp: str, path: str, tail: bytes, keep_open: bool) -> tuple[int, int]:
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, tail)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.rename(tmp, path)
        _fsync_dir(path)
        size = os.fstat(fd).st_size
        if not keep_open:
            os.close(fd)
            return -1, size
        return fd, size

    def _kill_child(self) -> None:
        pid = self.rewrite_pid
        if pid:
            self.rewrite_pid = 0
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            self._discard_rewrite()
            log.info("Background AOF rewrite child %d killed", pid)

    def _maybe_auto_rewrite(self) -> None:
        if self.rewrite_scheduled and not self.rewrite_pid:
            self.start_rewrite()
            return
        cfg = self.config
        pct = cfg.auto_aof_rewrite_percentage
        if not pct or self.state != "on" or self.rewrite_pid or self.size < cfg.auto_aof_rewrite_min_size:
            return
        base = self.base_size or 1
        growth = (self.size - base) * 100 // base
        if growth >= pct:
            log.info("Starting automatic rewriting of the AOF on %d%% growth", growth)
            self.start_rewrite()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """The node stops (no task runs any more): write what is left; with SHUTDOWN
        REWRITE-AOF, write a fresh file from the table, AOF on or off."""
        if self.state == "wait-rewrite":
            # the AOF was turned on and its first file is not written yet: write it now, whole
            # (Disque refuses to exit then; a node stopped by a signal could not be refused)
            self.shutdown_rewrite = True
        self._kill_child()
        if self.state == "on" and self.journal:
            data = encode_entries(self.journal, self.node.ctx.wall_offset)
            self.journal.clear()
            try:
                _write_all(self.fd, data)
            except OSError as exc:
                log.warning("Writing the AOF at shutdown: %s", exc.strerror or exc)
        if self.fd >= 0:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                log.warning("fsync of the AOF at shutdown: %s", exc.strerror or exc)
            os.close(self.fd)
            self.fd = -1
        if self.shutdown_rewrite:
            tmp = self.config.resolve_path("temp-rewriteaof-%d.aof" % os.getpid())
            start = time.monotonic()
            try:
                self._write_snapshot(tmp)
                os.rename(tmp, self.path)
                _fsync_dir(self.path)
            except OSError as exc:
                log.warning("SHUTDOWN REWRITE-AOF: can't write %s: %s", self.path, exc.strerror or exc)
                return
            log.info("SHUTDOWN REWRITE-AOF: %d jobs written to %s in %.3f s", len(self.node.store), self.path,
                     time.monotonic() - start)  # fmt: skip

    # ------------------------------------------------------------------ INFO
    def info(self) -> dict[str, Any]:
        on = self.state != "off"
        out: dict[str, Any] = {
            "loading": int(self.loading),
            "aof_enabled": int(on),
            "aof_state": self.state,
            "aof_rewrite_in_progress": int(bool(self.rewrite_pid)),
            "aof_rewrite_scheduled": int(self.rewrite_scheduled),
            "aof_last_rewrite_time_sec": self.last_rewrite_secs,
            "aof_current_rewrite_time_sec": int(time.monotonic() - self.rewrite_start) if self.rewrite_pid else -1,
            "aof_last_bgrewrite_status": "ok" if self.last_bgrewrite_ok else "err",
            "aof_last_write_status": "ok" if self.last_write_ok and self.fsync_ok else "err",
        }
        if on:
            out.update({
                "aof_current_size": self.size,
                "aof_base_size": self.base_size,
                "aof_pending_rewrite": int(self.rewrite_scheduled),
                "aof_buffer_length": len(self.journal),
                "aof_rewrite_buffer_length": sum(map(len, self.rewrite_buf)) if self.rewrite_buf else 0,
                "aof_pending_bio_fsync": int(self._fsync_lock.locked()),
                "aof_delayed_fsync": self.delayed_fsyncs,
                "aof_fsync_policy": self.config.appendfsync,
                "aof_batches": self.batches,
                "aof_batch_bytes": self.batch_bytes,
                "aof_write_errors": self.write_errors,
                "aof_fsyncs": self.fsyncs,
                "aof_fsync_last_usec": self.fsync_us_last,
                "aof_fsync_avg_usec": self.fsync_us_total // self.fsyncs if self.fsyncs else 0,
                "aof_fsync_max_usec": self.fsync_us_max,
                "aof_rewrites": self.rewrites,
            })  # fmt: skip
        return out
