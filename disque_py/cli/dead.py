"""``disque-py dead``: list, show, requeue and purge the cluster's dead letters.

The steps (what is asked, how replies are read, the order of a requeue) are
``deadletters.py``'s, shared with the admin page; this module is their sync driver:
one client connection per node of the cluster (the ``--nodes`` given and every node
their HELLO lists), and the printing.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from .options import NodeOptions, node_options

from ..client import deadletters as dl
from ..client.cluster import Address
from ..client.config import ClientConfig
from ..client.errors import DisqueError

if TYPE_CHECKING:
    from ..client.connection import NodeConnection

__all__ = ["dead", "Cluster"]

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}
#: from this many dead letters on, a requeue or a purge shows a progress bar (on a terminal)
PROGRESS_MIN = 200


class Cluster:
    """Connections to every node: the seeds, then each node a seed's HELLO lists (by node ID)."""

    def __init__(self, seeds: list[Address], config: ClientConfig, timeout: float, *, discover: bool = True) -> None:
        self.config = config
        self.timeout = timeout
        self.conns: dict[str, NodeConnection] = {}  # node ID -> connection
        self.problems: list[str] = []  # nodes that could not be asked, and why
        self.ids_by_address: dict[Address, str] = {}  # each address that answered -> its node ID
        from ..client.connection import NodeConnection  # here: `disque-py --help` does not load redis-py

        todo = list(seeds)
        seen: set[Address] = set()
        while todo:
            address = todo.pop(0)
            if address in seen:
                continue
            seen.add(address)
            try:
                conn = NodeConnection(address, config)
                hello = conn.request((b"HELLO",), timeout)
                node_id = hello[1].decode("ascii")
            except (DisqueError, OSError, IndexError, AttributeError) as exc:
                self.problems.append("%s:%d: %s" % (address[0], address[1], exc))
                continue
            self.ids_by_address[address] = node_id
            if node_id in self.conns:
                conn.close()
                continue
            self.conns[node_id] = conn
            if discover and not config.tls:  # HELLO lists plain ports, which TLS does not reach
                for entry in hello[2:]:
                    nid, ip, port = entry[0].decode("ascii"), entry[1].decode("ascii", "replace"), int(entry[2])
                    if nid not in self.conns:
                        todo.append((ip if ip not in ("", "0.0.0.0", "::", "*") else address[0], port))

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()

    def pipeline(self, node_id: str):
        conn = self.conns[node_id]
        return lambda argvs: conn.request_many(argvs, self.timeout)

    def dead_letters(self, queue: bytes | None = None) -> dict[str, dl.DeadLetter]:
        """Every node's dead letters (of ``queue``), merged by job ID."""
        found = []
        for node_id in list(self.conns):
            try:
                found.append(dl.drive(dl.scan(queue, node_id), self.pipeline(node_id)))
            except (DisqueError, OSError, dl.ReplyError) as exc:
                self.problems.append("node %s: %s" % (node_id[:8], exc))
        return dl.merge(found)

    def act(self, steps_of, dead: list[dl.DeadLetter], *, progress: bool, label: str) -> dl.StepResult:
        """Run ``steps_of(batch)`` for every batch of ``dead``, each on the node it was found on."""
        total = dl.StepResult()
        batches = [(node, batch) for node, held in dl.by_node(dead).items() for batch in dl.chunks(held)]
        bar = click.progressbar(length=len(dead), label=label, file=sys.stderr) if progress else None
        try:
            for node, batch in batches:
                try:
                    got = dl.drive(steps_of(batch), self.pipeline(node))
                except (DisqueError, OSError) as exc:
                    got = dl.StepResult(errors={d.id: "node %s: %s" % (node[:8], exc) for d in batch})
                total.done += got.done
                total.new_ids.update(got.new_ids)
                total.errors.update(got.errors)
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.render_finish()
        return total


# ---------------------------------------------------------------- printing
def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return "%ds" % seconds
    if seconds < 7200:
        return "%dm" % (seconds // 60)
    if seconds < 172800:
        return "%dh" % (seconds // 3600)
    return "%dd" % (seconds // 86400)


def _name(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _task_of(body: bytes) -> tuple[str, str]:
    """A task job's name and its arguments as a call's (``1, 2, x=3``), or ("", "") when the body
    is not a task message (a plain job's dead letter)."""
    from ..tasks.message import MessageError, decode

    try:
        message, _ = decode(body)
    except (MessageError, ValueError, TypeError):
        return "", ""
    words = [repr(a) for a in message.args] + ["%s=%r" % (k, v) for k, v in message.kwargs.items()]
    return message.task, ", ".join(words)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def _warn(cluster: Cluster) -> None:
    for problem in cluster.problems:
        click.echo("warning: not asked: %s (its dead letters are not counted)" % problem, err=True)


# ---------------------------------------------------------------- commands
def _connection_options(command):
    """The shared node options (cli/options.py) and the answer timeout."""
    command = click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 600),
                           help="Seconds to wait for a node's answer.")(command)  # fmt: skip
    return node_options()(command)


def connect(opts: dict[str, Any], seeds: list[Address]) -> Cluster:
    """Connections to ``seeds`` and every node their HELLO lists, with the options' credentials
    (``disque-py drain`` too)."""
    conn: NodeOptions = opts["conn"]
    config = ClientConfig(seeds, password=conn.password, username=conn.username, socket_timeout=opts["timeout"],
                          connect_timeout=opts["timeout"], tls=conn.tls, ssl_ca_certs=conn.cacert,
                          ssl_certfile=conn.cert, ssl_keyfile=conn.key)  # fmt: skip
    return Cluster(seeds, config, opts["timeout"])


def _open(opts: dict[str, Any]) -> Cluster:
    cluster = connect(opts, opts["conn"].addresses())
    if not cluster.conns:
        _warn(cluster)
        click.echo("no node answered", err=True)
        sys.exit(1)
    return cluster


_CONN_KEYS = ("conn", "timeout")


def _split(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.pop(k) for k in _CONN_KEYS}


@click.group(context_settings=CONTEXT, short_help="See and act on dead letters (list, show, requeue, purge).")
def dead() -> None:
    """See and act on the cluster's dead letters.

    A job added with MAXDELIVER n that fails once more after its n-th
    delivery (or is NACKed with DEAD) becomes a dead letter: a new job with
    the same body in its dead-letter queue (DEADLETTER, default
    `<queue>.dead`), whose SHOW names the original job, its queue, how many
    times it was delivered, the last failure's REASON and its traceback (a
    worker's NACK ... TRACE). These commands ask
    every node of the cluster (the nodes given, and each node their HELLO
    lists) and count each dead letter once.

    \b
    Examples:
      disque-py dead list                                  (every dead-letter queue, with counts)
      disque-py dead show orders.dead                      (its jobs: original queue, deliveries, reason, age)
      disque-py dead requeue orders.dead D-dcb833cf-...    (one job back to its original queue)
      disque-py dead requeue orders.dead --all             (every job of the queue)
      disque-py dead purge orders.dead --all --yes         (acknowledge them all, no prompt)
      disque-py dead list --nodes 10.0.0.5:7711 -a s3cret --json

    A requeue adds the job to its original queue (same body, REPLICATE,
    RETRY, the TTL it has left, and the options the original was added with,
    MAXDELIVER and BACKOFF included, so its deliveries count from zero),
    then acknowledges the dead letter: a failure in between leaves the job in
    both queues, never in neither. A purge acknowledges the dead letters.
    """


@dead.command("list", context_settings=CONTEXT)
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print the queues as JSON.")
def dead_list(as_json: bool, **kwargs: Any) -> None:
    """List the dead-letter queues: how many dead letters each holds, from
    which original queues, and the age of the oldest.

    \b
    Examples:
      disque-py dead list
      disque-py dead list --json | jq '.[] | select(.count > 100)'
    """
    cluster = _open(_split(kwargs))
    try:
        queues = dl.summarize(cluster.dead_letters().values())
    finally:
        cluster.close()
    _warn(cluster)
    now = time.time()
    if as_json:
        click.echo(json.dumps([q.as_json(now) for q in queues], indent=2))
        return
    if not queues:
        click.echo("no dead letters")
        return
    rows = [[_name(q.name), str(q.count), ", ".join("%s (%d)" % (_name(k), v) for k, v in sorted(q.originals.items())),
             _age(now - q.oldest_ctime_ns / 1e9)] for q in queues]  # fmt: skip
    click.echo(_table(rows, ["QUEUE", "JOBS", "FROM", "OLDEST"]))


@dead.command("show", context_settings=CONTEXT)
@click.argument("queue")
@_connection_options
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="Show at most this many jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON (bodies and tracebacks included).")
@click.option("--traceback/--no-traceback", "tracebacks", default=True, show_default=True,
              help="Print the traceback of each one's last failure under the table.")
def dead_show(queue: str, limit: int, as_json: bool, tracebacks: bool, **kwargs: Any) -> None:
    """Show the dead letters of QUEUE, oldest first: job ID, original queue,
    the task and its arguments (for a task's job), deliveries of the
    original, age, and the last failure reason; then the traceback of that
    failure, for each that has one (a worker's NACK sends it).

    \b
    Examples:
      disque-py dead show orders.dead
      disque-py dead show orders.dead --limit 10 --no-traceback
      disque-py dead show orders.dead --limit 10 --json
    """
    cluster = _open(_split(kwargs))
    try:
        jobs = dl.sort_jobs(cluster.dead_letters(queue.encode()).values())
    finally:
        cluster.close()
    _warn(cluster)
    now = time.time()
    total = len(jobs)
    jobs = jobs[:limit]
    if as_json:
        out = []
        for j in jobs:
            item = j.as_json(now)
            task, args = _task_of(j.body)
            item["task"], item["arguments"] = task or None, args if task else None
            out.append(item)
        click.echo(json.dumps(out, indent=2))
        return
    if not jobs:
        click.echo("no dead letters in %s" % queue)
        return
    rows = []
    for j in jobs:
        task, args = _task_of(j.body)
        rows.append([j.id, _name(j.original_queue), task, _short(args, 40), str(j.deliveries), _age(j.age(now)),
                     "" if j.reason is None else _short(_CONTROL.sub(_escape, _name(j.reason)), 60)])  # fmt: skip
    header = ["ID", "ORIGINAL QUEUE", "TASK", "ARGUMENTS", "DELIVERIES", "AGE", "REASON"]
    if not any(r[2] for r in rows):  # no task among them: plain jobs have no task nor arguments
        rows = [r[:2] + r[4:] for r in rows]
        header = header[:2] + header[4:]
    click.echo(_table(rows, header))
    if total > limit:
        click.echo("(%d more; --limit to see them)" % (total - limit))
    if tracebacks:
        for j in jobs:
            if j.trace:
                click.echo("\n%s: the traceback of its last failure\n%s" % (j.id, _indented(_name(j.trace))))


def _indented(text: str) -> str:
    """A traceback indented under its heading, its control characters shown as escapes (a
    failure's text is anyone's: it must not drive the terminal)."""
    return "\n".join("    " + _CONTROL.sub(_escape, line) for line in text.rstrip("\n").split("\n"))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(match: "re.Match[str]") -> str:
    return "\\x%02x" % ord(match.group())


def _selected(cluster: Cluster, queue: str, ids: tuple[str, ...], all_: bool) -> list[dl.DeadLetter]:
    if bool(ids) == all_:
        raise click.UsageError("give job IDs or --all (not both)")
    found = cluster.dead_letters(queue.encode())
    if all_:
        return dl.sort_jobs(found.values())
    missing = [i for i in ids if i not in found]
    if missing:
        cluster.close()
        click.echo("not a dead letter of %s: %s" % (queue, ", ".join(missing)), err=True)
        sys.exit(1)
    return [found[i] for i in dict.fromkeys(ids)]


def _progress(flag: bool | None, count: int) -> bool:
    if flag is not None:
        return flag
    return count >= PROGRESS_MIN and sys.stderr.isatty()


def _report(result: dl.StepResult, verb: str, queue: str, quiet: bool = False) -> None:
    """Each failure on stderr, then the count (on stderr when ``quiet``: stdout holds JSON)."""
    for job_id, why in result.errors.items():
        click.echo("%s: %s" % (job_id, why), err=True)
    click.echo("%s %d dead letter%s of %s%s" % (verb, len(result.done), "" if len(result.done) == 1 else "s", queue,
                                                 ", %d failed" % len(result.errors) if result.errors else ""),
               err=quiet)  # fmt: skip
    if result.errors:
        sys.exit(1)


_progress_option = click.option("--progress/--no-progress", default=None,
                                help="Show a progress bar (default: on a terminal, from %d jobs)." % PROGRESS_MIN)


@dead.command("requeue", context_settings=CONTEXT)
@click.argument("queue")
@click.argument("ids", nargs=-1, metavar="[JOB_ID]...")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead letter of QUEUE.")
@click.option("--json", "as_json", is_flag=True, help="Print {dead letter ID: new job ID} as JSON.")
@_connection_options
@_progress_option
def dead_requeue(queue: str, ids: tuple[str, ...], all_: bool, as_json: bool, progress: bool | None,
                 **kwargs: Any) -> None:  # fmt: skip
    """Put dead letters of QUEUE back in their original queue: the given
    JOB_IDs, or --all.

    Each is added again (ADDJOB to its original queue, with its body,
    REPLICATE, RETRY, the TTL it has left and the original's options), then
    its dead letter is acknowledged, in that order. Prints each dead letter
    with the ID of the job that replaces it ("D-old -> D-new"; --json: a
    JSON object of them), then how many were requeued; exit status 1 when
    some were not (each is named, with why).

    \b
    Examples:
      disque-py dead requeue orders.dead D-dcb833cf-uHCtQbIzd3j6EGhqvyCcXSo7-05a1
      disque-py dead requeue orders.dead --all
    """
    cluster = _open(_split(kwargs))
    try:
        chosen = _selected(cluster, queue, ids, all_)
        result = cluster.act(dl.requeue_steps, chosen, progress=_progress(progress, len(chosen)), label="requeue")
    finally:
        cluster.close()
    _warn(cluster)
    requeued = {old: result.new_ids[old] for old in result.done}
    if as_json:
        click.echo(json.dumps(requeued, indent=2))
    else:
        for old, new in requeued.items():
            click.echo("%s -> %s" % (old, new))
    _report(result, "requeued", queue, quiet=as_json)


@dead.command("purge", context_settings=CONTEXT)
@click.argument("queue")
@click.argument("ids", nargs=-1, metavar="[JOB_ID]...")
@click.option("--all", "all_", is_flag=True, help="Purge every dead letter of QUEUE.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_connection_options
@_progress_option
def dead_purge(queue: str, ids: tuple[str, ...], all_: bool, yes: bool, progress: bool | None, **kwargs: Any) -> None:
    """Delete dead letters of QUEUE for good (ACKJOB, cluster-wide): the
    given JOB_IDs, or --all. Asks first unless --yes.

    \b
    Examples:
      disque-py dead purge orders.dead D-dcb833cf-uHCtQbIzd3j6EGhqvyCcXSo7-05a1
      disque-py dead purge orders.dead --all --yes
    """
    cluster = _open(_split(kwargs))
    try:
        chosen = _selected(cluster, queue, ids, all_)
        if not chosen:
            click.echo("no dead letters in %s" % queue)
            return
        if not yes and not click.confirm("Purge %d dead letter%s of %s? They cannot be recovered"
                                         % (len(chosen), "" if len(chosen) == 1 else "s", queue)):  # fmt: skip
            click.echo("nothing purged", err=True)
            sys.exit(1)
        result = cluster.act(dl.purge_steps, chosen, progress=_progress(progress, len(chosen)), label="purge")
    finally:
        cluster.close()
    _warn(cluster)
    _report(result, "purged", queue)
