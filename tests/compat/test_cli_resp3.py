"""`disque-py cli` prints RESP3 replies (maps, sets, doubles, nulls) as redis-cli does. A node
sends a map (HELLO 3) and nothing else of RESP3's, so the other types are taken from a real
redis-server, when one is installed; both programs read the same commands from stdin."""

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
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not binary or not cli:
        pytest.skip("redis-server and redis-cli are not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)  # fmt: skip
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
        proc.wait(timeout=20)


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
