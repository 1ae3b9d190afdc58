"""A full disk under a node with ``appendfsync always``: nothing unwritten is acknowledged,
ADDJOB is refused with -MISCONF while the disk is full, consumers still drain, and the
node recovers by itself when space returns. Real process, real (tiny) file system."""

from __future__ import annotations

import os
import socket
import subprocess

import hiredis
import pytest
import redis

from tests.integration.conftest import start_node, wait_for  # noqa: F401 - the fixture

BODY = b"x" * 20_000


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (the full disk)")
    where = tmp_path / "disk"
    where.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip("can't mount a tmpfs here: %s" % got.stderr.strip())
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


class RawClient:
    """One connection that sends a command and waits for its reply only as long as asked."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.reader = hiredis.Reader()

    def send(self, *args: bytes | str | int) -> None:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def reply(self, timeout: float):
        self.sock.settimeout(timeout)
        while True:
            got = self.reader.gets()
            if got is not False:
                return got
            try:
                data = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                return None
            assert data, "connection closed"
            self.reader.feed(data)


def test_a_full_disk_holds_the_reply_refuses_new_jobs_and_recovers(start_node, small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 600_000)
    node = start_node(dir=str(small_disk), appendonly="yes", appendfsync="always")
    admin = node.client()
    producer = RawClient(node.port)
    acknowledged = []
    held = None
    for _ in range(100):
        producer.send("ADDJOB", "q", BODY, 0, "RETRY", 5)
        got = producer.reply(timeout=2.0)
        if got is None:
            held = True  # its record could not be written: no reply
            break
        assert isinstance(got, bytes), got
        acknowledged.append(got)
    assert held, "the disk never filled up"
    assert acknowledged, "not one job fit"
    info = admin.info("persistence")
    assert info["aof_last_write_status"] == "err" and info["aof_write_errors"] >= 1
    with pytest.raises(redis.ResponseError, match="MISCONF Errors writing to the AOF file"):
        admin.execute_command("ADDJOB", "q", "more", 0)
    # consumers still drain what the node holds
    taken = admin.execute_command("GETJOB", "NOHANG", "COUNT", 2, "FROM", "q")
    assert len(taken) == 2
    assert "Error writing to the AOF file" in node.log()
    filler.unlink()  # space comes back: the held write succeeds, its reply leaves
    late = producer.reply(timeout=10.0)
    assert isinstance(late, bytes) and len(late) == 40, late
    acknowledged.append(late)
    wait_for(lambda: admin.info("persistence")["aof_last_write_status"] == "ok", what="the write status back to ok")
    acknowledged.append(admin.execute_command("ADDJOB", "q", "after", 0, "RETRY", 5))
    node.stop(sig=9)
    node.start()
    again = node.client()
    for job_id in acknowledged:
        assert again.execute_command("SHOW", job_id) is not None, job_id
