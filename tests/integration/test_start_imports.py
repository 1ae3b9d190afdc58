"""What a node imports before its first PONG: nothing that its configuration does not use.

A restart is when every millisecond counts (clients wait, jobs held elsewhere come due), so the
start loads only what serving needs: no client library or redis-py, no other CLI command and no
click (``disque-py server`` parses its own arguments), no HTTP stack without ``admin-port``, no
python-json-logger without ``log-format json``, no AOF codec without an AOF to load, no
``cryptography`` before a link authenticates with ``cluster-secret``, no ``shutil``, ``bz2``,
``lzma`` or ``tempfile`` (the standard ``ctypes.util`` imports them; trio is given a stand-in). Each check starts a real node with the server's own entry (the
``disque-py`` console script, and ``python -m disque_py.cli``) under ``PYTHONPROFILEIMPORTTIME``,
waits for its first PONG, kills it with SIGKILL (so that nothing of a shutdown is counted) and reads
the modules it had imported from its stderr. What is measured is which modules load, never how long.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from disque_py.cli import launcher

from .conftest import free_port, wait_for

pytestmark = pytest.mark.integration

#: The admin page's HTTP stack: loaded at the admin port's first connection, not at start.
HTTP_STACK = ("disque_py.web", "hypercorn", "starlette", "prometheus_client")

#: Never loaded by a node started with the defaults (a module or any of its submodules).
NOT_AT_START = (
    "redis",  # redis-py: the client side only
    "disque_py.client",
    "disque_py.cli.app",  # the click command line: every command but `server` (cli/server.py)
    "click",
    "cryptography",  # the bus's HMAC and HKDF: only once a link authenticates (cluster-secret)
    "disque_py.cli.dead",
    "disque_py.client.deadletters",
    "disque_py.cli.shell",
    "disque_py.cli.top",
    "disque_py.tasks",
    "disque_py.cli.devcluster",
    "disque_py.cli.certs",
    "disque_py.persistence.loader",  # the AOF machinery: only with an AOF
    "disque_py.persistence.journal",
    "disque_py.persistence.records",
    "disque_py.persistence.check",
    "disque_py.server.commanddocs",  # COMMAND DOCS' tables: made at its first use
    "disque_py.web",  # the admin HTTP port: only with admin-port
    "disque_py.server.web",
    "hypercorn",
    "starlette",
    "prometheus_client",
    "pythonjsonlogger",  # only with log-format json
    "rich",
    "pytest",
    # the standard ctypes.util and what it imports: trio reads only find_library("pthread") from it,
    # answered by util/quickimport.py's stand-in; tempfile only for CONFIG REWRITE
    "ctypes.util",
    "shutil",
    "bz2",
    "lzma",
    "tempfile",
)


def _imported(out: Path) -> set[str]:
    """The modules the import report in ``out`` names so far."""
    names = set()
    for line in out.read_text().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    names.discard("imported package")  # the header line
    return names


def _start_reporting(tmp_path: Path, *extra: str, script: bool) -> tuple[subprocess.Popen, int, Path]:
    """A node started with the import report on, once it answers PING: (process, port, report file)."""
    port = free_port()
    out = tmp_path / ("node-%d.out" % port)
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    proc = launcher.spawn(launcher.node_argv(port, tmp_path, *extra, script=script), output=out, env=env)
    try:
        launcher.wait_ready(proc, port, logs=[out])
    except BaseException:
        _kill(proc)
        raise
    return proc, port, out


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _started_imports(tmp_path: Path, *extra: str, script: bool) -> set[str]:
    proc, _port, out = _start_reporting(tmp_path, *extra, script=script)
    _kill(proc)
    return _imported(out)


def _loaded(names: set[str], module: str) -> list[str]:
    return sorted(n for n in names if n == module or n.startswith(module + "."))


@pytest.mark.parametrize("script", [True, False], ids=["console-script", "python-m"])
def test_a_default_node_answers_without_loading_what_it_does_not_use(tmp_path: Path, script: bool) -> None:
    names = _started_imports(tmp_path, script=script)
    # the report is read right: what a node needs is in it
    assert {"trio", "disque_py.server.app", "disque_py.core.node", "cluster_bus.links"} <= names
    unexpected = {m: _loaded(names, m) for m in NOT_AT_START if _loaded(names, m)}
    assert unexpected == {}


def test_what_a_setting_needs_is_loaded_when_it_is_set(tmp_path: Path) -> None:
    # The other side of the test above: the same report sees these modules when they are used.
    (tmp_path / "disque.aof").write_bytes(b"")  # an AOF to load (empty: no jobs)
    names = _started_imports(tmp_path, "--appendonly", "yes", "--log-format", "json", script=True)
    assert _loaded(names, "pythonjsonlogger")
    assert _loaded(names, "disque_py.persistence.loader")
    assert not _loaded(names, "redis") and not _loaded(names, "disque_py.client")


def test_an_admin_port_is_bound_at_start_and_loads_its_http_stack_at_its_first_request(tmp_path: Path) -> None:
    # as scripts/cluster starts a node: an admin page, a log file, a pid file
    admin = free_port()
    proc, _port, out = _start_reporting(tmp_path, "--admin-port", str(admin), "--logfile", str(tmp_path / "log"),
                                        "--pidfile", str(tmp_path / "pid"), script=True)  # fmt: skip
    try:
        names = _imported(out)
        assert "disque_py.server.web" in names  # the port is the node's from the start ...
        assert {m: _loaded(names, m) for m in HTTP_STACK if _loaded(names, m)} == {}  # ... its HTTP stack is not
        with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % admin, timeout=30) as reply:
            assert reply.status == 200
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=30) as reply:
            assert b"disque_" in reply.read()
        wait_for(lambda: all(_loaded(_imported(out), m) for m in HTTP_STACK), what="the HTTP stack in the report")
    finally:
        _kill(proc)


def test_an_http_stack_that_fails_to_load_closes_the_connection_and_the_node_serves_on(tmp_path: Path) -> None:
    # starlette found at start (the CLI's check) but broken at the first request
    shadow = tmp_path / "shadow" / "starlette"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('starlette is broken here')\n")
    admin, port = free_port(), free_port()
    log = tmp_path / "log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]))
    argv = launcher.node_argv(port, tmp_path, "--admin-port", str(admin), "--logfile", str(log), script=True)
    proc = launcher.spawn(argv, output=tmp_path / "out", env=env)
    try:
        launcher.wait_ready(proc, port, logs=[tmp_path / "out", log])
        for _ in range(3):
            with pytest.raises((urllib.error.URLError, ConnectionError), match="reset|closed|without response"):
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % admin, timeout=30)
        assert launcher.ping(port)
        assert log.read_text().count("admin port: cannot load the HTTP stack: starlette is broken here") == 1
    finally:
        _kill(proc)
