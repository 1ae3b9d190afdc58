"""The tools over TLS and as a named user, on real node processes: the launcher's RESP helpers
with an SSL context, ``disque-py cluster meet|forget --tls`` joining nodes reached only at their
tls-ports, and the sync and trio clients authenticating as a user (AUTH username password)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner

from disque_py.cli import launcher
from disque_py.cli.app import main as cli_main
from disque_py.client.aio import Client as AioClient
from disque_py.client.errors import AuthError
from disque_py.client.sync import Client

from .conftest import consecutive_free_ports, fail_unclean, free_port, unclean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import Certs, make_certs  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def start_tls(start_node, certs: Certs, **extra):
    node = start_node(
        tls_port=free_port(), tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key),
        tls_ca_cert_file=str(certs.ca), **extra,
    )  # fmt: skip
    node.tls_port = int(node.directives["tls_port"])
    return node


def tls_args(certs: Certs) -> list[str]:
    return ["--tls", "--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key)]


def test_launcher_speaks_tls_with_a_context(start_node, certs):
    node = start_tls(start_node, certs, requirepass="pw")
    ctx = launcher.tls_context(certs.ca, certs.client_cert, certs.client_key)
    assert launcher.ping(node.tls_port, ssl_context=ctx, timeout=5)
    assert not launcher.ping(node.tls_port, timeout=2)  # plain on the TLS port: no PONG
    assert not launcher.ping(node.tls_port, ssl_context=launcher.tls_context(certs.other_ca), timeout=5)
    launcher.wait_ready(None, node.tls_port, ssl_context=ctx, timeout=10)
    assert launcher.call(node.tls_port, "PING", password="pw", ssl_context=ctx) == b"PONG"
    with pytest.raises(launcher.ReplyError, match="^NOAUTH "):
        launcher.call(node.tls_port, "CLUSTER", "INFO", ssl_context=ctx)  # NOAUTH without the password
    # the default stays plain TCP on the plain port
    assert launcher.call(node.port, "PING", password="pw") == b"PONG"
    assert launcher.announced_port("127.0.0.1", node.tls_port, password="pw", ssl_context=ctx) == node.port


def test_cluster_meet_and_forget_over_tls(start_node, certs):
    a = start_tls(start_node, certs)
    b = start_tls(start_node, certs)
    runner = CliRunner()
    result = runner.invoke(cli_main, ["cluster", "meet", *tls_args(certs), "--timeout", "30",
                                      "127.0.0.1:%d" % a.tls_port, "127.0.0.1:%d" % b.tls_port])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 node(s) joined" in result.output
    for node in (a, b):
        assert int(node.client().execute_command("CLUSTER", "INFO").decode().split("cluster_reachable_nodes:")[1]
                   .split()[0]) == 1  # fmt: skip
    # without the client certificate, a node that requires one refuses the join
    result = runner.invoke(cli_main, ["cluster", "meet", "--tls", "--cacert", str(certs.ca), "--timeout", "2",
                                      "127.0.0.1:%d" % a.tls_port, "127.0.0.1:%d" % b.tls_port])  # fmt: skip
    assert result.exit_code != 0
    # forget b, asking a over TLS: a forgets it (b, listed at its plain port, cannot be reached over TLS)
    b_id = b.client().execute_command("CLUSTER", "MYID").decode()
    result = runner.invoke(cli_main, ["cluster", "forget", *tls_args(certs), b_id, "127.0.0.1:%d" % a.tls_port])
    assert "forgot it" in result.output, result.output
    assert b_id not in a.client().execute_command("CLUSTER", "NODES").decode()


def test_cluster_meet_user_options_are_checked(certs):
    result = CliRunner().invoke(cli_main, ["cluster", "meet", "--user", "alice", "127.0.0.1:1", "127.0.0.1:2"])
    assert result.exit_code != 0 and "--user needs --password" in result.output
    result = CliRunner().invoke(cli_main, ["cluster", "meet", "--tls", "--cacert", str(certs.dir / "missing.crt"),
                                           "127.0.0.1:1", "127.0.0.1:2"])  # fmt: skip
    assert result.exit_code != 0 and "cannot load the TLS files" in result.output


USER = ("alice", "on", ">alicepw", "allkeys", "+@all")


def test_sync_client_as_a_named_user(start_node):
    node = start_node(user=USER, requirepass="defaultpw")
    with Client("127.0.0.1:%d" % node.port, username="alice", password="alicepw") as c:
        job_id = c.add_job("q", b"as alice")
        assert c.execute("ACL", "WHOAMI") in (b"alice", "alice")
        assert c.ack(job_id) == 1
        assert c.config.kwargs()["username"] == "alice"
    with Client("redis://alice:alicepw@127.0.0.1:%d" % node.port) as c:  # the URL's user
        assert c.config.username == "alice"
        assert c.add_job("q", b"url").startswith("D-")
    with pytest.raises(AuthError, match="^WRONGPASS "):
        with Client("127.0.0.1:%d" % node.port, username="alice", password="defaultpw", failover_timeout=1) as c:
            c.add_job("q", b"wrong")
    with Client("127.0.0.1:%d" % node.port, password="defaultpw") as c:  # no username: the default user
        assert c.add_job("q", b"default").startswith("D-")


def test_trio_client_as_a_named_user(start_node):
    node = start_node(user=USER, requirepass="defaultpw")

    async def main() -> None:
        async with AioClient("127.0.0.1:%d" % node.port, username="alice", password="alicepw") as c:
            job_id = await c.add_job("q", b"trio alice")
            assert await c.execute("ACL", "WHOAMI") in (b"alice", "alice")
            assert await c.ack(job_id) == 1
        with pytest.raises(AuthError, match="^WRONGPASS "):
            async with AioClient("127.0.0.1:%d" % node.port, username="alice", password="nope",
                                 failover_timeout=1) as c:  # fmt: skip
                await c.add_job("q", b"wrong")

    trio.run(main)


def test_named_user_over_tls(start_node, certs):
    node = start_tls(start_node, certs, user=USER, requirepass="defaultpw")
    kw = dict(ssl_ca_certs=str(certs.ca), ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key))
    with Client("rediss://127.0.0.1:%d" % node.tls_port, username="alice", password="alicepw", **kw) as c:
        assert c.add_job("q", b"tls alice").startswith("D-")
        assert c.execute("ACL", "WHOAMI") in (b"alice", "alice")


def test_cluster_create_with_tls(tmp_path, certs):
    base = consecutive_free_ports(2)
    tls_base = consecutive_free_ports(2)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "disque_py.cli", "cluster", "create", "--nodes", "2", "--base-port", str(base),
            "--dir", str(run), "--tls", "--cacert", str(certs.ca), "--cert", str(certs.server_cert),
            "--key", str(certs.server_key), "--tls-base-port", str(tls_base)]  # fmt: skip
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "TLS on 127.0.0.1:%d-%d" % (tls_base, tls_base + 1) in out.stdout
        ctx = launcher.tls_context(certs.ca, certs.client_cert, certs.client_key)
        for tls_port in (tls_base, tls_base + 1):
            info = launcher.call(tls_port, "CLUSTER", "INFO", ssl_context=ctx).decode()
            assert "cluster_reachable_nodes:1" in info
    finally:
        problems = []
        for port in (base, base + 1):
            try:
                pid = int((run / ("node-%d" % port) / "disque.pid").read_text())
            except (OSError, ValueError):
                continue
            problems.append(unclean("node on port %d" % port, launcher.stop(pid, port=port)))
        fail_unclean(problems)


def test_cluster_create_tls_needs_the_files():
    result = CliRunner().invoke(cli_main, ["cluster", "create", "--tls", "--nodes", "1"])
    assert result.exit_code != 0 and "--tls needs --cacert, --cert and --key" in result.output
