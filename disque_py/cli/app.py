"""The ``disque-py`` command line (click), entered through :func:`disque_py.cli.main` for every command
but a plain ``disque-py server``, which starts a node without loading click.

    disque-py server [disque.conf] [--port 7712 --loglevel verbose ...]
    disque-py cli [-h HOST] [-p PORT] [-a PASSWORD] [COMMAND ARGS...]
    disque-py check-aof [--fix [--yes]] FILE
    disque-py gen-certs DIR [--dns NAME ...] [--ip ADDRESS ...] [--force]
    disque-py top [--nodes HOST:PORT,...] [--sort length|in|out|blocked|name] [--once [--json]]
    disque-py dead list|show|requeue|purge [QUEUE] [JOB_ID... | --all] [--nodes HOST:PORT,...]
    disque-py workers [--nodes HOST:PORT,...] [--json]
    disque-py drain HOST:PORT [--max-time SECONDS] [--json]
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from .options import NodeOptions, node_options

from .. import __version__

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}


class _Commands(click.Group):
    """The command group, with the commands that live in other modules imported when asked for (run or
    listed by --help): `disque-py server` starts a node without loading the client library."""

    LAZY = {"worker": ("disque_py.cli.worker", "worker"), "dead": ("disque_py.cli.dead", "dead"),
            "workers": ("disque_py.cli.workers", "workers"), "drain": ("disque_py.cli.drain", "drain")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            import importlib

            module, attr = self.LAZY[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="disque-py")
def main() -> None:
    """disque-py: a distributed, in-memory job broker, compatible with Disque 1.0-rc1.

    Start a node with `disque-py server`, talk to it with `disque-py cli` or
    any Redis client (redis-cli -p 7711, redis-py, existing Disque clients).
    """


@main.command(
    context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_extra_args": True},
    short_help="Run one node (like disque-server).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def server(args: tuple[str, ...]) -> None:
    """Run one disque-py node in the foreground until SIGTERM or SHUTDOWN.

    ARGS is an optional config file followed by directives, each as
    `--name value...`, applied after the file (the same order disque-server
    uses). Every disque.conf directive works; see disque.conf.example.

    \b
    Examples:
      disque-py server
      disque-py server /etc/disque/disque.conf
      disque-py server --port 7712 --dir /tmp/node2 --loglevel verbose
      disque-py server disque.conf --requirepass s3cret --maxclients 500
    """
    from .server import serve

    serve(args)


@main.command(
    context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Send commands to a node (as redis-cli).",
)
@node_options(what="the node")
@click.option("--raw/--no-raw", default=None,
              help="Print replies raw (one item a line, strings unquoted), or formatted as on a terminal. "
                   "Default: formatted on a terminal, raw when piped.")  # fmt: skip
@click.option("-r", "repeat", default=1, show_default=True, type=int, metavar="N",
              help="Send COMMAND N times (-1: until interrupted).")  # fmt: skip
@click.option("-i", "interval", default=0.0, type=click.FloatRange(0), metavar="SECONDS",
              help="With -r: wait SECONDS between the commands (decimals allowed).")  # fmt: skip
@click.option("-t", "--timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 3600), metavar="SECONDS",
              help="Bound on connecting and on the node's first answer (a blocking GETJOB still waits).")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def cli(conn: NodeOptions, raw: bool | None, repeat: int, interval: float, timeout: float,
        command: tuple[str, ...]) -> None:  # fmt: skip
    """Send one COMMAND to a node and print the reply as redis-cli does, or start a prompt.

    On a terminal replies are formatted ((integer) 1, quoted strings, numbered
    arrays); piped they are raw, one item a line, so that
    `id=$(disque-py cli ADDJOB q body 0)` holds the bare ID. INFO, CLUSTER NODES,
    CLIENT LIST and the like print their text as it is in both modes. Exit
    status: 0, 1 if the node could not be reached, 2 after an error reply.

    \b
    Examples:
      disque-py cli ADDJOB myqueue "hello world" 0
      disque-py cli -p 7712 GETJOB TIMEOUT 1000 FROM myqueue
      disque-py cli -r 5 -i 1 QLEN myqueue
      disque-py cli INFO jobs
      disque-py cli            (a prompt with line editing, history and Tab; 'quit' or Ctrl-D to leave)
      disque-py cli help GETJOB   (the commands' syntax, at the prompt too: help, help @jobs)
      disque-py cli -p 7712 --tls --cacert ca.crt --cert client.crt --key client.key PING
    """
    from . import shell

    if command and command[0].lower() in _HELP:  # answered here, the node up or not
        sys.exit(_help(list(command[1:])))

    host, port = conn.first()  # the first node named (-h/-p, --nodes, $DISQUE_NODES)
    password, username = conn.password, conn.username
    context = _connection(password, username, conn.tls, conn.cacert, conn.cert, conn.key)["ssl_context"]
    if raw is None:
        raw = not sys.stdout.isatty()
    out = sys.stdout.buffer

    def connect() -> "shell.Connection":
        return shell.Connection(host, port, timeout=timeout, ssl_context=context, password=password,
                                username=username)  # fmt: skip

    if command:
        try:
            conn = connect()
        except shell.ConnectFailed as exc:
            click.echo(str(exc), err=True)
            sys.exit(1)
        status = 0
        n = 0
        try:
            while repeat < 0 or n < repeat:
                if n and interval:
                    shell.sleep(interval)
                n += 1
                try:
                    reply = conn.request(command)
                except shell.ReplyLost as exc:
                    click.echo(str(exc), err=True)
                    sys.exit(1)
                out.write(shell.render(reply, raw=raw, verbatim=shell.is_verbatim_command(command)))
                out.flush()
                if isinstance(reply, shell.ErrorReply):
                    status = 2
        except KeyboardInterrupt:
            sys.exit(130)
        finally:
            conn.close()
        sys.exit(status)
    _prompt(host, port, connect, raw)


#: The words that ask for help (redis-cli's): answered by the cli, never sent to the node.
_HELP = ("help", "?")


def _help(words: list[str]) -> int:
    """``help ...``: printed from the commands' declarations (cli/commandhelp.py); 0, or 2 when
    it names nothing known (as an error reply)."""
    from .commandhelp import help_text

    width = None
    if sys.stdout.isatty():
        import shutil

        width = shutil.get_terminal_size().columns
    text, known = help_text(words, width)
    click.echo(text, nl=False)
    return 0 if known else 2


def _completer():
    """readline's completer: the node's commands and help topics (cli/commandhelp.py, imported at
    the first Tab)."""
    import readline

    found: list[str] = []

    def complete(text: str, state: int) -> str | None:
        if state == 0:
            from .commandhelp import complete as candidates

            found[:] = candidates(readline.get_line_buffer()[: readline.get_begidx()], text)
        return found[state] if state < len(found) else None

    return complete


def _prompt(host: str, port: int, connect, raw: bool) -> None:
    """The interactive loop: readline's line editing, history and Tab completion when stdin is a
    terminal; lines read one by one (no prompt) when it is not, as redis-cli does. ``help`` is
    answered here; the node is connected to at once on a terminal (the prompt names it), at the
    first command otherwise."""
    import os

    from . import shell

    interactive = sys.stdin.isatty()
    history = None
    if interactive:
        try:
            import readline
        except ImportError:  # pragma: no cover - Python built without it: a plain prompt
            readline = None  # type: ignore[assignment]
        if readline is not None:
            readline.set_completer(_completer())
            readline.set_completer_delims(" \t\n")
            # libedit (macOS's Python) reads its own binding syntax
            readline.parse_and_bind("bind ^I rl_complete" if "libedit" in (readline.__doc__ or "") else "tab: complete")
            history = os.environ.get("DISQUE_CLI_HISTFILE") or os.path.join(os.path.expanduser("~"),
                                                                             ".disque-py-cli_history")  # fmt: skip
            if history != os.devnull:
                try:
                    readline.read_history_file(history)
                except OSError:
                    pass
                readline.set_history_length(1000)
            else:
                history = None
    out = sys.stdout.buffer
    conn = None
    tried = False  # piped: the first connection failing ends the run (exit 1), as before any line
    if interactive:
        try:
            conn = connect()
        except shell.ConnectFailed as exc:
            click.echo(str(exc), err=True)
    try:
        while True:
            prompt = "%s:%d> " % (host, port) if conn is not None else "not connected> "
            try:
                line = input(prompt if interactive else "")
            except EOFError:
                if interactive:
                    click.echo()
                return
            except KeyboardInterrupt:
                click.echo()
                continue
            try:
                argv = shlex.split(line)
            except ValueError as exc:
                click.echo("Invalid argument(s): %s" % exc)
                continue
            if not argv:
                continue
            if argv[0].lower() in ("quit", "exit"):
                return
            if argv[0].lower() in _HELP:
                _help(argv[1:])
                continue
            times = 1
            if len(argv) > 1 and argv[0].isdigit():  # "3 QLEN q", as redis-cli: the command 3 times
                times, argv = int(argv[0]), argv[1:]
            for _ in range(times):
                if conn is None:
                    try:
                        conn = connect()
                    except shell.ConnectFailed as exc:
                        click.echo(str(exc), err=True)
                        if not interactive and not tried:
                            sys.exit(1)
                        break
                    finally:
                        tried = True
                try:
                    reply = conn.request(argv)
                except shell.ReplyLost as exc:
                    click.echo(str(exc), err=True)
                    conn = None
                    break
                except KeyboardInterrupt:  # a blocking command given up: its reply would come later
                    click.echo()
                    conn.close()
                    conn = None
                    break
                out.write(shell.render(reply, raw=raw, verbatim=shell.is_verbatim_command(argv)))
                out.flush()
    finally:
        if conn is not None:
            conn.close()
        if history is not None:
            try:
                import readline

                readline.write_history_file(history)
            except OSError:
                pass


@main.group(context_settings=CONTEXT, short_help="Create and join clusters.")
def cluster() -> None:
    """Create local clusters and join nodes together (CLUSTER MEET)."""


@cluster.command("create", context_settings=CONTEXT)
@click.option("--nodes", "count", default=3, show_default=True, type=click.IntRange(1, 64), help="How many nodes.")
@click.option("--base-port", default=7711, show_default=True, help="Client port of the first node; the others follow.")
@click.option("--secret", default=None, help="cluster-secret for every node: only nodes that know it join.")
@click.option("--node-timeout", default=None, type=click.IntRange(100), help="cluster-node-timeout in ms (default 15000).")
@click.option("--dir", "run_dir", default="run", show_default=True, type=click.Path(file_okay=False),
              help="Where node directories (logs, nodes.conf, pid files) go.")  # fmt: skip
@click.option("--tls", is_flag=True, help="Nodes also serve TLS (needs --cacert, --cert, --key) and are joined over it.")
@click.option("--cacert", default=None, type=click.Path(exists=True, dir_okay=False),
              help="With --tls: the CA of every certificate (tls-ca-cert-file).")
@click.option("--cert", default=None, type=click.Path(exists=True, dir_okay=False),
              help="With --tls: the nodes' certificate (gen-certs' node.crt), also sent to join them.")
@click.option("--key", default=None, type=click.Path(exists=True, dir_okay=False), help="Private key of --cert.")
@click.option("--tls-base-port", default=None, type=click.IntRange(1, 65535),
              help="With --tls: tls-port of the first node; the others follow (default: base port + 1000).")
def cluster_create(count: int, base_port: int, secret: str | None, node_timeout: int | None, run_dir: str,
                   tls: bool, cacert: str | None, cert: str | None, key: str | None,
                   tls_base_port: int | None) -> None:  # fmt: skip
    """Start COUNT local node processes on consecutive ports and join them.

    Nodes run detached, in memory, bound to 127.0.0.1, each with its own
    directory RUN_DIR/node-<port>. Stop them with `scripts/cluster stop`
    or SHUTDOWN.

    \b
    Examples:
      disque-py cluster create --nodes 3
      disque-py cluster create --nodes 5 --base-port 8000 --secret "$(openssl rand -hex 16)"
      disque-py cluster create --tls --cacert tls/ca.crt --cert tls/node.crt --key tls/node.key

    With --tls each node keeps its plain port (its cluster bus follows it)
    and serves TLS on its tls-port, which the join uses.
    """
    from pathlib import Path

    from .devcluster import join_nodes, start_nodes

    import os

    ports = [base_port + i for i in range(count)]
    extra = ["--cluster-secret", secret] if secret else []
    if node_timeout:
        extra += ["--cluster-node-timeout", str(node_timeout)]
    conn: dict = {}
    tls_ports: list[int] = []
    if tls or cacert or cert or key:
        if not (cacert and cert and key):
            raise click.UsageError("--tls needs --cacert, --cert and --key (the nodes' own certificate)")
        first = tls_base_port or base_port + 1000
        tls_ports = [first + i for i in range(count)]
        if set(tls_ports) & set(ports) or tls_ports[-1] > 65535:
            raise click.BadParameter("the tls-ports %d-%d overlap the ports or pass 65535"
                                     % (tls_ports[0], tls_ports[-1]), param_hint="--tls-base-port")  # fmt: skip
        extra += ["--tls-cert-file", os.path.abspath(cert), "--tls-key-file", os.path.abspath(key),
                  "--tls-ca-cert-file", os.path.abspath(cacert)]  # fmt: skip
        conn = _connection(None, None, True, cacert, cert, key)
    per_node = {p: ["--tls-port", str(t)] for p, t in zip(ports, tls_ports)} if tls_ports else None
    start_nodes(ports, extra=extra, run_dir=Path(run_dir), per_node=per_node)
    seconds = join_nodes([("127.0.0.1", p) for p in (tls_ports or ports)], **conn)
    click.echo("%d node(s) on 127.0.0.1:%d-%d, full mesh after %.1f s" % (count, ports[0], ports[-1], seconds))
    if tls_ports:
        click.echo("TLS on 127.0.0.1:%d-%d" % (tls_ports[0], tls_ports[-1]))


def _tls_options(command):
    """--user and the TLS options of ``disque-py cli`` (same names), for the cluster commands."""
    for option in reversed([
        click.option("--user", "username", default=None, help="AUTH as this user (with --password)."),
        click.option("--tls", is_flag=True, help="Connect with TLS: ADDRESSES are the nodes' tls-ports."),
        click.option("--cacert", default=None, type=click.Path(dir_okay=False),
                     help="CA to check the nodes' certificates with (implies --tls)."),
        click.option("--cert", default=None, type=click.Path(dir_okay=False),
                     help="Client certificate, for nodes with tls-auth-clients (implies --tls)."),
        click.option("--key", default=None, type=click.Path(dir_okay=False), help="Private key of --cert."),
    ]):  # fmt: skip
        command = option(command)
    return command


def _connection(password: str | None, username: str | None, tls: bool, cacert: str | None, cert: str | None,
                key: str | None) -> dict:  # fmt: skip
    """Keyword arguments of the devcluster functions: credentials and a TLS context (or None)."""
    from .launcher import tls_context

    if username and password is None:
        raise click.BadParameter("--user needs --password", param_hint="--user")
    if key and not cert:
        raise click.BadParameter("--key needs --cert", param_hint="--key")
    context = None
    if tls or cacert or cert:
        try:
            context = tls_context(cacert, cert, key)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise click.ClickException("cannot load the TLS files: %s" % exc) from None
    return {"password": password, "username": username, "ssl_context": context}


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter("expected HOST:PORT, got %r" % address)
    return host, int(port)


@cluster.command("meet", context_settings=CONTEXT)
@click.argument("addresses", nargs=-1, required=True)
@click.option("-a", "--password", default=None, help="requirepass of the nodes.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for a full mesh.")
@_tls_options
def cluster_meet(addresses: tuple[str, ...], password: str | None, timeout: float, username: str | None, tls: bool,
                 cacert: str | None, cert: str | None, key: str | None) -> None:  # fmt: skip
    """Join running nodes: ADDRESSES are HOST:PORT client addresses.

    The first node meets every other one; gossip does the rest. Waits until
    every node knows all the others.

    \b
    Example:
      disque-py cluster meet 127.0.0.1:7711 127.0.0.1:7712 10.0.0.5:7711
      disque-py cluster meet --tls --cacert ca.crt 10.0.0.5:7711 10.0.0.6:7711
    """
    from .devcluster import join_nodes

    conn = _connection(password, username, tls, cacert, cert, key)
    parsed = [_host_port(address) for address in addresses]
    seconds = join_nodes(parsed, timeout=timeout, **conn)
    click.echo("%d node(s) joined, full mesh after %.1f s" % (len(parsed), seconds))


@cluster.command("forget", context_settings=CONTEXT)
@click.argument("node_id")
@click.argument("address")
@click.option("-a", "--password", default=None, help="requirepass of the nodes.")
@_tls_options
def cluster_forget(node_id: str, address: str, password: str | None, username: str | None, tls: bool,
                   cacert: str | None, cert: str | None, key: str | None) -> None:  # fmt: skip
    """Remove NODE_ID from the cluster: CLUSTER FORGET on every node ADDRESS knows.

    Use it for a node that is gone for good: a dead machine, or a node that
    lost its data (restarted empty, it comes back under a new ID, and the
    old one stays in every node table as failed). Every node must forget it
    within a minute, or gossip brings it back; this command asks them all,
    ADDRESS (a HOST:PORT client address of any live node) first.

    Acknowledged jobs that the forgotten node held stop waiting for its
    confirmation and are collected at their next GC attempt (from the
    third, about 6 s after the ACK), instead of staying until their TTL.

    \b
    Example:
      disque-py cluster forget 8499a2a6a7676039d0c963a877371a33cd6aeda4 127.0.0.1:7711
    """
    from .devcluster import FORGOT, UNKNOWN, forget_everywhere

    where = _host_port(address)
    if len(node_id) != 40:
        raise click.BadParameter("a node ID has 40 characters (CLUSTER NODES shows them)")
    results = forget_everywhere(node_id, where, **_connection(password, username, tls, cacert, cert, key))
    failed = forgot = 0
    for nid, addr, outcome in results:
        ok = outcome in (FORGOT, UNKNOWN)
        click.echo("%s %s: %s" % (nid, addr, outcome if ok else "FAILED: %s" % outcome))
        failed += not ok
        forgot += outcome == FORGOT
    if failed:
        raise click.ClickException("%d node(s) could not forget %s: run this again while they are up" % (failed, node_id))
    if not forgot:
        raise click.ClickException("no node knew %s: check the ID (CLUSTER NODES lists them)" % node_id)
    click.echo("%d of %d node(s) forgot %s" % (forgot, len(results), node_id))


@main.command("check-aof", context_settings=CONTEXT, short_help="Check an append-only file; --fix cuts a bad tail.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--fix", is_flag=True, help="Truncate the file at its first bad record (asks first).")
@click.option("--yes", "-y", is_flag=True, help="With --fix: do not ask for confirmation.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar (default: on a terminal, for files of 16 MB or more).")
def check_aof(file: str, fix: bool, yes: bool, progress: bool | None) -> None:
    """Check that every byte of the append-only FILE is a valid record.

    Reads FILE from start to end, as a node does when it loads it, and prints
    how many records of each kind it holds. Each record carries a CRC-32, so a
    damaged byte is found, not loaded as a wrong job. The check stops at the
    first problem and tells where it starts (byte offset) and why:

    \b
    - a truncated tail: the last record is incomplete (a write cut short by a
      crash or a power loss). A node with aof-load-truncated yes (the default)
      loads everything before it, so this alone needs no repair;
    - a corrupt record: damaged bytes (disk or copy errors, a file edited by
      hand). Nothing from there on can be loaded.

    Exit status: 0 the file is valid, 1 a problem was found (and not fixed),
    2 usage error or the file cannot be read. Without --fix nothing is written.

    --fix truncates FILE at the first bad record, so that it loads. Every
    record after that point is lost with it, including valid ones after a
    corrupt record in the middle, so the removed bytes are first copied to a
    new file next to it, named FILE.bad-OFFSET; then FILE is checked again. Stop the node
    using the file first (SHUTDOWN): a node still appending to it would
    write after the cut; the fix refuses if the file changed size since it was
    read. Keep a copy of the file if the jobs matter.

    \b
    Examples:
      disque-py check-aof /var/lib/disque/disque.aof
      disque-py check-aof --fix disque.aof
      disque-py check-aof --fix --yes disque.aof      (no prompt, for scripts)
    """
    from ..persistence.check import run

    sys.exit(run(file, fix=fix, yes=yes, progress=progress))


@main.command("gen-certs", context_settings=CONTEXT, short_help="Make a CA, node and client TLS certificates.")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--dns", multiple=True, default=("localhost",), show_default=True, metavar="NAME",
              help="A DNS name the nodes are reached at (repeat for several; replaces the default).")
@click.option("--ip", multiple=True, default=("127.0.0.1",), show_default=True, metavar="ADDRESS",
              help="An IP address the nodes are reached at (repeat for several; replaces the default).")
@click.option("--client-name", default="disque-client", show_default=True,
              help="Common name of the client certificate.")
@click.option("--days", default=365, show_default=True, type=click.IntRange(1, 36500),
              help="How many days the certificates are valid.")
@click.option("--key-type", default="ec", show_default=True, type=click.Choice(["ec", "rsa2048", "rsa3072"]),
              help="ec: NIST P-256 (small and fast); rsa2048 or rsa3072 for older clients.")
@click.option("--force", is_flag=True, help="Replace certificates and keys already in DIRECTORY.")
def gen_certs(directory: str, dns: tuple[str, ...], ip: tuple[str, ...], client_name: str, days: int,
              key_type: str, force: bool) -> None:  # fmt: skip
    """Make the certificates of a TLS cluster in DIRECTORY: a private CA, one node
    certificate for every node, and a client certificate.

    \b
    ca.crt, ca.key          the CA: every node and client trusts ca.crt;
                            ca.key signs new certificates, keep it safe
    node.crt, node.key      each node's certificate, for clients AND for the
                            cluster bus, where nodes authenticate each other
                            both ways (so it allows serverAuth and clientAuth)
    client.crt, client.key  for applications, when nodes require client certs

    Clients check the name or address they connect to against the node
    certificate: list every node's names with --dns and addresses with --ip.
    Keys are written readable by their owner only (0600). Existing files
    are never replaced without --force.

    \b
    Example, nodes on this machine and on 10.0.0.5 and 10.0.0.6:
      disque-py gen-certs ./tls --dns localhost --dns queue.internal \\
          --ip 127.0.0.1 --ip 10.0.0.5 --ip 10.0.0.6
    It prints the directives to put in each node's disque.conf (tls-port,
    tls-cert-file, tls-key-file, tls-ca-cert-file: the names Redis 6 uses)
    and how clients connect, e.g.
      redis-cli --tls --cacert tls/ca.crt --cert tls/client.crt \\
          --key tls/client.key -p 7711 PING
    """
    import os

    from .certs import CertError, make_bundle, write_bundle
    from ..config import DIRECTIVES

    try:
        bundle = make_bundle(dns=dns, ips=ip, client_name=client_name, days=days, key_type=key_type)
        paths = write_bundle(directory, bundle, force=force)
    except CertError as exc:
        raise click.ClickException(str(exc)) from None
    base = os.path.abspath(directory)
    after = bundle.node.cert.not_valid_after_utc.strftime("%Y-%m-%d")
    click.echo("Wrote in %s (valid until %s, %s keys):" % (base, after, key_type))
    for path in paths:
        click.echo("  %-11s %s" % (path.name, "0600 private key" if path.suffix == ".key" else "0644"))
    names = ", ".join(list(dns) + list(ip))
    click.echo("node.crt is valid for: %s" % names)
    click.echo("")
    click.echo("In each node's disque.conf (Redis 6 directive names):")
    click.echo("  port 0            # TLS only; or keep the plain port and give tls-port another one")
    click.echo("  tls-port 7711")
    click.echo("  tls-cert-file %s" % os.path.join(base, "node.crt"))
    click.echo("  tls-key-file %s" % os.path.join(base, "node.key"))
    click.echo("  tls-ca-cert-file %s" % os.path.join(base, "ca.crt"))
    click.echo("")
    click.echo("Clients:")
    click.echo("  redis-cli --tls --cacert %s --cert %s --key %s -p 7711 PING"
               % tuple(os.path.join(base, n) for n in ("ca.crt", "client.crt", "client.key")))  # fmt: skip
    click.echo("")
    click.echo("Copy ca.crt, node.crt and node.key to every node; keep ca.key elsewhere.")
    if "tls-port" not in DIRECTIVES:
        click.echo("Note: this version of disque-py does not read the tls-* directives yet; the files are "
                   "ready for when it does, and for TLS proxies in front of the nodes.")  # fmt: skip


@main.command("top", context_settings=CONTEXT, short_help="Live view of the cluster's queues, nodes and workers.")
@node_options()
@click.option("--no-discover", is_flag=True, help="Ask only the nodes given, not the nodes their HELLO lists.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds between two samples (the rates are per second over it).")
@click.option("--sort", "sort", default="length", show_default=True,
              type=click.Choice(["length", "in", "out", "blocked", "name"]), help="Queue column to sort by.")
@click.option("--reverse", is_flag=True, help="Reverse the sort (names Z-A, numbers smallest first).")
@click.option("--once", is_flag=True, help="Print one view (two samples --interval apart) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once (implied): print the data as JSON.")
@click.option("--limit", default=None, type=click.IntRange(1), help="Show at most this many queues.")
@click.option("--max-queues", default=10000, show_default=True, type=click.IntRange(1),
              help="Queues read per node per sample (QSCAN stops there; the view says so).")
@click.option("--all", "all_queues", is_flag=True,
              help="The cluster's own queues too (names starting with @, such as a task's result: QSCAN ... ALL).")
@click.option("--timeout", default=2.0, show_default=True, type=click.FloatRange(0.1, 60),
              help="Seconds to wait for a node before showing it unreachable.")
def top(conn: NodeOptions, no_discover: bool, interval: float, sort: str, reverse: bool, once: bool, as_json: bool,
        limit: int | None, max_queues: int, all_queues: bool, timeout: float) -> None:  # fmt: skip
    """Watch the queues and nodes of a cluster, refreshed every --interval seconds.

    Queues are found with QSCAN on every node and read with QSTAT; a queue
    held by several nodes is one row: LEN and BLOCKED are summed, IN/s and
    OUT/s are the jobs queued and taken per second (QSTAT's jobs-in and
    jobs-out counters between two samples, summed over the nodes). PAUSED is
    what any node pauses (`in*`: only some nodes do). NODES counts the nodes
    holding it. The cluster's own queues (names starting with @, such as a
    task's result) are left out unless --all. The node table shows each
    node's INFO (jobs, queues: the cluster's own counted, clients, ops/s,
    memory used/maxmemory), whether it answered, and its flags as the other
    nodes see it (pfail, fail, leaving). The worker table
    lists the live workers (WORKER LIST on every node): queues, concurrency,
    jobs running, done and failed, the last beat, and what runs now
    (`disque-py workers` lists every running job).

    \b
    Keys (on a terminal):  l length   i in/s   o out/s   b blocked
                           n name     r reverse the order   q quit (or Ctrl-C)

    \b
    Examples:
      disque-py top
      disque-py top --nodes 10.0.0.5:7711,10.0.0.6:7711 --sort in
      disque-py top --once --sort out --limit 20        (for scripts: after two samples)
      disque-py top --once --json | jq '.queues[] | {name, len, in_rate}'
      disque-py top --once --all --sort name            (task results too: @result:...)
      disque-py top --tls --cacert ca.crt --nodes db1:7712,db2:7712

    Exit status with --once: 0, or 1 when no node answered.
    """
    from . import top as toplib

    seeds = conn.addresses()
    once = once or as_json
    if not as_json:  # the tables are rich's; the JSON is not
        from ..util.extras import install_hint

        hint = install_hint("top", "disque-py top")
        if hint:
            click.echo("%s (or use --once --json)" % hint, err=True)
            sys.exit(1)
    with toplib.Collector(seeds, discover=not no_discover, password=conn.password, username=conn.username,
                          tls=conn.tls, cacert=conn.cacert, cert=conn.cert, key=conn.key, timeout=timeout,
                          max_queues=max_queues, all_queues=all_queues) as collector:  # fmt: skip
        if not once:
            toplib.run_live(collector, interval=interval, sort=sort, reverse=reverse, limit=limit)
            collector.close()
            # q or Ctrl-C quits at once: the terminal is restored, and the samplers' threads may be
            # waiting on a slow node (up to --timeout a request), which the interpreter's exit
            # would join first
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            view = toplib.run_once(collector, interval=interval, sort=sort, reverse=reverse, as_json=as_json,
                                   limit=limit, out=sys.stdout)  # fmt: skip
        except KeyboardInterrupt:
            sys.exit(130)
    if not any(n.reachable for n in view.nodes):
        click.echo("no node answered (%s)" % ", ".join(n.address for n in view.nodes), err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
