"""``disque-py workers``: the live workers of a cluster and the jobs each runs now.

Every node given, and every node their HELLO lists, is asked ``WORKER LIST`` on a
connection of its own (``cli/dead.py``'s :class:`~.dead.Cluster`); a worker beats to the
node its client uses, so the answers are merged by worker ID (``client/workers.py``, the
admin page's code too). Printed as a table, each worker's running jobs under it, or as
JSON (``--json``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from .dead import Cluster
from .options import NodeOptions, node_options

from ..client import workers as wk
from ..client.config import ClientConfig
from ..client.errors import DisqueError

__all__ = ["workers", "gather", "render"]

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}


def gather(cluster: Cluster) -> list[wk.WorkerView]:
    """Every node's WORKER LIST, merged (a node that cannot say is added to ``cluster.problems``)."""
    answers: list[tuple[str, Any]] = []
    for node_id, conn in list(cluster.conns.items()):
        try:
            answers.append((node_id, conn.request((b"WORKER", b"LIST"), cluster.timeout)))
        except (DisqueError, OSError) as exc:
            cluster.problems.append("node %s: %s" % (node_id[:8], exc))
    return wk.merge(answers)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def render(found: list[wk.WorkerView], now: float) -> str:
    """The table: one line per worker, its running jobs indented under it."""
    if not found:
        return "no live workers"
    header = ["WORKER", "HOST", "PID", "QUEUES", "CONC", "RUNNING", "PROCESSED", "FAILED", "LAST BEAT"]
    rows = [[w.id, w.host, str(w.pid), _short(",".join(w.queues), 40), str(w.concurrency), str(w.running_total),
             str(w.processed), str(w.failed), wk.age_text(w.last_beat_ago) + (" stopping" if w.stopping else "")]
            for w in found]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(width) for c, width in zip(header, widths)).rstrip()]
    for w, row in zip(found, rows):
        lines.append("  ".join(c.ljust(width) for c, width in zip(row, widths)).rstrip())
        for job in w.running:
            label = w.label_of(job) + "  " if w.label_of(job) else ""
            progress = "  " + job.progress_text() if job.progress else ""
            lines.append("    %s  %s  %s%s%s" % (job.id, job.queue, label,
                                               "for " + wk.age_text(now - job.since) if job.since else "", progress))  # fmt: skip
        if w.running_total > len(w.running):
            lines.append("    ... %d more" % (w.running_total - len(w.running)))
    return "\n".join(lines)


@click.command("workers", context_settings=CONTEXT, short_help="The live workers and the jobs each runs now.")
@node_options()
@click.option("--json", "as_json", is_flag=True, help="Print the workers as JSON.")
@click.option("--no-discover", is_flag=True, help="Ask only the nodes given, not the nodes their HELLO lists.")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Seconds to wait for a node's answer.")  # fmt: skip
def workers(conn: NodeOptions, as_json: bool, no_discover: bool, timeout: float) -> None:
    """List the live workers of the cluster: who (ID, host, pid), what they
    consume (queues, concurrency), what each runs now (job, queue, task or
    handler, for how long), their counters, and how long ago each last
    beat. A worker beats every 5 s by default (`disque-py worker
    --beacon-interval`) to the node its client uses; a worker silent for 3
    beats drops off, and one that stops cleanly drops off at once.

    \b
    Examples:
      disque-py workers
      disque-py workers --nodes 10.0.0.5:7711,10.0.0.6:7711
      disque-py workers --json | jq '.workers[] | {id, running: [.running[].label]}'

    Exit status: 0, or 1 when no node answered.
    """
    seeds = conn.addresses()
    config = ClientConfig(seeds, password=conn.password, username=conn.username, socket_timeout=timeout,
                          connect_timeout=timeout, tls=conn.tls, ssl_ca_certs=conn.cacert, ssl_certfile=conn.cert,
                          ssl_keyfile=conn.key)  # fmt: skip
    cluster = Cluster(seeds, config, timeout, discover=not no_discover)
    try:
        found = gather(cluster)
    finally:
        cluster.close()
    now = time.time()
    for problem in cluster.problems:
        click.echo("warning: not asked: %s (its workers are not listed)" % problem, err=True)
    if as_json:
        click.echo(json.dumps({"time": now, "workers": [w.as_json(now) for w in found],
                               "unreachable": cluster.problems}, indent=2))  # fmt: skip
    else:
        click.echo(render(found, now))
    if not cluster.conns:
        click.echo("no node answered", err=True)
        sys.exit(1)
