"""``disque-py worker module:function --queue q ...``: run a :class:`~.worker.Worker` from the shell."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import click

from .options import NodeOptions, node_options

__all__ = ["worker", "load_handler", "load_target"]


def load_handler(spec: str) -> Any:
    """``"package.module:function"`` (or ``module:obj.attr``) -> the callable.

    The current directory is importable, as for ``python -m``.
    """
    target = load_target(spec)
    if not callable(target):
        raise click.BadParameter("%s is not callable" % spec, param_hint="HANDLER")
    return target


def _is_app(target: Any) -> bool:
    """A disque_py.tasks.App (checked without importing the tasks layer for plain handlers)."""
    module = sys.modules.get("disque_py.tasks.app")
    return module is not None and isinstance(target, module.App)


def _task_hint(spec: str, target: Any) -> str | None:
    """When HANDLER names one task of an app (``module:add``), the line that says to run the app."""
    module = sys.modules.get("disque_py.tasks.app")
    if module is None or not isinstance(target, module.Task):
        return None
    module_name = spec.partition(":")[0]
    holder = sys.modules.get(module_name)
    names = [name for name, value in vars(holder).items() if value is target.app] if holder is not None else []
    app_spec = "%s:%s" % (module_name, names[0]) if names else "MODULE:APP"
    return ("%s is the task %r of an app, not a handler: run the app, and its worker runs every task "
            "(disque-py worker %s; --queues picks some of them)" % (spec, target.name, app_spec))


def load_target(spec: str) -> Any:
    """``"package.module:name"`` -> the object (a handler, or a tasks App)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter("expected MODULE:FUNCTION, got %r" % spec, param_hint="HANDLER")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter("cannot import %r: %s" % (module_name, exc), param_hint="HANDLER") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise click.BadParameter("%r has no attribute %r" % (module_name, attr), param_hint="HANDLER") from None
    return target


def _unreachable(seeds: list[str], timeout: float) -> list[str]:
    """Why each seed cannot be used, in one line each (empty: every seed answers RESP). The
    shell's probe tells a refused port from an admin (HTTP) port or a cluster bus port."""
    from .shell import Connection, ConnectFailed
    from ..client.cluster import parse_address

    out = []
    for seed in seeds:
        try:
            host, port = parse_address(seed)
        except ValueError:
            continue  # the client has said so already
        try:
            Connection(host, port, timeout=timeout).close()
        except ConnectFailed as exc:
            out.append(str(exc))
    return out


@click.command(
    "worker",
    context_settings={"help_option_names": ["--help"], "max_content_width": 100},
    short_help="Run a handler on jobs from queues (a worker).",
)
@click.argument("handler")
@click.option("-q", "--queue", "queues", multiple=True, help="Queue to consume (repeatable; required with a handler).")
@click.option(
    "--queues",
    "queue_list",
    multiple=True,
    help="With an app: the queues to run tasks from, comma separated [default: every task's queue].",
)
@node_options()
@click.option(
    "-c", "--concurrency", default=None, type=click.IntRange(1),
    help="Handlers (tasks) at once [default: 1 with a handler, 8 with an app].",
)  # fmt: skip
@click.option(
    "--max-in-flight",
    default=None,
    type=click.IntRange(1),
    help="Jobs fetched and not yet acknowledged, at most [default: 2 x concurrency].",
)
@click.option(
    "--max-attempts",
    default=5,
    show_default=True,
    type=click.IntRange(0),
    help="Dead-letter a job when its attempt number N fails (NACK DEAD: the node moves it to its "
    "dead-letter queue, <queue>.dead by default; 0: never, the job's own MAXDELIVER still applies).",
)
@click.option("--no-dead-letter", is_flag=True, help="Drop (ACK and log) jobs over --max-attempts instead.")
@click.option(
    "--retry-delay",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds before a failed job comes back (NACK DELAY), doubling with each attempt, "
    "jittered by up to 25%; 0: back at once, or after the job's own BACKOFF.",
)
@click.option(
    "--retry-delay-max", default=300.0, show_default=True, type=click.FloatRange(0), help="Cap of --retry-delay."
)
@click.option(
    "--pause-after",
    default=20,
    show_default=True,
    type=click.IntRange(1),
    help="Pause fetching when --pause-ratio of the last N jobs failed (a downstream outage).",
)
@click.option(
    "--pause-ratio", default=0.9, show_default=True, type=click.FloatRange(0, 1, min_open=True),
    help="Share of failed jobs among the last --pause-after that pauses fetching.",
)  # fmt: skip
@click.option(
    "--max-pause",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Longest pause (s) between probes while most jobs fail (0.5 s doubling up to this).",
)
@click.option(
    "--heartbeat",
    default=None,
    type=float,
    help="Send WORKING every SECONDS while a handler runs (0: auto, from the job's RETRY).",
)
@click.option(
    "--beacon-interval",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds between the worker's beats to the cluster (WORKER BEAT: `disque-py workers` lists it, with "
    "what it runs; it drops off after 3 silent intervals); 0: no beats.",
)
@click.option("--fast-ack", is_flag=True, help="Acknowledge with FASTACK instead of ACKJOB.")
@click.option(
    "--grace-period",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds running handlers get to finish after SIGTERM.",
)
@click.option(
    "--fetch-timeout",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="GETJOB TIMEOUT in ms (also bounds how long a stop waits for it).",
)
@click.option(
    "-t",
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Seconds to connect, and to find a node before a failed fetch is logged (then retried).",
)
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="With an app: serve the task counters on http://HOST:PORT/metrics (needs the 'admin' extra).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))  # fmt: skip
def worker(
    handler: str,
    queues: tuple[str, ...],
    queue_list: tuple[str, ...],
    conn: NodeOptions,
    concurrency: int | None,
    max_in_flight: int | None,
    max_attempts: int,
    no_dead_letter: bool,
    retry_delay: float,
    retry_delay_max: float,
    pause_after: int,
    pause_ratio: float,
    max_pause: float,
    heartbeat: float | None,
    beacon_interval: float,
    fast_ack: bool,
    grace_period: float,
    fetch_timeout: int,
    timeout: float,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
) -> None:
    """Run HANDLER (MODULE:FUNCTION) on jobs from the queues until SIGTERM/SIGINT;
    or, when HANDLER names a disque_py.tasks.App (MODULE:APP), run its tasks.

    With an app, the queues are every task's (or --queues / --queue), a task
    that fails is retried as its job says (MAXDELIVER, BACKOFF: the task's
    retries and backoff) and dead-lettered with its error after the last
    try; --max-attempts does not apply. See docs/TASKS.md.

    The handler gets a disque_py.Job (queue, id, body as bytes, nacks,
    additional_deliveries, attempt). Returning acknowledges the job. Raising
    NACKs it with the error as REASON and a DELAY (--retry-delay, doubling
    with each attempt), so other jobs go on meanwhile; when attempt
    --max-attempts fails, the job is dead-lettered by the node (NACK DEAD:
    into <queue>.dead, or the job's DEADLETTER queue; SHOW on it names the
    original job, queue and error). Fetching pauses only when most recent
    jobs fail (--pause-ratio of the last --pause-after), for at most
    --max-pause seconds between probes. `async def` handlers run as trio
    tasks, plain functions in threads. SIGTERM stops fetching and gives
    running handlers --grace-period seconds; a second signal ends the grace
    period at once. Unstarted or unfinished jobs are NACKed.

    \b
    Examples:
      disque-py worker myapp.tasks:send_email --queue emails
      disque-py worker myapp.tasks:resize -q images -n 10.0.0.1:7711,10.0.0.2:7711 -c 8
      disque-py worker myapp.tasks:send_email -q emails -h 10.0.0.1 -p 7711 --tls --cacert ca.crt
      disque-py worker myapp.tasks:app --queues math,emails -c 16 --metrics-port 9101
    """
    from ..client.sync import Client
    from ..client.cluster import Backoff
    from ..client.worker import DEFAULT_DEAD_LETTER, Worker

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    target = load_target(handler)
    app = target if _is_app(target) else None
    hint = _task_hint(handler, target)
    if hint:
        raise click.BadParameter(hint, param_hint="HANDLER")
    if app is None and not callable(target):
        raise click.BadParameter("%s is not callable (nor a disque_py.tasks.App)" % handler, param_hint="HANDLER")
    fn = target
    queues = tuple(queues) + tuple(q for item in queue_list for q in item.replace(",", " ").split())
    if app is None and not queues:
        raise click.UsageError("Missing option '-q' / '--queue' (a handler needs its queues).")
    if app is None and metrics_port is not None:
        raise click.UsageError("--metrics-port is for apps (MODULE:APP).")
    if concurrency is None:
        concurrency = 8 if app is not None else 1
    # an app names its nodes and client options; the command line's words win when given
    seeds = list(app.nodes) if app is not None and not conn.given else list(conn.nodes)
    try:
        if app is not None and not (conn.given or conn.credentials_given):
            client = Client(seeds, **{"connect_timeout": timeout, "failover_timeout": timeout, **app.client_options})
        else:
            client = Client(seeds, password=conn.password, username=conn.username, tls=conn.tls,
                            ssl_ca_certs=conn.cacert, ssl_certfile=conn.cert, ssl_keyfile=conn.key,
                            connect_timeout=timeout, failover_timeout=timeout)  # fmt: skip
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes") from None
    options: dict[str, Any] = dict(
        concurrency=concurrency,
        max_in_flight=max_in_flight,
        dead_letter=None if no_dead_letter else DEFAULT_DEAD_LETTER,
        retry_backoff=Backoff(initial=retry_delay, maximum=max(retry_delay, retry_delay_max), jitter=0.25)
        if retry_delay > 0 else None,
        backoff=Backoff(initial=min(0.5, max_pause), maximum=max_pause, jitter=0.5),
        backoff_after=pause_after,
        backoff_ratio=pause_ratio,
        heartbeat=False if heartbeat is None else (True if heartbeat == 0 else heartbeat),
        beacon_interval=beacon_interval or None,
        fast_ack=fast_ack,
        grace_period=grace_period,
        fetch_timeout_ms=fetch_timeout,
    )
    runner = None
    if app is not None:
        from ..tasks.metrics import serve_metrics
        from ..tasks.runner import make_worker

        if metrics_port is not None:
            from ..util.extras import install_hint

            hint = install_hint("admin", "--metrics-port")
            if hint:
                raise click.UsageError(hint)
        options.pop("concurrency")
        try:
            w, runner = make_worker(app, list(queues) or None, concurrency=concurrency, client=client, **options)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if metrics_port is not None:
            serve_metrics(runner.metrics, metrics_port, metrics_host, worker=w)
            click.echo("worker: metrics on http://%s:%d/metrics" % (metrics_host, metrics_port), err=True)
    else:
        try:
            w = Worker(client, list(queues), fn, max_attempts=max_attempts or None, **options)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    click.echo(
        "worker: %s on %s from %s (concurrency %d, max in flight %d; id %s)"
        % (handler, ", ".join(w.queues), ", ".join(seeds), w.concurrency, w.max_in_flight, w.id),
        err=True,
    )
    if not (conn.tls or any(s.lower().startswith("rediss://") for s in seeds)):
        unreachable = _unreachable(seeds, timeout)
        if len(unreachable) == len(seeds):  # said at once; the worker keeps trying, with a log line each time
            click.echo("worker: cannot reach any node (%s); trying again until one answers (Ctrl-C to stop)"
                       % "; ".join(unreachable), err=True)  # fmt: skip
    if app is not None:
        from ..tasks.runner import run_worker

        stats = run_worker(app, w, handle_signals=True)
    else:
        stats = w.run_sync(handle_signals=True)
    click.echo("worker stopped: %s" % stats, err=True)  # the counters as one line (WorkerStats.__str__)
