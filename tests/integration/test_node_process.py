"""A real node process driven by redis-py, redis-cli and raw sockets."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time

import hiredis
import pytest
import redis

from .conftest import NO_RETRY, wait_for

pytestmark = pytest.mark.integration


_INCOMPLETE = object()


def raw(port: int, payload: bytes, *, expect: int | None = None, replies: int | None = None,
        timeout: float = 5.0) -> bytes:  # fmt: skip
    """Send bytes, read until the peer closes, ``expect`` bytes or ``replies`` whole RESP replies
    arrive, or timeout. Give ``replies`` (or an ``expect`` no longer than the reply) when the
    node keeps the connection open: otherwise the read waits out the whole timeout."""
    reader = hiredis.Reader(notEnoughData=_INCOMPLETE) if replies is not None else None
    got = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if expect is not None and len(data) >= expect:
                break
            if reader is not None:
                reader.feed(chunk)
                while reader.gets() is not _INCOMPLETE:
                    got += 1
                if got >= replies:
                    break
        return data


def test_every_client_command_through_redis_py(node):
    r = node.client()
    assert r.ping() is True
    assert r.execute_command("ECHO", "hi") == b"hi"
    jid = r.execute_command("ADDJOB", "q", "hello", 0, "RETRY", 10, "TTL", 600)
    assert isinstance(jid, bytes) and len(jid) == 40
    assert r.execute_command("QLEN", "q") == 1
    assert r.execute_command("QPEEK", "q", 1) == [[b"q", jid, b"hello"]]
    stat = r.execute_command("QSTAT", "q")
    assert stat[stat.index(b"len") + 1] == 1
    assert r.execute_command("QSCAN", "0", "BUSYLOOP") == [b"0", [b"q"]]
    assert r.execute_command("JSCAN", "BUSYLOOP") == [b"0", [jid]]
    got = r.execute_command("GETJOB", "TIMEOUT", 1000, "WITHCOUNTERS", "FROM", "q")
    assert got == [[b"q", jid, b"hello", b"nacks", 0, b"additional-deliveries", 0]]
    assert r.execute_command("WORKING", jid) == 10
    assert r.execute_command("NACK", jid) == 1
    assert r.execute_command("DEQUEUE", jid) == 1
    assert r.execute_command("ENQUEUE", jid) == 1
    show = r.execute_command("SHOW", jid)
    assert show[show.index(b"state") + 1] == b"queued"
    assert show[show.index(b"nacks") + 1] == 1
    assert r.execute_command("PAUSE", "q", "out") == b"out"
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    assert r.execute_command("PAUSE", "q", "none") == b"none"
    assert r.execute_command("ACKJOB", jid) == 1
    assert r.execute_command("SHOW", jid) is None
    j2 = r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("FASTACK", j2) == 1
    j3 = r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("DELJOB", j3) == 1
    hello = r.execute_command("HELLO")
    assert hello[0] == 1 and len(hello[1]) == 40 and hello[2][0] == hello[1]
    assert hello[2][2] == str(node.port).encode()
    info = r.info("jobs")
    assert info["registered_jobs"] == 0
    assert "registered_queues" in r.info("queues")
    everything = r.info()
    for key in ("disque_version", "tcp_port", "connected_clients", "used_memory", "registered_jobs",
                "registered_queues", "aof_enabled", "total_commands_processed"):  # fmt: skip
        assert key in everything, key
    assert len(r.execute_command("TIME")) == 2
    assert r.execute_command("CLIENT", "SETNAME", "worker-1") in (b"OK", True)
    assert r.execute_command("CLIENT", "GETNAME") == b"worker-1"
    assert isinstance(r.execute_command("CLIENT", "ID"), int)
    assert b"name=worker-1" in r.execute_command("CLIENT", "LIST")
    assert r.config_get("port") == {"port": str(node.port)}
    assert r.execute_command("CONFIG", "SET", "timeout", "0") in (b"OK", True)
    assert r.command_count() >= 25
    assert "addjob" in r.command()
    assert r.execute_command("DEBUG", "FLUSHALL") in (b"OK", True)


def test_redis_py_resp2_and_resp3_handshakes(node):
    for protocol in (2, 3):
        r = node.client(protocol=protocol)
        assert r.ping()
        jid = r.execute_command("ADDJOB", "p%d" % protocol, "b", 0)
        assert r.execute_command("GETJOB", "NOHANG", "FROM", "p%d" % protocol)[0][1] == jid
        assert r.execute_command("GETJOB", "NOHANG", "FROM", "p%d" % protocol) is None
        assert r.execute_command("SHOW", jid)[0] == b"id"
        # CONFIG GET: a flat array in RESP2, a map in RESP3 (as Redis 7); redis-py's helper reads both
        expected = {b"maxclients": b"10000"} if protocol == 3 else [b"maxclients", b"10000"]
        assert r.execute_command("CONFIG", "GET", "maxclients") == expected
        assert r.config_get("maxclients") == {"maxclients": "10000"}


def test_blocking_getjob_served_fifo_across_connections(node):
    results: dict[int, object] = {}

    def consumer(i: int) -> None:
        results[i] = node.client().execute_command("GETJOB", "TIMEOUT", 10000, "FROM", "blk")

    threads = []
    admin = node.client()
    for i in range(3):
        t = threading.Thread(target=consumer, args=(i,))
        t.start()
        threads.append(t)
        wait_for(lambda: admin.info("clients")["blocked_clients"] == i + 1, what="consumer %d blocked" % i)
    ids = [admin.execute_command("ADDJOB", "blk", "job%d" % i, 0) for i in range(3)]
    for t in threads:
        t.join(15)
    assert [results[i][0][1] for i in range(3)] == ids


def test_getjob_timeout_and_disconnect_while_blocked(node):
    r = node.client()
    started = time.monotonic()
    assert r.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "t") is None
    assert time.monotonic() - started >= 0.19
    s = socket.create_connection(("127.0.0.1", node.port))
    s.sendall(b"*4\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n$1\r\nt\r\n$1\r\nu\r\n")
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, what="raw client blocked")
    s.close()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 0, what="blocked client gone")
    jid = r.execute_command("ADDJOB", "t", "b", 0)
    assert r.execute_command("QLEN", "t") == 1
    assert r.execute_command("GETJOB", "FROM", "t")[0][1] == jid


def test_pipelining_and_commands_queued_behind_a_blocked_getjob(node):
    r = node.client()
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command("ADDJOB", "pipe", "body-%d" % i, 0)
    ids = pipe.execute()
    assert len(set(ids)) == 500 and r.execute_command("QLEN", "pipe") == 500
    # A pipelined PING after a blocking GETJOB waits for it, like Redis.
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:
        s.sendall(b"GETJOB TIMEOUT 300 FROM empty-queue\r\nPING\r\n")
        data = b""
        while not data.endswith(b"+PONG\r\n"):
            data += s.recv(1024)
        assert data == b"*-1\r\n+PONG\r\n"


def test_large_reply_to_a_blocked_client_that_reads_slowly(node):
    """A reply bigger than the socket takes at once is finished by the writer, intact."""
    body = bytes(range(256)) * (16 * 4096)  # 16 MiB: more than the socket buffers hold
    admin = node.client()
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(b"GETJOB TIMEOUT 10000 FROM big\r\n")
        wait_for(lambda: admin.info("clients")["blocked_clients"] == 1, what="slow reader blocked")
        jid = admin.execute_command("ADDJOB", "big", body, 0)
        assert admin.ping() is True  # the node serves others while that reply waits to drain
        expected = b"*1\r\n*3\r\n$3\r\nbig\r\n$40\r\n" + jid + b"\r\n$%d\r\n" % len(body) + body + b"\r\n"
        data = bytearray()
        while len(data) < len(expected):
            chunk = s.recv(65536)
            assert chunk, "connection closed after %d of %d bytes" % (len(data), len(expected))
            data += chunk
        assert bytes(data) == expected


def test_inline_commands_like_telnet(node):
    data = raw(node.port, b'PING\r\nADDJOB inline "hello world" 0\r\nQLEN inline\r\n', replies=3)
    lines = data.split(b"\r\n")
    assert lines[0] == b"+PONG"
    assert lines[1].startswith(b"+D-") and len(lines[1]) == 41
    assert lines[2] == b":1"


def test_binary_safe_bodies(node):
    r = node.client()
    body = bytes(range(256)) * 64 + b"\r\n\x00end"
    jid = r.execute_command("ADDJOB", "bin", body, 0)
    assert r.execute_command("GETJOB", "FROM", "bin") == [[b"bin", jid, body]]


def test_bad_input_never_hurts_other_clients(start_node):
    node = start_node(proto_max_bulk_len=1024, proto_max_multibulk_len=16)
    bystander = node.client()
    jid = bystander.execute_command("ADDJOB", "safe", "keep me", 0)
    # wrong arity, unknown command, non numeric option: error, connection stays usable
    r = node.client()
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("ADDJOB", "q")
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("FLY", "away")
    with pytest.raises(redis.ResponseError, match="TTL must be a number"):
        r.execute_command("ADDJOB", "q", "b", 0, "TTL", "soon")
    with pytest.raises(redis.ResponseError, match="BADID"):
        r.execute_command("ACKJOB", "not-an-id")
    assert r.ping()
    # unrecoverable protocol errors: an error reply, then the connection closes
    for payload in (b"*abc\r\n", b"*1\r\n:5\r\n", b"*2\r\n$4\r\nPING\r\n$x\r\n", b'PING "unbalanced\r\n'):
        reply = raw(node.port, payload)
        assert reply.startswith(b"-ERR Protocol error"), (payload, reply)
    # oversized body and too many arguments
    big = b"x" * 1025
    reply = raw(node.port, b"*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1025\r\n" + big + b"\r\n$1\r\n0\r\n")
    assert reply == b"-ERR Protocol error: invalid bulk length (over proto-max-bulk-len 1024)\r\n", reply
    reply = raw(node.port, b"*17\r\n" + b"$4\r\nPING\r\n" * 17)
    assert reply == b"-ERR Protocol error: invalid multibulk length (over proto-max-multibulk-len 16)\r\n", reply
    ok = b"x" * 1024
    assert raw(node.port, b"*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1024\r\n" + ok + b"\r\n$1\r\n0\r\n",
               replies=1).startswith(b"+D-")
    # garbage
    for junk in (b"\x00\xff\xfe" * 100, b"*" * 50 + b"\r\n", b"$5\r\nhello\r\n"):
        raw(node.port, junk, timeout=1)
    assert bystander.execute_command("SHOW", jid) is not None
    assert bystander.info("stats")["protocol_errors"] >= 6
    assert "Traceback" not in node.log()


def test_auth_required(start_node):
    node = start_node(requirepass="s3cret")
    anon = node.client(password=None, protocol=2, retry=NO_RETRY)
    with pytest.raises(redis.AuthenticationError, match="Authentication required"):
        anon.execute_command("QLEN", "q")
    assert raw(node.port, b"QLEN q\r\n", expect=10).startswith(b"-NOAUTH")
    assert raw(node.port, b"AUTH nope\r\n", expect=10).startswith(b"-ERR invalid password")
    r = node.client()
    assert r.execute_command("QLEN", "q") == 0
    r3 = node.client(protocol=3)
    assert r3.execute_command("QLEN", "q") == 0
    bad = node.client(password="wrong", retry=NO_RETRY)
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair or user is disabled"):
        bad.ping()


def test_maxclients(start_node):
    node = start_node(maxclients=2)
    a, b = node.client(), node.client()
    assert a.ping() and b.ping()
    reply = raw(node.port, b"PING\r\n", replies=1)
    assert reply.startswith(b"-ERR max number of clients reached (maxclients 2)\r\n"), reply
    assert a.info("stats")["rejected_connections"] == 1


def test_maxclients_fits_the_open_files_limit(start_node):
    """With 'ulimit -n' 128, maxclients 10000 cannot be served: lowered to 96, the rest told so."""
    node = start_node(nofile=128)
    r = node.client()
    assert r.config_get("maxclients") == {"maxclients": "96"}
    assert "maxclients has been reduced to 96" in node.log()
    with pytest.raises(redis.ResponseError, match="not able to handle the specified number of clients, try with 96"):
        r.config_set("maxclients", 200)
    assert r.config_get("maxclients") == {"maxclients": "96"}
    assert r.config_set("maxclients", 40) and r.config_set("maxclients", 96)  # within the limit: fine
    # every connection over the limit gets Disque's error at once, none waits unaccepted
    socks = [socket.create_connection(("127.0.0.1", node.port), timeout=5) for _ in range(120)]
    try:
        replies = []
        for s in socks:
            s.sendall(b"PING\r\n")
            replies.append(s.recv(100))
    finally:
        for s in socks:
            s.close()
    assert replies.count(b"+PONG\r\n") == 95  # r holds the 96th slot
    assert all(x == b"-ERR max number of clients reached (maxclients 96)\r\n" for x in replies if x != b"+PONG\r\n")
    stats = r.info("stats")
    assert stats["rejected_connections"] == 25 and stats["accept_errors"] == 0


def test_out_of_descriptors_the_node_says_so_briefly_and_recovers(start_node):
    """Silent connections to the bus port eat every descriptor: accept() fails on both ports.

    The node counts the failures, logs one line per 10 s per listener (not one
    traceback per retry), closes the silent links after 5 s and serves again.
    """
    node = start_node(nofile=64)
    silent = []
    for _ in range(80):
        try:
            silent.append(socket.create_connection(("127.0.0.1", node.port + 10000), timeout=2))
        except OSError:
            break
    assert len(silent) > 64  # more than the node can hold: the listen backlog keeps the rest
    try:
        t0 = time.monotonic()
        r = node.client(socket_timeout=2, socket_connect_timeout=2)
        wait_for(r.ping, timeout=30, what="the node serving clients again")

        def bus_stats() -> dict[str, int]:
            info = r.execute_command("CLUSTER", "INFO").decode()
            return {k: int(v) for k, v in (line.split(":", 1) for line in info.split() if ":" in line) if v.isdigit()}

        # The client may get a descriptor before the bus listener has drained its backlog (the two
        # accept loops take turns), or while a file the node writes is closed for a moment: wait
        # for the failures and for the silent links to be closed rather than expect them by the first PING.
        wait_for(lambda: bus_stats()["cluster_stats_bus_accept_errors"] >= 1, timeout=30, what="bus accept errors")
        wait_for(lambda: bus_stats()["cluster_stats_bus_silent_links"] >= 1, timeout=30, what="silent links closed")
    finally:
        for s in silent:
            s.close()
    log = node.log()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "Too many open files" in line]
    elapsed = time.monotonic() - t0
    assert 1 <= len(lines) <= 2 * (2 + elapsed / 10), lines  # two listeners, one line per 10 s each


def test_idle_timeout_closes_idle_but_not_blocked_clients(start_node):
    node = start_node(timeout=1)
    r = node.client()
    idle = socket.create_connection(("127.0.0.1", node.port))
    blocked = socket.create_connection(("127.0.0.1", node.port))
    blocked.sendall(b"GETJOB TIMEOUT 3000 FROM nothing\r\n")
    idle.settimeout(5)
    assert idle.recv(10) == b""  # closed by the server after ~1 s
    blocked.settimeout(5)
    assert blocked.recv(10) == b"*-1\r\n"
    idle.close()
    blocked.close()
    assert r.ping()


def test_shutdown_command_and_sigterm_stop_cleanly(start_node):
    node = start_node()
    with pytest.raises(redis.ConnectionError, match="Connection refused|Connection closed by server"):
        node.client(retry=NO_RETRY).execute_command("SHUTDOWN")
    assert node.proc.wait(10) == 0
    assert "ready to exit" in node.log()
    other = start_node()
    jid = other.client().execute_command("ADDJOB", "q", "kept", 0)
    # a closed terminal sends SIGHUP: ignored, as Disque does, the jobs stay
    other.proc.send_signal(signal.SIGHUP)
    other.proc.send_signal(signal.SIGPIPE)
    assert other.client().execute_command("SHOW", jid) is not None
    assert other.proc.poll() is None
    assert other.stop(signal.SIGTERM) == 0


def test_node_id_survives_restart(start_node, tmp_path):
    node = start_node()
    first = node.client().execute_command("HELLO")[1]
    node.stop()
    again = start_node(port=node.port, dir=str(node.dir))
    assert again.client().execute_command("HELLO")[1] == first


def test_config_file_then_command_line_and_rewrite(start_node, tmp_path):
    conf = tmp_path / "disque.conf"
    conf.write_text("# my node\nloglevel notice\n\n# limits\nmaxclients 100\ntimeout 0\n")
    node = start_node(config_file=conf, maxclients=50)
    r = node.client()
    assert r.config_get("maxclients") == {"maxclients": "50"}
    assert r.execute_command("CONFIG", "SET", "maxclients", "70") in (b"OK", True)
    assert r.execute_command("CONFIG", "SET", "timeout", "30") in (b"OK", True)
    with pytest.raises(redis.ResponseError, match="Unsupported CONFIG parameter: port"):
        r.execute_command("CONFIG", "SET", "port", "1")
    with pytest.raises(redis.ResponseError, match="Invalid argument 'many' for CONFIG SET 'maxclients'"):
        r.execute_command("CONFIG", "SET", "maxclients", "many")
    assert r.execute_command("CONFIG", "REWRITE") in (b"OK", True)
    text = conf.read_text()
    assert text.startswith("# my node\nloglevel verbose\n\n# limits\nmaxclients 70\ntimeout 30\n")
    assert "port %d" % node.port in text
    assert r.config_get("max*")["maxclients"] == "70"


def test_redis_cli_interactive_and_pipe(node, redis_cli):
    out = subprocess.run(
        [redis_cli, "-p", str(node.port)],
        input="ADDJOB cliq hello 0\nQLEN cliq\nGETJOB FROM cliq\nHELLO\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("D-") and lines[1] == "1"
    assert lines[2] == "cliq" and lines[4] == "hello"
    proto = b"".join(
        b"*4\r\n$6\r\nADDJOB\r\n$5\r\npiped\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (len(b"j%d" % i), b"j%d" % i)
        for i in range(1000)
    )
    out = subprocess.run([redis_cli, "-p", str(node.port), "--pipe"], input=proto, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert b"errors: 0, replies: 1000" in out.stdout
    assert node.client().execute_command("QLEN", "piped") == 1000
    out = subprocess.run([redis_cli, "-p", str(node.port), "QSTAT", "piped"], capture_output=True, text=True, timeout=30)
    assert "jobs-in" in out.stdout


# ---------------------------------------------------------------- random commands
FUZZ_COMMANDS = [b"ADDJOB", b"GETJOB", b"ACKJOB", b"FASTACK", b"DELJOB", b"SHOW", b"QLEN", b"QPEEK", b"QSTAT",
                 b"QSCAN", b"JSCAN", b"ENQUEUE", b"NACK", b"DEQUEUE", b"WORKING", b"PAUSE", b"HELLO", b"PING",
                 b"ECHO", b"INFO", b"TIME", b"COMMAND", b"CLIENT", b"CONFIG", b"CLUSTER", b"DEBUG", b"AUTH",
                 b"FLY", b""]  # fmt: skip
FUZZ_WORDS = [b"REPLICATE", b"DELAY", b"RETRY", b"TTL", b"MAXLEN", b"ASYNC", b"TIMEOUT", b"COUNT", b"NOHANG",
              b"WITHCOUNTERS", b"FROM", b"BUSYLOOP", b"IN", b"OUT", b"ALL", b"NONE", b"STATE", b"QUEUE", b"REPLY",
              b"MINLEN", b"IMPORTRATE", b"bcast", b"yes", b"no", b"GET", b"LIST", b"ID", b"NODES", b"MEET", b"FORGET",
              b"LEAVING", b"MYID", b"INFO", b"RESET", b"SETNAME", b"SETINFO", b"ERROR", b"queued", b"acked", b"active",
              b"loglevel", b"maxclients", b"DOCS", b"GETKEYS", b"RESETSTAT", b"*"]  # fmt: skip
FUZZ_NUMBERS = [b"0", b"1", b"-1", b"3", b"100", b"65535", b"2147483648", b"9223372036854775807",
                b"9223372036854775808", b"-9223372036854775809", b"1e3", b"0.5", b"nan", b"inf", b"-inf", b" 1",
                b"0x10", b"99999999999999999999999999", b"+5", b"1_000", b""]  # fmt: skip


def _fuzz_argv(rng, ids: list[bytes]) -> list[bytes]:
    """One command, either shaped like a real one with odd values or any words at all."""

    def junk() -> bytes:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))

    def some_id() -> bytes:
        if ids and rng.random() < 0.5:
            jid = bytearray(rng.choice(ids))
            if rng.random() < 0.5:  # damaged: cut short or one byte changed
                jid[rng.randrange(len(jid))] = rng.randrange(256)
            return bytes(jid[: rng.choice([len(jid), rng.randrange(len(jid))])])
        return b"D-" + junk()

    def value() -> bytes:
        return rng.choice([rng.choice(FUZZ_WORDS), rng.choice(FUZZ_NUMBERS), some_id(), junk(), b"q", b"x" * 5000])

    options = [b for _ in range(rng.randrange(4)) for b in (rng.choice(FUZZ_WORDS), value())]
    shape = rng.randrange(4)
    if shape == 0:  # anything
        argv = [rng.choice(FUZZ_COMMANDS)] + [value() for _ in range(rng.randrange(9))]
    elif shape == 1:
        argv = [b"ADDJOB", rng.choice([b"q", b"q2", junk()]), rng.choice([b"body", junk()]), rng.choice(FUZZ_NUMBERS)]
        argv += options
    elif shape == 2:
        cmd = rng.choice([b"ACKJOB", b"FASTACK", b"NACK", b"ENQUEUE", b"DEQUEUE", b"WORKING", b"SHOW", b"DELJOB"])
        argv = [cmd] + [rng.choice(ids) if ids and rng.random() < 0.7 else some_id() for _ in range(rng.randrange(3))]
    else:
        cmd = rng.choice([b"GETJOB", b"QSCAN", b"JSCAN", b"QSTAT", b"QPEEK", b"PAUSE", b"QLEN"])
        argv = [cmd] + options + [rng.choice([b"q", b"q2", junk(), b"in", b"out", b"all", b"none", b"bcast", b"state"])]
    name = argv[0].upper()
    words = {a.upper() for a in argv[1:]}
    if name == b"GETJOB":  # never block: the test reads one reply per command
        argv = [b"GETJOB", b"NOHANG"] + argv[1:] + [b"FROM", b"q", b"q2"]
    if name == b"DEBUG" and words & {b"SLEEP", b"FLUSHALL"} or name in (b"CLIENT", b"CONFIG") and words & {
        b"KILL", b"SET", b"REWRITE", b"PAUSE"
    }:
        argv = [b"PING"]  # things that stop, stall or reconfigure the node on purpose
    return argv


def test_random_commands_never_hurt_the_node(start_node):
    """Thousands of odd commands: one reply each, nothing lost. DISQUE_FUZZ_SEED=n runs another sequence."""
    import os
    import random

    import hiredis

    seed = int(os.environ.get("DISQUE_FUZZ_SEED", "1"))
    replay = "DISQUE_FUZZ_SEED=%d .venv/bin/pytest tests/integration/test_node_process.py -k random_commands" % seed
    rng = random.Random(seed)
    node = start_node()
    bystander = node.client()
    kept = bystander.execute_command("ADDJOB", "kept", "keep me", 0, "RETRY", 0)
    ids: list[bytes] = []
    replies = errors = 0
    sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    reader = hiredis.Reader()
    try:
        for i in range(3000):
            argv = _fuzz_argv(rng, ids)
            sock.sendall(b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in argv))
            reply = False
            while reply is False:
                data = sock.recv(1 << 20)
                assert data, "%s: the node closed the link after %r" % (replay, argv[:6])
                reader.feed(data)
                reply = reader.gets()
            replies += 1
            if isinstance(reply, hiredis.ReplyError):
                errors += 1
                assert str(reply)[:1].isupper(), "%s: %r" % (replay, reply)
            elif argv[0] == b"ADDJOB" and isinstance(reply, bytes) and reply.startswith(b"D-"):
                ids.append(reply)
    finally:
        sock.close()
    assert replies == 3000 and 0 < errors < replies, (replay, errors)
    assert ids, "%s: no ADDJOB succeeded, the test exercised nothing past parsing" % replay
    assert bystander.execute_command("SHOW", kept) is not None
    assert bystander.execute_command("GETJOB", "NOHANG", "FROM", "kept")[0][1] == kept
    log = node.log()
    assert "Traceback" not in log, "%s:\n%s" % (replay, log[max(0, log.find("Traceback") - 500) :][:3000])


def test_a_blocked_client_that_keeps_sending_is_not_read_until_it_is_served(node):
    """Commands pipelined behind a blocking GETJOB wait in the socket, not in the node's memory:
    the sender is held back by TCP. Once served, every one of them runs, in order; a paused
    client that hangs up is noticed and unblocked."""
    import hiredis

    r = node.client()
    s = socket.create_connection(("127.0.0.1", node.port), timeout=2)
    s.sendall(b"GETJOB TIMEOUT 0 FROM q\r\n")
    wait_for(lambda: r.info()["blocked_clients"] == 1, what="the GETJOB blocked")
    chunk = b"PING\r\n" * 50_000
    sent = 0
    try:
        while sent < 40_000_000:  # without back-pressure the node takes it all (and ~1 GB of memory)
            sent += s.send(chunk[sent % len(chunk) :])
    except socket.timeout:
        pass
    assert sent < 40_000_000, "the node kept reading from a blocked client"
    assert r.ping() and r.info()["blocked_clients"] == 1  # everyone else is served meanwhile
    pings = -(-sent // 6)  # the last one may be incomplete: finish it below
    replies: list = []

    def read() -> None:
        reader = hiredis.Reader()
        deadline = time.monotonic() + 30
        while len(replies) < 1 + pings and time.monotonic() < deadline:
            try:
                data = s.recv(1 << 20)
            except socket.timeout:
                continue
            if not data:
                break
            reader.feed(data)
            while (reply := reader.gets()) is not False:
                replies.append(reply)

    t = threading.Thread(target=read)
    t.start()
    job_id = r.execute_command("ADDJOB", "q", "served", 0)
    s.sendall(b"PING\r\n"[sent % 6 :] if sent % 6 else b"")
    t.join(40)
    assert replies[0] == [[b"q", job_id, b"served"]]
    assert len(replies) == 1 + pings and all(x == b"PONG" for x in replies[1:])
    s.close()
    # a paused client (blocked, commands pending) that hangs up is unblocked like any other
    s2 = socket.create_connection(("127.0.0.1", node.port), timeout=2)
    s2.sendall(b"GETJOB TIMEOUT 0 FROM q2\r\nPING\r\n")
    wait_for(lambda: r.info()["blocked_clients"] == 1, what="the second GETJOB blocked")
    s2.close()
    wait_for(lambda: r.info()["blocked_clients"] == 0, what="the hang-up noticed")
    assert r.execute_command("QLEN", "q2") == 0 and r.info()["connected_clients"] == 1


def test_pipelined_commands_with_big_replies_wait_for_the_client_to_read(node):
    """400 QPEEKs of ~1 MB each in one pipeline from a client that does not read yet: the node
    runs them until OUT_HOLD (64 MB) of replies wait, then only as fast as the client takes
    them (not 400 MB held), and every reply arrives, in order."""
    from disque_py.server.connection import OUT_HOLD

    import hiredis

    r = node.client()
    body = "b" * 2000
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command("ADDJOB", "q", body, 0)
    ids = pipe.execute()
    s = socket.create_connection(("127.0.0.1", node.port), timeout=2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"QPEEK q 500\r\n" * 400)
    wait_for(lambda: r.info()["client_longest_output_list"] > 0, what="the first replies waiting")
    wait_for(lambda: r.info()["client_longest_output_list"] >= OUT_HOLD // 2, what="OUT_HOLD of replies held")
    # then it waits: not 400 MB. Watched for a while (a node that did not stop at OUT_HOLD
    # would be far past it within a few samples), every sample must stay under the bound.
    watch_until = time.monotonic() + 0.5
    while time.monotonic() < watch_until:
        assert r.info()["client_longest_output_list"] < OUT_HOLD + 4_000_000
        time.sleep(0.05)
    reader = hiredis.Reader()
    replies = []
    deadline = time.monotonic() + 60
    while len(replies) < 400 and time.monotonic() < deadline:
        data = s.recv(1 << 20)
        if not data:
            break
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            replies.append(reply)
    s.close()
    assert len(replies) == 400
    assert all([j[1] for j in reply] == ids for reply in replies)
    assert r.info()["client_longest_output_list"] == 0


def _fill_for_qpeek(r: redis.Redis, queue: str = "q", jobs: int = 500, size: int = 2000) -> None:
    """``QPEEK <queue> 500`` then replies ~1 MB."""
    pipe = r.pipeline(transaction=False)
    for _ in range(jobs):
        pipe.execute_command("ADDJOB", queue, "b" * size, 0)
    pipe.execute()


def _non_reader(port: int, payload: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(payload)
    return s


def _closed_by_peer(s: socket.socket, timeout: float = 20.0) -> bool:
    """Read (and drop) what the node had sent until it closes the link; False if it never does."""
    deadline = time.monotonic() + timeout
    s.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            if not s.recv(1 << 20):
                return True
        except socket.timeout:
            continue
        except ConnectionResetError:
            return True
    return False


def test_output_buffer_hard_limit_closes_a_client_that_does_not_read(start_node):
    """client-output-buffer-limit as Disque: over the hard limit of unsent replies, the client is
    closed (logged and counted); a client under it and every other client are served on."""
    import hiredis

    node = start_node(**{"client-output-buffer-limit": ("normal", "4mb", 0, 0)})
    r = node.client()
    _fill_for_qpeek(r)
    # under the limit: the held-back commands hold ~1-2 MB (OUT_HOLD) and the client reads them all
    s = _non_reader(node.port, b"QPEEK q 500\r\n" * 3)
    wait_for(lambda: r.info()["client_longest_output_list"] > 0, what="replies waiting")
    assert r.info()["connected_clients"] == 2
    reader = hiredis.Reader()
    replies: list = []
    s.settimeout(10)
    while len(replies) < 3:
        data = s.recv(1 << 20)
        assert data, "closed although under the limit"
        reader.feed(data)
        while (reply := reader.gets()) is not False:
            replies.append(reply)
    assert all(len(x) == 500 for x in replies)
    s.close()
    assert r.info()["client_output_buffer_limit_disconnections"] == 0
    # over it: one 16 MB reply the client does not read
    _fill_for_qpeek(r, "big", jobs=16, size=1_000_000)
    s = _non_reader(node.port, b"QPEEK big 16\r\n")
    wait_for(lambda: r.info()["client_output_buffer_limit_disconnections"] == 1, what="the client closed")
    assert _closed_by_peer(s)
    s.close()
    assert r.info()["client_output_buffer_limit_disconnections"] == 1
    assert "over its hard output buffer limit of 4194304 bytes (client-output-buffer-limit normal 4194304 0 0)" in node.log()
    assert r.ping() and r.info()["connected_clients"] == 1


def test_output_buffer_soft_limit_after_its_seconds_and_set_at_runtime(node):
    """The soft limit closes a client only once it has stayed over it for the soft seconds, even if
    nothing more is written to it; CONFIG SET changes the limits of a running node."""
    r = node.client()
    assert r.config_set("client-output-buffer-limit", "normal 0 512kb 2")
    assert r.config_get("client-output-buffer-limit") == {"client-output-buffer-limit": "normal 0 524288 2"}
    _fill_for_qpeek(r)
    s = _non_reader(node.port, b"QPEEK q 500\r\n" * 4)
    wait_for(lambda: r.info()["client_longest_output_list"] > 512 * 1024, what="replies over the soft limit")
    over = time.monotonic()
    assert r.info()["client_output_buffer_limit_disconnections"] == 0  # over it, not yet for 2 s
    wait_for(lambda: r.info()["client_output_buffer_limit_disconnections"] == 1, timeout=15, what="the client closed")
    assert time.monotonic() - over > 1.0
    assert _closed_by_peer(s)
    s.close()
    assert r.config_set("client-output-buffer-limit", "normal 0 0 0")
    s = _non_reader(node.port, b"QPEEK q 500\r\n" * 4)
    wait_for(lambda: r.info()["client_longest_output_list"] > 512 * 1024, what="replies waiting again")
    # With the limits off, nothing may happen for longer than the soft seconds were (the cron
    # looks once a second): every look sees the client still there ...
    watch_until = time.monotonic() + 3.5
    while time.monotonic() < watch_until:
        info = r.info()
        assert info["client_output_buffer_limit_disconnections"] == 1 and info["connected_clients"] == 2
        time.sleep(0.1)
    # ... although it was over the soft limit all along: with a limit again, it is closed.
    assert r.config_set("client-output-buffer-limit", "normal 0 512kb 1")
    wait_for(lambda: r.info()["client_output_buffer_limit_disconnections"] == 2, timeout=15, what="the client closed")
    assert _closed_by_peer(s)
    s.close()


def test_a_pipeline_bigger_than_the_socket_buffers_is_answered_whole(node):
    """A client library writes a whole pipeline before it reads a reply: the node goes on reading
    and running it while the replies wait unread (as Redis and Disque do), instead of waiting for
    the client to read first, which it never would (redis-py's pipeline of 50,000 ADDJOBs once
    hung here). 150,000 ADDJOBs answer about 7 MB."""
    r = node.client()
    pipe = r.pipeline(transaction=False)
    n = 150_000
    for i in range(n):
        pipe.execute_command("ADDJOB", "bulk", "job %d" % i, 0)
    ids = pipe.execute()
    assert len(ids) == n and len(set(ids)) == n
    assert r.execute_command("QLEN", "bulk") == n
    assert r.ping()


def test_a_thousand_clients_connecting_at_once_are_all_served_with_their_addresses(node):
    """The listener takes many connections per wake-up (more than the listen backlog arrive here
    before the node runs): each is served, and CLIENT LIST shows each one's two addresses."""
    socks = []
    try:
        for _ in range(1000):
            s = socket.create_connection(("127.0.0.1", node.port), timeout=10)
            s.sendall(b"PING\r\n")
            socks.append(s)
        for s in socks:
            assert s.recv(16) == b"+PONG\r\n"
        listing = redis.Redis(port=node.port).execute_command("CLIENT", "LIST")
        listing = listing.decode() if isinstance(listing, bytes) else listing
        for s in socks[:: 97]:
            assert "addr=127.0.0.1:%d laddr=127.0.0.1:%d " % (s.getsockname()[1], node.port) in listing
        assert listing.count("\n") >= 1000
    finally:
        for s in socks:
            s.close()
