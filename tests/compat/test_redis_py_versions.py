"""Older redis-py releases against a real node.

The test suite's own redis-py is the newest (RESP3 handshake with HELLO 3);
this installs redis-py 5.0 and 6.x (RESP2, CLIENT SETINFO on connect) into a
temporary directory and runs a small script with each, in a subprocess so the
versions never mix. Skipped, with the reason, when the package registry
cannot be reached.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.integration.conftest import NodeProcess

SCRIPT = textwrap.dedent(
    """
    import sys, redis
    port = int(sys.argv[1])
    r = redis.Redis(port=port, client_name="compat")
    assert r.ping()
    jid = r.execute_command("ADDJOB", "compat", b"\\x00body", 0, "RETRY", 5)
    assert len(jid) == 40, jid
    assert r.execute_command("GETJOB", "TIMEOUT", 500, "WITHCOUNTERS", "FROM", "compat") == [
        [b"compat", jid, b"\\x00body", b"nacks", 0, b"additional-deliveries", 0]
    ]
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "compat") is None
    assert r.execute_command("ACKJOB", jid) == 1
    p = r.pipeline(transaction=False)
    for i in range(50):
        p.execute_command("ADDJOB", "compat", "b%d" % i, 0)
    assert len(set(p.execute())) == 50
    try:
        r.execute_command("ADDJOB", "compat", "b", 0, "TTL", "x")
    except redis.ResponseError as exc:
        assert "TTL" in str(exc)
    else:
        raise AssertionError("no error")
    assert r.execute_command("CLIENT", "GETNAME") == b"compat"
    print("ok", redis.__version__)
    """
)


@pytest.mark.parametrize("version", ["5.0.8", "6.4.0"])
def test_old_redis_py(version, tmp_path):
    target = tmp_path / ("redis-%s" % version)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), "redis==%s" % version],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip("could not install redis-py %s: %s" % (version, install.stderr.strip()[-200:]))
    node = NodeProcess(tmp_path).start()
    try:
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(node.port)],
            env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr + node.log()
        assert run.stdout.split() == ["ok", version]
    finally:
        assert node.stop() == 0
