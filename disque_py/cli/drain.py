"""``disque-py drain HOST:PORT``: empty a node before it is stopped.

The steps are ``client/drain.py``'s (shared with ``POST /api/drain``); this module drives them
with one sync connection per node (``dead.py``'s Cluster: the node given, and every node its
HELLO lists) and prints: a progress bar on a terminal, plain lines otherwise, ``--json`` for
scripts.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from ..client import drain as dr
from ..client.cluster import parse_address
from ..client.errors import DisqueError
from .dead import Cluster, _connection_options, _split, connect
from .options import NodeOptions

__all__ = ["drain"]

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}
#: exit statuses: drained; an error (no node answered, nowhere to move jobs); --max-time passed
EXIT_OK, EXIT_ERROR, EXIT_TIMEOUT = 0, 1, 2


def _fail(message: str) -> None:
    click.echo("drain: %s" % message, err=True)
    sys.exit(EXIT_ERROR)


def _line(d: dr.Drain, elapsed: float) -> str:
    left = d.left
    return ("%.1fs: %d jobs left on %s (queued %d, active %d, acked %d, moves unconfirmed %d); moved %d"
            % (elapsed, left.total, d.node[:8], left.queued, left.active, left.acked, len(d.pending), d.moved))


@click.command(context_settings=CONTEXT, short_help="Empty a node (CLUSTER LEAVING yes, move its jobs) before stopping it.")
@click.argument("address", metavar="HOST:PORT")
@click.option("--max-time", default=600.0, show_default=True, type=click.FloatRange(0.1, 86400),
              help="Give up after this many seconds: exit 2, with what is left.")
@click.option("--interval", default=0.2, show_default=True, type=click.FloatRange(0.01, 10),
              help="Seconds between two rounds that found jobs still there.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object (progress on stderr).")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default: on a terminal).")
@_connection_options
def drain(address: str, max_time: float, interval: float, as_json: bool, progress: bool | None, **kwargs: Any) -> None:
    """Drain the node at HOST:PORT so that it can be stopped, losing no job.

    \b
    1. CLUSTER LEAVING yes on it, as Disque's README says: it keeps no copy
       of new jobs, answers -LEAVING to a GETJOB that would block, and HELLO
       shows it with priority 100, so clients move to other nodes.
    2. Every job queued on it goes to another node with MOVEJOBS (its ID
       kept): to a node that holds a copy already, else (its only copy was
       here) to another node, which then holds it. Its copy here is dropped
       (DELJOB) only once the receiver shows the job (SHOW), so a move lost
       on the way loses nothing: that copy requeues after RETRY and moves
       in a later round.
    3. Jobs delivered from it and not acknowledged yet are waited for: an
       ACKJOB collects them as usual; if their RETRY runs out first, they
       are queued again here and moved.

    Exits 0 when the node holds no job: stop it, then run `disque-py cluster
    forget <its id> HOST:PORT` on a remaining node. Exits 2 when --max-time
    passes first, saying what is left (jobs still delivered to a consumer,
    most likely), 1 on an error (the node does not answer, no other node to
    move jobs to). Run it again to go on: a node stays leaving until
    `CLUSTER LEAVING no`.

    The other nodes are found through the node's HELLO; -a/--user and the
    TLS options are the other programs' (with --tls, give every node with
    --nodes: HELLO lists plain ports).

    \b
    Examples:
      disque-py drain 10.0.0.3:7711
      disque-py drain 10.0.0.3:7711 -a s3cret --max-time 120 --json
    """
    opts = _split(kwargs)
    conn: NodeOptions = opts["conn"]
    try:
        target = parse_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="HOST:PORT") from None
    seeds = [target] + ([a for a in conn.addresses() if a != target] if conn.given else [])
    cluster: Cluster = connect(opts, seeds)
    try:
        _run(cluster, target, max_time, interval, as_json, progress)
    finally:
        cluster.close()


def _run(cluster: Cluster, target: tuple[str, int], max_time: float, interval: float, as_json: bool,
         progress: bool | None) -> None:  # fmt: skip
    node_id = cluster.ids_by_address.get(target)
    if node_id is None:
        _fail("%s:%d did not answer: %s" % (target[0], target[1], "; ".join(cluster.problems) or "no reply"))
    me = cluster.conns[node_id]
    try:
        reply = me.request((b"CLUSTER", b"LEAVING", b"yes"), cluster.timeout)
        hello = me.request((b"HELLO",), cluster.timeout)
    except (DisqueError, OSError) as exc:
        _fail("CLUSTER LEAVING yes on %s:%d: %s" % (target[0], target[1], exc))
    if isinstance(reply, BaseException):
        _fail("CLUSTER LEAVING yes on %s:%d: %s" % (target[0], target[1], reply))
    peers = [e[0].decode("ascii") for e in hello[2:] if e[0].decode("ascii") != node_id and int(e[3]) < 10]
    d = dr.Drain(node_id, peers)

    def call(node: str, argvs: list[list[bytes]]) -> list[Any]:
        conn = cluster.conns.get(node)
        if conn is None:
            return [ConnectionError("node %s not connected" % node[:8]) for _ in argvs]
        return conn.request_many([tuple(a) for a in argvs], cluster.timeout)

    tty = sys.stderr.isatty()
    show_bar = progress if progress is not None else tty
    bar = None
    start = time.monotonic()
    last_line = 0.0
    first_total = None
    try:
        while True:
            try:
                dr.drive(dr.round_steps(d), call)
            except (DisqueError, OSError, dr.DrainError) as exc:
                _fail(str(exc))
            elapsed = time.monotonic() - start
            total = d.left.total + len(d.pending)
            if first_total is None:
                first_total = total
                if show_bar and total:
                    bar = click.progressbar(length=total, label="drain %s" % node_id[:8], file=sys.stderr)
            if bar is not None:
                bar.update(max(0, (first_total - total) - bar.pos))
            elif not as_json or not show_bar:
                if elapsed - last_line >= 1.0 or d.done:
                    click.echo(_line(d, elapsed), err=True)
                    last_line = elapsed
            if d.done:
                break
            if d.left.queued and not d.peers:
                _fail("no other node to move jobs to (HELLO lists none that is not leaving or failing)")
            if elapsed >= max_time:
                break
            time.sleep(interval)
    finally:
        if bar is not None:
            bar.render_finish()
    elapsed = time.monotonic() - start
    outcome = {"node": node_id, "address": "%s:%d" % target, "drained": d.done, "seconds": round(elapsed, 3),
               "moved": d.moved, "dropped_after_move": d.dropped, "left": d.left.as_json(),
               "moves_unconfirmed": len(d.pending), "errors": d.errors}  # fmt: skip
    if as_json:
        click.echo(json.dumps(outcome, indent=2))
    elif d.done:
        click.echo("drained %s (%s:%d) in %.1f s: %d jobs moved; it holds no job, stop it now"
                   % (node_id, target[0], target[1], elapsed, d.moved))  # fmt: skip
    else:
        click.echo("not drained after %.1f s: %s" % (elapsed, _line(d, elapsed).split(": ", 1)[1]), err=True)
        for e in d.errors:
            click.echo("  %s" % e, err=True)
    if not d.done:
        sys.exit(EXIT_TIMEOUT)
