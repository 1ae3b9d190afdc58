"""The ``disque-py`` command line.

    disque-py server [disque.conf] [--port 7712 --loglevel verbose ...]
    disque-py cli [-h HOST] [-p PORT] [-a PASSWORD] [COMMAND ARGS...]
"""

from __future__ import annotations

import shlex
import sys

import click

from . import __version__

CONTEXT = {"help_option_names": ["--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
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
    import trio

    from .config import ConfigError, load_config
    from .server.app import run_node
    from .server.logs import setup_logging

    path = None
    rest = list(args)
    if rest and not rest[0].startswith("--"):
        path = rest.pop(0)
    try:
        cfg = load_config(path, rest)
    except ConfigError as exc:
        click.echo("*** FATAL CONFIG FILE ERROR ***\n%s" % exc, err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo("Fatal error, can't open config file '%s': %s" % (path, exc.strerror), err=True)
        sys.exit(1)
    setup_logging(cfg.resolve_path(cfg.logfile) if cfg.logfile else "", cfg.loglevel)
    try:
        trio.run(run_node, cfg)
    except KeyboardInterrupt:
        pass


def _format_reply(value, indent: int = 0) -> str:
    """redis-cli style rendering."""
    import redis

    pad = " " * indent
    if isinstance(value, redis.ResponseError):
        return "(error) %s" % value
    if value is None:
        return "(nil)"
    if isinstance(value, int):
        return "(integer) %d" % value
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
        return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    if isinstance(value, (list, tuple)):
        if not value:
            return "(empty array)"
        width = len(str(len(value)))
        lines = []
        for i, item in enumerate(value, 1):
            prefix = "%*d) " % (width, i)
            body = _format_reply(item, indent + len(prefix))
            lines.append((pad if i > 1 else "") + prefix + body)
        return "\n".join(lines)
    return str(value)


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True}, short_help="Send commands to a node.")
@click.option("-h", "--host", default="127.0.0.1", show_default=True, help="Node address.")
@click.option("-p", "--port", default=7711, show_default=True, help="Node client port.")
@click.option("-a", "--password", default=None, help="Password (requirepass) to AUTH with.")
@click.option("--raw", is_flag=True, help="Print replies raw, one item per line (for scripts).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def cli(host: str, port: int, password: str | None, raw: bool, command: tuple[str, ...]) -> None:
    """Send one COMMAND to a node and print the reply, or start a prompt.

    \b
    Examples:
      disque-py cli ADDJOB myqueue "hello world" 0
      disque-py cli -p 7712 GETJOB TIMEOUT 1000 FROM myqueue
      disque-py cli INFO jobs
      disque-py cli            (interactive; 'quit' or Ctrl-D to leave)
    """
    import redis

    conn = redis.Redis(host=host, port=port, password=password, socket_connect_timeout=3)

    def run(argv: list[str]) -> int:
        try:
            reply = conn.execute_command(*argv)
        except redis.ResponseError as exc:
            reply = exc
        except redis.ConnectionError as exc:
            click.echo("Could not connect to disque-py at %s:%d: %s" % (host, port, exc), err=True)
            return 1
        if raw:
            click.echo(_format_raw(reply))
        else:
            click.echo(_format_reply(reply))
        return 2 if isinstance(reply, redis.ResponseError) else 0

    if command:
        sys.exit(run(list(command)))
    while True:
        try:
            line = input("%s:%d> " % (host, port))
        except EOFError:
            click.echo()
            return
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            click.echo("Invalid argument(s): %s" % exc)
            continue
        if not argv:
            continue
        if argv[0].lower() in ("quit", "exit"):
            return
        run(argv)


def _format_raw(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (list, tuple)):
        return "\n".join(_format_raw(v) for v in value)
    return str(value)


if __name__ == "__main__":  # pragma: no cover
    main()
