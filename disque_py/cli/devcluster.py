"""Local development nodes: start, status and stop N node processes.

Used by ``scripts/cluster``. Each node gets ``run/node-<port>/`` with its
log, pid file and cluster config file, and runs detached from the terminal
so the command returns once every node answers PING. Processes are started,
awaited and stopped by :mod:`disque_py.cli.launcher`.

    scripts/cluster start [N] [--base-port 7711]
    scripts/cluster status
    scripts/cluster stop

(``scripts/cluster`` runs ``python -m disque_py.cli.devcluster`` in the checkout's venv; its help and
usage lines name ``scripts/cluster``, the command the README gives.)
"""

from __future__ import annotations

import os
import signal
import ssl
import sys
from pathlib import Path

import click

from . import launcher

RUN_DIR = Path("run")
#: The name help and usage lines give: the command a user types (README), not ``python -m ...``.
PROG_NAME = "scripts/cluster"
#: The admin HTTP port of a local node (the web page, /metrics, the JSON API): its port + this.
ADMIN_PORT_OFFSET = 1000


def admin_url(port: int) -> str:
    return "http://127.0.0.1:%d/" % (port + ADMIN_PORT_OFFSET)


def _node_dirs() -> list[Path]:
    if not RUN_DIR.is_dir():
        return []
    return sorted(p for p in RUN_DIR.glob("node-*") if p.is_dir())


def _pid(node_dir: Path) -> int | None:
    try:
        pid = int((node_dir / "disque.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    return pid


def _ping(port: int, timeout: float = 0.5) -> bool:
    return launcher.ping(port, timeout=timeout)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Local disque-py nodes for development (state under ./run/)."""


def node_command(port: int, node_dir: Path, *extra: str, python: str | None = None) -> list[str]:
    """A local node's command line: the ``disque-py`` console script (as a user starts a node),
    bound to loopback, with its directory, pid file and log in ``node_dir``, then ``extra``.
    ``scripts/bench start`` times a start with this very command line."""
    return launcher.node_argv(port, None, "--bind", "127.0.0.1", "--dir", str(node_dir),
                              "--pidfile", str(node_dir / "disque.pid"), "--logfile", str(node_dir / "node.log"),
                              *extra, python=python, script=True)  # fmt: skip


def admin_args(port: int) -> list[str]:
    """The admin page each node of ``scripts/cluster start`` has: at its port + :data:`ADMIN_PORT_OFFSET`."""
    return ["--admin-port", str(port + ADMIN_PORT_OFFSET)]


def start_nodes(ports: list[int], *, extra: list[str] = (), run_dir: Path = RUN_DIR,
                per_node: dict[int, list[str]] | None = None) -> list[int]:  # fmt: skip
    """Start a detached node per port (skipping running ones), with ``extra`` arguments and its own
    ``per_node[port]`` ones; returns the ports started."""
    started = []
    with click.progressbar(ports, label="Starting %d node(s)" % len(ports), file=sys.stderr) as bar:
        for port in bar:
            node_dir = (run_dir / ("node-%d" % port)).resolve()
            node_dir.mkdir(parents=True, exist_ok=True)
            if _pid(node_dir) and _ping(port):
                continue
            if _ping(port):
                raise click.ClickException("port %d is already in use by another process" % port)
            log = node_dir / "node.log"
            argv = node_command(port, node_dir, *extra, *(per_node or {}).get(port, ()))
            proc = launcher.spawn(argv, output=log, detach=True)
            started.append(port)
            try:
                launcher.wait_ready(proc, port, timeout=20, logs=[log])
            except launcher.LaunchError as exc:
                raise click.ClickException("node on port %d did not start; see %s\n%s" % (port, log, exc)) from None
    return started


def _command(host: str, port: int, *argv: str, password: str | None = None, username: str | None = None,
             ssl_context: ssl.SSLContext | None = None) -> object:  # fmt: skip
    """One command; a reply error raises :class:`launcher.ReplyError` with the node's text."""
    return launcher.call(port, *argv, host=host, password=password, username=username, ssl_context=ssl_context)


def join_nodes(addresses: list[tuple[str, int]], *, password: str | None = None, timeout: float = 30.0,
               username: str | None = None, ssl_context: ssl.SSLContext | None = None) -> float:  # fmt: skip
    """CLUSTER MEET every node from the first one, then wait until all know each other (over TLS
    with ``ssl_context``: the addresses are then tls-ports).

    Returns the seconds it took to become a full mesh.
    """
    if len(addresses) < 2:
        return 0.0
    want = len(addresses)
    with click.progressbar(length=want, label="Joining %d nodes" % want, file=sys.stderr) as bar:
        done = [0]

        def progress(complete: int) -> None:
            bar.update(complete - done[0])
            done[0] = complete

        try:
            return launcher.join(addresses, password=password, timeout=timeout, progress=progress,
                                 username=username, ssl_context=ssl_context)  # fmt: skip
        except (launcher.LaunchError, OSError) as exc:
            raise click.ClickException(str(exc)) from None


FORGOT, UNKNOWN = "forgot it", "did not know it"


def forget_everywhere(node_id: str, address: tuple[str, int], *, password: str | None = None,
                      username: str | None = None, ssl_context: ssl.SSLContext | None = None,
                      ) -> list[tuple[str, str, str]]:  # fmt: skip
    """CLUSTER FORGET ``node_id`` on every node that ``address`` knows, itself first.

    Returns ``(node id, HOST:PORT, outcome)`` per node asked: :data:`FORGOT`,
    :data:`UNKNOWN` (forgotten before, or never known), or what went wrong. Over TLS
    (``ssl_context``) the other nodes are reached at the addresses CLUSTER NODES lists.
    """
    host, port = address
    conn = {"password": password, "username": username, "ssl_context": ssl_context}
    try:
        table = _command(host, port, "CLUSTER", "NODES", **conn)
    except (launcher.ReplyError, OSError) as exc:
        raise click.ClickException("%s:%d: %s" % (host, port, exc)) from None
    if isinstance(table, bytes):
        table = table.decode()
    nodes = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            nodes.append((fields[0], fields[1], "myself" in fields[2].split(",")))
    if any(nid == node_id and me for nid, _, me in nodes):
        raise click.ClickException("%s:%d is node %s itself: ask another node" % (host, port, node_id))
    results = []
    asked = [n for n in sorted(nodes, key=lambda n: not n[2]) if n[0] != node_id]
    # a node that is down costs its timeout: with many nodes, show how far it got
    with click.progressbar(asked, label="Asking %d node(s)" % len(asked), file=sys.stderr) as bar:
        for nid, addr, me in bar:
            h, _, p = addr.rpartition(":")
            if me:
                h, p = host, str(port)  # as reached: a node may list itself under an address we cannot use
            try:
                _command(h, int(p), "CLUSTER", "FORGET", node_id, **conn)
                outcome = FORGOT
            except Exception as exc:  # noqa: BLE001 - reported per node: one failure must not stop the others
                text = str(exc)
                text = text[4:] if text.startswith("ERR ") else text  # the node's words, without the code
                outcome = UNKNOWN if text.startswith("Unknown node") else text or repr(exc)
            results.append((nid, "%s:%s" % (h, p), outcome))
    return results


@main.command()
@click.argument("count", default=1, type=click.IntRange(1, 64))
@click.option("--base-port", default=7711, show_default=True, help="Port of the first node; the next ones follow.")
def start(count: int, base_port: int) -> None:
    """Start COUNT nodes on consecutive ports, join them, and wait until they all answer."""
    ports = [base_port + i for i in range(count)]
    _warn_ephemeral(ports)
    started = start_nodes(ports, per_node={p: admin_args(p) for p in ports})
    for port in started:
        # A restarted node remembers the cluster of the last run (nodes.conf under ./run/),
        # maybe bigger than this one and with its other nodes down: then ADDJOB's default
        # REPLICATE would wait for them. Keep its ID, forget its peers, join this set below.
        _command("127.0.0.1", port, "CLUSTER", "RESET", "SOFT")
    if count > 1:
        seconds = join_nodes([("127.0.0.1", p) for p in ports])
        click.echo("cluster of %d nodes joined in %.1f s" % (count, seconds))
    for port in ports:
        click.echo("node 127.0.0.1:%d %s, admin %s" % (port, "started" if port in started else "already running",
                                                       admin_url(port)))  # fmt: skip
    click.echo("Web page: %s   (metrics: %smetrics)" % (admin_url(base_port), admin_url(base_port)))
    click.echo("Try: redis-cli -p %d ADDJOB myqueue hello 0   (or .venv/bin/disque-py cli -p %d ...)" % (base_port, base_port))


def _warn_ephemeral(ports: list[int]) -> None:
    """Say so when a node's bus port (its port + 10000) falls in the kernel's ephemeral range,
    where an outgoing connection can hold it (each node warns in its log as well)."""
    from ..server.cluster import BUS_PORT_OFFSET, ephemeral_range

    low_high = ephemeral_range()
    if low_high is None:
        return
    inside = [p for p in ports if low_high[0] <= p + BUS_PORT_OFFSET <= low_high[1]]
    if inside:
        click.echo("warning: the cluster bus port (port + %d) of %s is in the kernel's ephemeral port range %d-%d: "
                   "an outgoing connection may hold it and a start fail with 'Address already in use'; "
                   "use --base-port below %d" % (BUS_PORT_OFFSET, ", ".join(map(str, inside)), low_high[0],
                                                 low_high[1], low_high[0] - BUS_PORT_OFFSET - len(ports) + 1),
                   err=True)  # fmt: skip


def _node_summary(port: int) -> str:
    """What a running node says of itself: its admin address and the cluster as it sees it."""
    try:
        admin = _command("127.0.0.1", port, "CONFIG", "GET", "admin-port")
        info = _command("127.0.0.1", port, "CLUSTER", "INFO")
    except (launcher.ReplyError, OSError) as exc:
        return "(%s)" % exc
    admin_port = int(admin[1]) if isinstance(admin, list) and len(admin) == 2 else 0
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return "admin %s  cluster_state:%s, %s nodes known (itself included), %s other(s) reachable" % (
        "http://127.0.0.1:%d/" % admin_port if admin_port else "off",
        fields.get("cluster_state", "?"), fields.get("cluster_known_nodes", "?"),
        fields.get("cluster_reachable_nodes", "?"))


@main.command()
def status() -> None:
    """Show which local nodes are running and answering, each one's admin page, and the cluster
    as it sees it (CLUSTER INFO: cluster_state, nodes known and reachable).

    Exit status: 0 when every node is up and says cluster_state:ok; 1 when a node is down,
    not answering, or sees the cluster in another state; 3 when there are no local nodes."""
    dirs = _node_dirs()
    if not dirs:
        click.echo("no local nodes (scripts/cluster start)")
        sys.exit(3)
    healthy = True
    for node_dir in dirs:
        port = int(node_dir.name.split("-", 1)[1])
        pid = _pid(node_dir)
        up = _ping(port)
        state = "up" if up else ("starting?" if pid else "down")
        line = "node 127.0.0.1:%d pid=%s %s" % (port, pid or "-", state)
        if up:
            summary = _node_summary(port)
            line += "  " + summary
            healthy = healthy and "cluster_state:ok," in summary
        else:
            healthy = False
        click.echo(line)
    if not healthy:
        sys.exit(1)


@main.command()
def stop() -> None:
    """Stop every local node (SHUTDOWN, then SIGTERM, waiting for a clean exit)."""
    stopped = 0
    for node_dir in _node_dirs():
        pid = _pid(node_dir)
        if not pid:
            continue
        port = int(node_dir.name.split("-", 1)[1])
        launcher.stop(pid, port=port, sig=signal.SIGTERM, timeout=10)
        stopped += 1
        click.echo("stopped %s (pid %d)" % (node_dir.name, pid))
    if not stopped:
        click.echo("no running local nodes")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name=PROG_NAME)
