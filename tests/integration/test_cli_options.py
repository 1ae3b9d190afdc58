"""One set of options on every program that talks to nodes (disque_py/cli/options.py):
`-h HOST -p PORT`, `-n/--nodes LIST` and `$DISQUE_NODES` name the nodes of `cli`, `worker`,
`dead`, `top` and `workers` alike; `-a/--password`, `$DISQUE_PASSWORD` and `--user` log each of
them in; `--tls --cacert --cert --key` take each of them to a node's tls-port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from disque_py.cli.options import DEFAULT_NODE, resolve

from .conftest import ROOT, wait_for
from .test_tls import certs, start_tls  # noqa: F401  (the module's certificates fixture)

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------ which nodes
def test_the_nodes_come_from_the_words_then_the_environment_then_the_default():
    env = {"DISQUE_NODES": "10.0.0.9:7711,10.0.0.8:7711"}
    assert resolve(None, None, (), {}) == ((DEFAULT_NODE,), "default")
    assert resolve(None, None, (), env) == (("10.0.0.9:7711", "10.0.0.8:7711"), "$DISQUE_NODES")
    assert resolve(None, 7712, (), env) == (("127.0.0.1:7712",), "-h/-p")  # -p alone: this host's port
    assert resolve("db1", None, (), env) == (("db1:7711",), "-h/-p")
    assert resolve("::1", 7712, (), {}) == (("[::1]:7712",), "-h/-p")
    assert resolve(None, None, ("a:1,b:2", "c:3 a:1"), env) == (("a:1", "b:2", "c:3"), "--nodes")
    assert resolve("h", 9, ("a:1",), env) == (("h:9", "a:1"), "--nodes")  # both: that node first


def run(*args: str, env_nodes: str | None = None, env_password: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("DISQUE_NODES", "DISQUE_PASSWORD")}
    if env_nodes is not None:
        env["DISQUE_NODES"] = env_nodes
    if env_password is not None:
        env["DISQUE_PASSWORD"] = env_password
    return subprocess.run([sys.executable, "-m", "disque_py.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)  # fmt: skip


def ways(port: int) -> list[tuple[list[str], str | None]]:
    """Each way of naming the node: (arguments, $DISQUE_NODES)."""
    return [
        (["-h", "127.0.0.1", "-p", str(port)], None),
        (["-p", str(port)], None),
        (["-n", "127.0.0.1:%d" % port], None),
        (["--nodes", "127.0.0.1:%d" % port], "127.0.0.1:1"),  # the words win over the environment
        ([], "127.0.0.1:%d" % port),
    ]


def test_cli_dead_top_and_workers_take_the_same_words(node):
    node.client().execute_command("ADDJOB", "opts-q", "x", 0)
    node.client().execute_command("WORKER", "BEAT", "opts-worker", 60000, '{"queues": ["opts-q"]}')
    for words, env in ways(node.port):
        out = run("cli", *words, "QLEN", "opts-q", env_nodes=env)
        assert (out.returncode, out.stdout.strip()) == (0, "1"), (words, env, out.stderr)
        out = run("dead", "list", *words, "--json", env_nodes=env)
        assert (out.returncode, json.loads(out.stdout)) == (0, []), (words, env, out.stderr)
        out = run("top", *words, "--once", "--json", "--interval", "0.1", env_nodes=env)
        assert out.returncode == 0, (words, env, out.stderr)
        view = json.loads(out.stdout)
        assert [q["len"] for q in view["queues"] if q["name"] == "opts-q"] == [1], (words, env)
        out = run("workers", *words, "--json", env_nodes=env)
        assert out.returncode == 0, (words, env, out.stderr)
        assert [w["id"] for w in json.loads(out.stdout)["workers"]] == ["opts-worker"], (words, env)


def test_a_node_that_is_not_there_is_named_by_the_words_that_gave_it(node):
    out = run("dead", "list", "-n", "127.0.0.1:notaport")
    assert out.returncode == 2 and "--nodes" in out.stderr
    out = run("top", "--once", "--json", env_nodes="127.0.0.1:x")
    assert out.returncode == 2 and "$DISQUE_NODES" in out.stderr
    out = run("cli", "--user", "u", "PING")
    assert out.returncode == 2 and "--user needs --password" in out.stderr


def asking(program: str, *words: str) -> list[str]:
    """``program``'s arguments to ask its nodes something once, with the shared ``words``."""
    return {"cli": ["cli", *words, "ACL", "WHOAMI"], "dead": ["dead", "list", *words, "--json"],
            "top": ["top", *words, "--once", "--json", "--interval", "0.1"],
            "workers": ["workers", *words, "--json"]}[program]  # fmt: skip


USER = ("alice", "on", ">alicepw", "allkeys", "+@all")
#: Each way of logging in: (arguments, $DISQUE_PASSWORD). alice's password is not the default
#: user's, so that her logins pass only as AUTH alice alicepw.
LOGINS = [
    (["-a", "defaultpw"], None),
    (["--password", "defaultpw"], None),
    ([], "defaultpw"),
    (["--user", "alice", "-a", "alicepw"], None),
    (["--user", "alice"], "alicepw"),
    (["-a", "defaultpw"], "nope"),  # the words win over the environment
]


@pytest.mark.parametrize("program", ["cli", "dead", "top", "workers"])
def test_every_program_logs_in_alike(start_node, program):
    node = start_node(requirepass="defaultpw", user=USER)
    port = ["-p", str(node.port)]
    for words, env in LOGINS:
        out = run(*asking(program, *port, *words), env_password=env)
        assert out.returncode == 0, (words, env, out.stdout, out.stderr)
        if program == "cli":
            assert out.stdout == ("alice\n" if "--user" in words else "default\n"), (words, env)
    for words, refusal in ((["-a", "nope"], "invalid password"), ([], "NOAUTH"),
                           (["--user", "alice", "-a", "defaultpw"], "WRONGPASS")):  # fmt: skip
        out = run(*asking(program, *port, *words))
        assert out.returncode != 0 and refusal in out.stdout + out.stderr, (words, out.stdout, out.stderr)


@pytest.mark.parametrize("program", ["cli", "dead", "top", "workers"])
def test_every_program_speaks_tls_alike(start_node, certs, program):  # noqa: F811
    node = start_tls(start_node, certs)  # the node asks for a client certificate
    files = ["--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key)]
    for words in (["-p", str(node.tls_port), "--tls", *files], ["-n", "127.0.0.1:%d" % node.tls_port, *files]):
        out = run(*asking(program, *words))  # a CA or a certificate implies --tls
        assert out.returncode == 0, (words, out.stdout, out.stderr)
    out = run(*asking(program, "-p", str(node.tls_port), "--tls", "--cacert", str(certs.ca)))
    assert out.returncode != 0, out  # no client certificate: refused
    out = run(*asking(program, "-p", str(node.port), "--tls", *files))
    assert out.returncode != 0 and re.search("TLS|SSL", out.stdout + out.stderr), out  # TLS to the plain port


HANDLER = """
import os
import re
def handle(job):
    with open(os.environ["OPTS_DONE"], "a") as f:
        f.write(job.body.decode() + "\\n")
"""


def start_worker(tmp_path, *words: str, env_nodes: str | None = None, extra_env: dict | None = None):
    (tmp_path / "optshandler.py").write_text(textwrap.dedent(HANDLER))
    env = {k: v for k, v in os.environ.items() if k not in ("DISQUE_NODES", "DISQUE_PASSWORD")}
    env.update(PYTHONPATH=str(tmp_path) + os.pathsep + str(ROOT), OPTS_DONE=str(tmp_path / "done.txt"),
               **(extra_env or {}))  # fmt: skip
    if env_nodes is not None:
        env["DISQUE_NODES"] = env_nodes
    return subprocess.Popen([sys.executable, "-m", "disque_py.cli", "worker", "optshandler:handle", "-q", "opts-w",
                             *words], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def stop_worker(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail("the worker did not stop on SIGTERM: %s" % err)
    assert proc.returncode == 0, err
    return err


def done(tmp_path) -> list[str]:
    path = tmp_path / "done.txt"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("how", ["-h/-p", "-n", "env"])
def test_the_worker_takes_the_same_words(node, tmp_path, how):
    words, env = {"-h/-p": (["-h", "127.0.0.1", "-p", str(node.port)], None),
                  "-n": (["-n", "127.0.0.1:%d" % node.port], None),
                  "env": ([], "127.0.0.1:%d" % node.port)}[how]  # fmt: skip
    proc = start_worker(tmp_path, *words, env_nodes=env)
    try:
        node.client().execute_command("ADDJOB", "opts-w", "job-" + how.replace("/", ""), 0)
        wait_for(lambda: done(tmp_path), timeout=30, what="the job handled")
    finally:
        err = stop_worker(proc)
    assert done(tmp_path) == ["job-" + how.replace("/", "")]
    assert "from 127.0.0.1:%d" % node.port in err


def test_the_worker_logs_in_as_a_user_with_the_password_from_the_environment(start_node, tmp_path):
    node = start_node(requirepass="defaultpw", user=USER)
    proc = start_worker(tmp_path, "-p", str(node.port), "--user", "alice", extra_env={"DISQUE_PASSWORD": "alicepw"})
    try:
        node.client(password="defaultpw").execute_command("ADDJOB", "opts-w", "as-alice", 0)
        wait_for(lambda: done(tmp_path), timeout=30, what="the job handled")
    finally:
        stop_worker(proc)
    assert done(tmp_path) == ["as-alice"]


def test_the_worker_runs_over_tls(start_node, certs, tmp_path):  # noqa: F811
    node = start_tls(start_node, certs)
    proc = start_worker(tmp_path, "-p", str(node.tls_port), "--tls", "--cacert", str(certs.ca), "--cert",
                        str(certs.client_cert), "--key", str(certs.client_key))  # the node asks for a client certificate
    try:
        node.client().execute_command("ADDJOB", "opts-w", "over-tls", 0)
        wait_for(lambda: done(tmp_path), timeout=30, what="the job handled over TLS")
    finally:
        err = stop_worker(proc)
    assert done(tmp_path) == ["over-tls"]
    assert "worker stopped: processed=1" in err


TASKS = """
from disque_py.tasks import App
app = App("127.0.0.1:1")

@app.task
def add(a, b):
    return a + b
"""


def test_a_task_named_instead_of_its_app_is_told_to_run_the_app(tmp_path):
    (tmp_path / "optstasks.py").write_text(TASKS)
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + str(ROOT))
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "worker", "optstasks:add"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "optstasks:add is the task 'optstasks.add' of an app, not a handler" in out.stderr
    assert "disque-py worker optstasks:app" in out.stderr
