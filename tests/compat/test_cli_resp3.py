"""`disque-py cli` prints RESP3 replies (maps, sets, doubles, nulls) as redis-cli does. A node
sends a map (HELLO 3) and nothing else of RESP3's, so the other types are taken from a real
redis-server; both programs read the same commands from stdin.

The server is ``redis-server`` when installed, else the one redis-tools ships (which
scripts/test installs for redis-cli): Redis builds one program and chooses what it is by the
name it is started as, and redis-tools holds it as ``redis-check-rdb``, started here under the
name ``redis-server``."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINES = "HELLO 3\nSMEMBERS s\nZSCORE z m\nHGETALL h\nHGETALL nope\nSMEMBERS nope\nGET nope\nZRANGE z 0 -1 WITHSCORES\n"


@pytest.fixture
def redis_port(tmp_path):
    binary, cli = shutil.which("redis-server") or shutil.which("redis-check-rdb"), shutil.which("redis-cli")
    if not binary or not cli:
        pytest.skip("redis-cli not installed (scripts/test installs redis-tools with apt-get when run as root)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(tmp_path)], executable=binary, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while subprocess.run([cli, "-p", str(port), "PING"], capture_output=True).stdout != b"PONG\n":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        for argv in (["SADD", "s", "a", "b"], ["ZADD", "z", "1.5", "m", "2", "n"], ["HSET", "h", "f", "v", "g", "w"]):
            subprocess.run([cli, "-p", str(port), *argv], capture_output=True, check=True)
        yield port
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("redis-server did not stop within 20 s of SIGTERM: killed") from None
        assert code == 0, "redis-server exited with %s" % code


@pytest.mark.parametrize("mode", ["--no-raw", "--raw"])
def test_resp3_replies_print_as_redis_clis(redis_port, mode):
    def run(argv):
        out = subprocess.run(argv + ["-p", str(redis_port), mode], input=LINES.encode(), capture_output=True,
                             timeout=60, cwd=ROOT)  # fmt: skip
        return re.sub(rb"(\"id\" => \(integer\) |\nid )\d+", rb"\1N", out.stdout)

    theirs = run([shutil.which("redis-cli")])
    mine = run([sys.executable, "-m", "disque_py.cli", "cli"])
    assert mine == theirs
    if mode == "--no-raw":
        assert b"1~ " in mine and b"(double) 1.5" in mine and b"(empty hash)" in mine and b"1# " in mine
