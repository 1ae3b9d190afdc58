"""``scripts/chaos``: chaos runs on real node processes (see tests/chaos/run.py)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from .history import merge_counts
from .nemesis import KINDS, Unavailable
from .run import RunConfig, run
from .workload import Options

AOF_CYCLE = ("off", "everysec", "always")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--nemesis", default="kill", show_default=True,
              help="What goes wrong: %s, several joined with '+', or 'all' (a random mix of what this "
                   "machine and this server can do)." % ", ".join(KINDS))
@click.option("--seconds", type=float, default=40.0, show_default=True, help="Workload under faults, per run.")
@click.option("--interval", type=float, default=10.0, show_default=True, help="Seconds between two faults.")
@click.option("--minutes", type=float, default=0.0,
              help="Soak: runs of --seconds one after the other (a new seed each) until this many minutes "
                   "have passed, with a progress bar and the running counts.")
@click.option("--seed", type=int, default=None, help="The schedule's seed (printed by every run; same seed, "
              "same faults at the same offsets).")
@click.option("--nodes", type=int, default=5, show_default=True)
@click.option("--replicate", type=int, default=3, show_default=True, help="ADDJOB REPLICATE.")
@click.option("--retry", type=int, default=1, show_default=True, help="ADDJOB RETRY of at-least-once jobs.")
@click.option("--retry0-pct", type=float, default=None, help="Percent of jobs added RETRY 0 [default: 0, in a soak 10].")
@click.option("--async-pct", type=float, default=None, help="Percent of jobs added ASYNC [default: 0, in a soak 5].")
@click.option("--failing-pct", type=float, default=0.0, show_default=True,
              help="Jobs that fail: every at-least-once job gets BACKOFF and MAXDELIVER, this percent of them "
                   "always NACKed (plainly, with DELAY, with REASON) until dead-lettered.")  # fmt: skip
@click.option("--maxdeliver", type=int, default=3, show_default=True, help="MAXDELIVER of those jobs.")
@click.option("--producer", type=click.Choice(("once", "retry", "dedup")), default="once", show_default=True,
              help="What a producer does when ADDJOB gives no ID (a timeout, a dropped connection, NOREPL...): "
                   "once: gives the job up; retry: sends it again on any node until it gets an ID (each try "
                   "may make a job); dedup: the same with ADDJOB ... DEDUP <key>, a key per job.")
@click.option("--dedup", is_flag=True, help="Same as --producer dedup.")
@click.option("--mix", default=None, metavar="ACTION=SHARE,...",
              help="What consumers do with a job: ack, fastack, drop, nack [default: "
                   "ack=0.9,fastack=0.04,drop=0.03,nack=0.03].")
@click.option("--rate", type=float, default=400.0, show_default=True, help="Jobs added per second, in all.")
@click.option("--producers", type=int, default=4, show_default=True)
@click.option("--consumers", type=int, default=6, show_default=True)
@click.option("--aof", type=click.Choice(("off", "everysec", "always", "cycle")), default=None,
              help="The nodes' AOF: off, or on with that appendfsync. Default: off, or for a soak 'cycle' "
                   "(off, everysec, always in turn).")
@click.option("--node-timeout", type=int, default=2000, show_default=True, help="cluster-node-timeout, ms.")
@click.option("--server", default=None, metavar="COMMAND",
              help="Run another server: a program taking --port/--bind/--dir/... (e.g. Disque's "
                   "src/disque-server), or a template with {port} {host} {dir} {timeout} {appendonly} "
                   "{appendfsync}.")
@click.option("--no-netns", is_flag=True, help="Every node on 127.0.0.1, even as root (no partitions).")
@click.option("--save-dir", type=click.Path(path_type=Path), default=Path("chaos-results"), show_default=True,
              help="Where a failing run keeps its history, node logs and replay command.")
@click.option("--keep", is_flag=True, help="Keep every run under --save-dir, not only failing ones.")
@click.option("--settle-timeout", type=float, default=120.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Also print each run's counts as one JSON line.")
def main(nemesis, seconds, interval, minutes, seed, nodes, replicate, retry, retry0_pct, async_pct, failing_pct,
         maxdeliver, producer, dedup, mix, rate, producers, consumers, aof, node_timeout, server, no_netns, save_dir,
         keep, settle_timeout, as_json):
    """Run producers and consumers against NODES real node processes while a nemesis kills, pauses,
    partitions, jumps clocks or fills disks, then heal, settle and check the history: lost jobs,
    duplicated deliveries, RETRY 0 jobs delivered twice, acknowledged jobs left behind.

    \b
    Examples:
      scripts/chaos --nemesis kill                    one 40 s run, a kill -9 every 10 s
      scripts/chaos --nemesis partition --seed 42     replay a schedule
      scripts/chaos --nemesis kill-all --aof always   every node killed at once, AOF fsynced
      scripts/chaos --minutes 30 --nemesis all        the soak
      scripts/chaos --server /path/to/disque-server   the same runs against Disque

    Partitions need root (a network namespace per node); as another user they are skipped and say why.
    The exit status is 1 when any run broke a promise.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: nodes stopped, namespaces removed
    soak = minutes > 0
    if retry0_pct is None:
        retry0_pct = 10.0 if soak else 0.0
    if async_pct is None:
        async_pct = 5.0 if soak else 0.0
    opts = Options(producers=producers, consumers=consumers, rate=rate, replicate=replicate, retry=retry,
                   retry0_pct=retry0_pct / 100, async_pct=async_pct / 100, failing_pct=failing_pct / 100,
                   maxdeliver=maxdeliver, producer="dedup" if dedup else producer)  # fmt: skip
    if mix:
        try:
            opts.mix = {a: float(v) for a, v in (part.split("=") for part in mix.split(","))}
        except ValueError:
            raise click.BadParameter("ACTION=SHARE,... (e.g. ack=0.97,drop=0.03)", param_hint="--mix")
        if not set(opts.mix) <= {"ack", "fastack", "drop", "nack"} or sum(opts.mix.values()) <= 0:
            raise click.BadParameter("actions: ack, fastack, drop, nack", param_hint="--mix")
    aof = aof or ("cycle" if soak else "off")
    results = []
    t_end = time.monotonic() + minutes * 60
    k = 0
    bar = None
    tty = sys.stderr.isatty()
    last_line = [0.0]
    if soak:
        bar = click.progressbar(length=int(minutes * 60), label="soak", show_eta=True, file=sys.stderr,
                                item_show_func=lambda s: s)  # fmt: skip
        bar.__enter__()
    try:
        while True:
            mode = AOF_CYCLE[k % 3] if aof == "cycle" else aof
            cfg = RunConfig(nemesis=nemesis, seconds=seconds, interval=interval,
                            seed=(seed + k if seed is not None else None), nodes=nodes, server=server,
                            appendonly=mode != "off", appendfsync=mode if mode != "off" else "everysec",
                            node_timeout=node_timeout, settle_timeout=settle_timeout, netns=not no_netns,
                            workload=opts, save_dir=save_dir, keep=keep)  # fmt: skip
            soak_start = t_end - minutes * 60

            def progress(elapsed, workload, nem, _k=k):
                if bar is None or workload is None:
                    return
                done = int(min(minutes * 60, time.monotonic() - soak_start))
                totals = merge_counts(r.report for r in results)
                line = "run %d: %s added, %s delivered, %d faults | all runs: %s lost, %s dup" % (
                    _k + 1, f"{workload.counts['added']:,}", f"{workload.counts['delivered']:,}",
                    nem.done if nem else 0, totals.get("lost", 0), totals.get("duplicates", 0))  # fmt: skip
                bar.update(done - bar.pos, line)
                if not tty and time.monotonic() - last_line[0] >= 15:  # a log, not a terminal: a line now and then
                    last_line[0] = time.monotonic()
                    click.echo("soak %d/%d s: %s" % (done, int(minutes * 60), line), err=True)

            try:
                res = run(cfg, log=(lambda s: None) if soak else (lambda s: click.echo("  " + s, err=True)),
                          progress=progress)  # fmt: skip
            except Unavailable as exc:
                click.echo("chaos: nemesis %s cannot run here: %s" % (nemesis, exc), err=True)
                sys.exit(2)
            results.append(res)
            if bar is not None:
                click.echo("", err=True)
            click.echo(res.table())
            if as_json:
                import json

                click.echo(json.dumps({"seed": res.seed, "nemesis": nemesis, "aof": mode, **res.report.as_dict(),
                                       "faults": len(res.faults), "problems": res.problems}))  # fmt: skip
            k += 1
            if not soak or time.monotonic() >= t_end:
                break
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if len(results) > 1:
        totals = merge_counts(r.report for r in results)
        click.echo("soak: %d runs, %s" % (len(results), ", ".join("%s %s" % (k, f"{v:,}") for k, v in totals.items())))
    failed = [r for r in results if not r.ok]
    if failed:
        click.echo("chaos: %d of %d runs FAILED (seeds %s)" % (len(failed), len(results),
                                                             ", ".join(str(r.seed) for r in failed)))  # fmt: skip
        sys.exit(1)


if __name__ == "__main__":
    main()
