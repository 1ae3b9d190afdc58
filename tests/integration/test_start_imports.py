"""What a node imports before its first PONG: nothing that its configuration does not use.

A restart is when every millisecond counts (clients wait, jobs held elsewhere come due), so the
start loads only what serving needs: no client library or redis-py, no other CLI command and no
click (``disque-py server`` parses its own arguments), no HTTP stack without ``admin-port``, no
python-json-logger without ``log-format json``, no AOF codec without an AOF to load, no
``cryptography`` before a link authenticates with ``cluster-secret``. Each check starts a real node with the server's own entry (the
``disque-py`` console script, and ``python -m disque_py.cli``) under ``PYTHONPROFILEIMPORTTIME``,
waits for its first PONG, kills it with SIGKILL (so that nothing of a shutdown is counted) and reads
the modules it had imported from its stderr. What is measured is which modules load, never how long.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from disque_py.cli import launcher

from .conftest import free_port

pytestmark = pytest.mark.integration

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
    "disque_py.web",  # the admin HTTP port: only with admin-port
    "disque_py.server.web",
    "hypercorn",
    "starlette",
    "prometheus_client",
    "pythonjsonlogger",  # only with log-format json
    "rich",
    "pytest",
)


def _started_imports(tmp_path: Path, *extra: str, script: bool) -> set[str]:
    port = free_port()
    out = tmp_path / ("node-%d.out" % port)
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    proc = launcher.spawn(launcher.node_argv(port, tmp_path, *extra, script=script), output=out, env=env)
    try:
        launcher.wait_ready(proc, port, logs=[out])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    names = set()
    for line in out.read_text().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    names.discard("imported package")  # the header line
    return names


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
