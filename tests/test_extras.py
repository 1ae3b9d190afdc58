"""`pip install disque-py` without its extras: the client, the worker and a node work; the admin
port and top's tables say which extra they need.

Each check runs in a fresh interpreter whose `sitecustomize` refuses to import the extras'
modules (hypercorn, starlette, prometheus_client, rich, opentelemetry), as an interpreter where they were
never installed would: importing one raises ModuleNotFoundError. python-json-logger (log-format
json, a small pure-Python library) stays a dependency of every install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disque_py.cli import launcher
from disque_py.util.extras import EXTRAS

from .integration.conftest import free_port

pytestmark = pytest.mark.integration

BLOCKED = sorted({m for mods in EXTRAS.values() for m in mods})

SITECUSTOMIZE = '''
import sys

BLOCKED = frozenset(%r)


class _NotInstalled:
    """Refuses the optional dependencies, as an interpreter without them would."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError("No module named %%r (refused by the test)" %% name, name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
''' % (BLOCKED,)


@pytest.fixture
def bare_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an interpreter without the extras (a sitecustomize on its path)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_the_blocker_refuses_what_it_should(bare_env):
    # Without this, a green run below would prove nothing.
    for name in BLOCKED:
        out = run(bare_env, "-c", "import %s" % name)
        assert out.returncode == 1 and "ModuleNotFoundError" in out.stderr and "refused by the test" in out.stderr


def test_the_client_worker_and_cli_import_without_the_http_stack(bare_env):
    code = """
import sys
import disque_py.client, disque_py.client.aio, disque_py.cli.worker
from disque_py import Client, Worker, Job, DisqueError
import disque_py.cli, disque_py.cli.app, disque_py.cli.top
import disque_py.tasks, disque_py.tasks.tracing
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in %r)
print("loaded:", loaded)
""" % (BLOCKED,)
    out = run(bare_env, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "loaded: []"


def test_a_node_without_the_extras_serves_jobs_logs_json_and_top_json(bare_env, tmp_path):
    port = free_port()
    logfile = tmp_path / "node.log"
    argv = launcher.node_argv(port, tmp_path, "--log-format", "json", "--logfile", str(logfile))
    proc = launcher.spawn(argv, output=tmp_path / "node.out", env=bare_env)
    try:
        launcher.wait_ready(proc, port, logs=[logfile, tmp_path / "node.out"])
        code = """
from disque_py import Client
client = Client("127.0.0.1:%d")
job_id = client.add_job("q", b"body", timeout_ms=5000)
job = client.get_job("q", timeout_ms=5000)
assert job is not None and job.id == job_id and job.body == b"body", job
assert client.ack(job.id) == 1
client.close()
print("ok")
""" % port
        out = run(bare_env, "-c", code)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
        # top's JSON needs no rich
        out = run(bare_env, "-m", "disque_py.cli", "top", "--nodes", "127.0.0.1:%d" % port, "--once", "--json",
                  "--interval", "0.1")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert [n["address"] for n in json.loads(out.stdout)["nodes"]] == ["127.0.0.1:%d" % port]
        lines = logfile.read_text().splitlines()
        assert any(json.loads(line)["message"].startswith("Ready to accept connections") for line in lines)
    finally:
        result = launcher.stop(proc, port=port)
    assert not result.forced, result
    assert "Traceback" not in (tmp_path / "node.out").read_text()


def test_a_node_with_an_admin_port_and_no_admin_extra_says_which_extra_and_exits(bare_env, tmp_path):
    port = free_port()
    out = run(bare_env, "-m", "disque_py.cli", "server", "--port", str(port), "--dir", str(tmp_path),
              "--admin-port", str(free_port()), timeout=20)  # fmt: skip
    assert out.returncode == 1
    assert "disque-py[admin]" in out.stderr and "hypercorn" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert not launcher.ping(port)  # it never listened


def test_top_tables_without_rich_say_which_extra_and_exit(bare_env):
    out = run(bare_env, "-m", "disque_py.cli", "top", "--nodes", "127.0.0.1:1", "--once", timeout=20)
    assert out.returncode == 1
    assert "disque-py[top]" in out.stderr and "rich" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
