"""Users and rights on a real node, through redis-py and raw sockets (server/acl.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import redis

from .conftest import NO_RETRY, ROOT, free_port, wait_for
from .test_node_process import raw

pytestmark = pytest.mark.integration

NOPERM = redis.exceptions.NoPermissionError  # redis-py's for a -NOPERM reply (the prefix is dropped)

USERS = """\
requirepass defpw
user consumer on >cpw allkeys +@consume
user producer on >ppw allkeys +@produce
user orders on >opw ~orders.* +@produce +@consume
user ops on >apw allkeys +@all
user disabled off >xpw allkeys +@all
"""


@pytest.fixture
def acl_node(start_node, tmp_path):
    conf = tmp_path / "acl.conf"
    conf.write_text(USERS)
    node = start_node(config_file=str(conf))
    node.password = "defpw"
    return node


def as_user(node, name: str, password: str, **kw) -> redis.Redis:
    return redis.Redis(host=node.host, port=node.port, username=name, password=password, socket_timeout=10, **kw)


class Raw:
    """One raw connection: send a command, read one reply line (enough for the replies here)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def cmd(self, *args: str) -> bytes:
        payload = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
        self.sock.sendall(payload)
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except socket.timeout:
            return False


def test_a_consumer_cannot_add_and_a_producer_cannot_take(acl_node):
    consumer = as_user(acl_node, "consumer", "cpw")
    producer = as_user(acl_node, "producer", "ppw")
    with pytest.raises(NOPERM, match="this user has no permissions to run the 'addjob' command"):
        consumer.execute_command("ADDJOB", "q", "body", 0)
    jid = producer.execute_command("ADDJOB", "q", "body", 0)
    assert producer.execute_command("QLEN", "q") == 1
    with pytest.raises(NOPERM, match="'getjob' command"):
        producer.execute_command("GETJOB", "NOHANG", "FROM", "q")
    [[queue, got, body]] = consumer.execute_command("GETJOB", "NOHANG", "FROM", "q")
    assert (queue, got, body) == (b"q", jid, b"body")
    assert consumer.execute_command("ACKJOB", jid) == 1


def test_a_user_limited_to_orders_cannot_touch_payroll(acl_node):
    ops = as_user(acl_node, "ops", "apw")
    orders = as_user(acl_node, "orders", "opw")
    payroll_job = ops.execute_command("ADDJOB", "payroll", "salary", 0)
    jid = orders.execute_command("ADDJOB", "orders.x", "o1", 0)
    [[queue, got, _]] = orders.execute_command("GETJOB", "NOHANG", "FROM", "orders.x")
    assert (queue, got) == (b"orders.x", jid)
    assert orders.execute_command("ACKJOB", jid) == 1
    denied = "this user has no permissions to access the 'payroll' queue"
    for argv in (
        ("ADDJOB", "payroll", "x", 0),
        ("GETJOB", "NOHANG", "FROM", "payroll"),
        ("GETJOB", "NOHANG", "FROM", "orders.a", "payroll"),
        ("QLEN", "payroll"),
        ("QPEEK", "payroll", 1),
        ("SHOW", payroll_job),
        ("ACKJOB", payroll_job),
        ("NACK", payroll_job),
    ):
        with pytest.raises(NOPERM, match=denied):
            orders.execute_command(*argv)
    with pytest.raises(redis.ResponseError, match="not known to this node"):
        orders.execute_command("ACKJOB", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1")
    with pytest.raises(NOPERM, match="'qscan' command"):  # not in its categories
        orders.execute_command("QSCAN")
    # the payroll job is untouched: still queued
    assert ops.execute_command("QLEN", "payroll") == 1
    assert ops.execute_command("SHOW", payroll_job) is not None
    info = ops.info("stats")
    assert (info["acl_access_denied_key"], info["acl_access_denied_cmd"]) == (9, 1)


def test_admin_commands_need_the_admin_right(acl_node):
    orders = as_user(acl_node, "orders", "opw")
    for argv in (
        ("CONFIG", "GET", "port"),
        ("CONFIG", "SET", "requirepass", "x"),
        ("DEBUG", "FLUSHALL"),
        ("SHUTDOWN",),
        ("CLUSTER", "INFO"),
        ("CLIENT", "LIST"),
        ("CLIENT", "KILL", "ID", "1"),
        ("ACL", "LIST"),
        ("ACL", "SETUSER", "orders", "+@all"),
        ("BGREWRITEAOF",),
        ("DELJOB", "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"),
        ("PAUSE", "orders.x", "all"),
    ):
        with pytest.raises(NOPERM, match="this user has no permissions to run the '"):
            orders.execute_command(*argv)
    # what every user may run
    assert orders.ping() is True
    assert orders.execute_command("ACL", "WHOAMI") == b"orders"
    assert orders.execute_command("CLIENT", "SETNAME", "w1") in (b"OK", True)
    assert orders.execute_command("HELLO")[0] == 1  # Disque's HELLO: the cluster's nodes
    ops = as_user(acl_node, "ops", "apw")
    assert ops.config_get("port") == {"port": str(acl_node.port)}
    assert ops.execute_command("ACL", "WHOAMI") == b"ops"
    assert ops.info("stats")["acl_access_denied_cmd"] == 12


def test_auth_forms_and_the_default_user(acl_node):
    assert raw(acl_node.port, b"QLEN q\r\n", expect=10).startswith(b"-NOAUTH")
    assert raw(acl_node.port, b"AUTH defpw\r\nACL WHOAMI\r\n", replies=2) == b"+OK\r\n$7\r\ndefault\r\n"
    assert raw(acl_node.port, b"AUTH default defpw\r\nACL WHOAMI\r\n", replies=2) == b"+OK\r\n$7\r\ndefault\r\n"
    assert raw(acl_node.port, b"AUTH orders opw\r\nACL WHOAMI\r\n", replies=2) == b"+OK\r\n$6\r\norders\r\n"
    assert raw(acl_node.port, b"AUTH orders cpw\r\n", expect=10).startswith(
        b"-WRONGPASS invalid username-password pair or user is disabled.")
    assert raw(acl_node.port, b"AUTH disabled xpw\r\n", expect=10).startswith(b"-WRONGPASS")
    assert raw(acl_node.port, b"AUTH nobody x\r\n", expect=10).startswith(b"-WRONGPASS")
    assert raw(acl_node.port, b"AUTH wrong\r\n", expect=10).startswith(b"-ERR invalid password")
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair or user is disabled"):
        as_user(acl_node, "orders", "wrong", retry=NO_RETRY).ping()
    # HELLO 3 AUTH (redis-py's RESP3 handshake) and HELLO 2 AUTH
    r3 = as_user(acl_node, "orders", "opw", protocol=3)
    assert r3.execute_command("ACL", "WHOAMI") == b"orders"
    with pytest.raises(NOPERM, match="no permissions to access the 'payroll' queue"):
        r3.execute_command("ADDJOB", "payroll", "x", 0)
    reply = raw(acl_node.port, b"HELLO 2 AUTH consumer cpw\r\nADDJOB q x 0\r\n", replies=2)
    assert b"-NOPERM this user has no permissions to run the 'addjob' command" in reply
    assert raw(acl_node.port, b"HELLO 3 AUTH consumer nope\r\n", expect=10).startswith(b"-WRONGPASS")


def test_acl_setuser_at_runtime_then_auth_list_and_live_changes(acl_node):
    ops = as_user(acl_node, "ops", "apw")
    assert ops.execute_command("ACL", "SETUSER", "carol", "on", ">cpw2", "~jobs.*", "+@produce") in (b"OK", True)
    users = ops.execute_command("ACL", "USERS")
    assert b"carol" in users and b"default" in users
    listing = [line.decode() for line in ops.execute_command("ACL", "LIST")]
    carol = next(line for line in listing if line.startswith("user carol "))
    assert "cpw2" not in carol and "#" in carol and "~jobs.*" in carol and "+@produce" in carol
    assert not any("defpw" in line or "apw" in line for line in listing)
    with pytest.raises(redis.ResponseError, match="Error in ACL SETUSER modifier 'bogus'"):
        ops.execute_command("ACL", "SETUSER", "carol", "bogus")
    c = Raw(acl_node.port)
    assert c.cmd("AUTH", "carol", "cpw2") == b"+OK"
    assert c.cmd("ADDJOB", "jobs.a", "x", "0").startswith(b"+D-")
    # a change applies to connections already authenticated as the user
    assert ops.execute_command("ACL", "SETUSER", "carol", "-@produce", "+@consume") in (b"OK", True)
    assert c.cmd("ADDJOB", "jobs.a", "x", "0").startswith(b"-NOPERM")
    assert c.cmd("GETJOB", "NOHANG", "FROM", "jobs.a").startswith(b"*1")
    # ... and 'off' closes them, as DELUSER does
    other = Raw(acl_node.port)
    assert other.cmd("AUTH", "carol", "cpw2") == b"+OK"
    assert ops.execute_command("ACL", "SETUSER", "carol", "off") in (b"OK", True)
    wait_for(c.closed, what="carol's connection closed after 'off'")
    wait_for(other.closed, what="carol's second connection closed after 'off'")
    assert raw(acl_node.port, b"AUTH carol cpw2\r\n", expect=10).startswith(b"-WRONGPASS")


def test_acl_deluser_disconnects_its_connections(acl_node):
    ops = as_user(acl_node, "ops", "apw")
    ops.execute_command("ACL", "SETUSER", "temp", "on", ">t", "allkeys", "+@consume")
    victim = Raw(acl_node.port)
    bystander = Raw(acl_node.port)
    assert victim.cmd("AUTH", "temp", "t") == b"+OK"
    assert bystander.cmd("AUTH", "consumer", "cpw") == b"+OK"
    assert ops.execute_command("ACL", "DELUSER", "temp", "nosuch") == 1
    wait_for(victim.closed, what="the deleted user's connection closed")
    assert bystander.cmd("ACL", "WHOAMI") == b"$8"  # still here
    assert raw(acl_node.port, b"AUTH temp t\r\n", expect=10).startswith(b"-WRONGPASS")
    with pytest.raises(redis.ResponseError, match="cannot be removed"):
        ops.execute_command("ACL", "DELUSER", "default")


def test_failed_auths_are_counted_and_close_the_connection(acl_node):
    ops = as_user(acl_node, "ops", "apw")
    before = ops.info("stats")["acl_access_denied_auth"]
    c = Raw(acl_node.port)
    for _ in range(4):
        assert c.cmd("AUTH", "orders", "guess").startswith(b"-WRONGPASS")
    assert c.cmd("AUTH", "orders", "opw") == b"+OK"  # a success starts the count again
    for _ in range(4):
        assert c.cmd("AUTH", "orders", "guess").startswith(b"-WRONGPASS")
    assert c.cmd("AUTH", "orders", "guess").startswith(b"-WRONGPASS")  # the fifth in a row ...
    wait_for(c.closed, what="the connection closed after 5 failed AUTHs in a row")  # ... closes it
    assert ops.info("stats")["acl_access_denied_auth"] == before + 9
    assert "after 5 failed AUTH attempts" in acl_node.log()


def test_without_users_every_connection_is_default_with_every_right(node):
    r = node.client()
    assert r.execute_command("ACL", "WHOAMI") == b"default"
    assert r.execute_command("ACL", "LIST") == [b"user default on nopass ~* +@all"]
    assert r.execute_command("ADDJOB", "payroll", "x", 0)
    assert raw(node.port, b"AUTH x\r\n", expect=10).startswith(b"-ERR Client sent AUTH, but no password is set")
    info = r.info("stats")
    assert info["acl_access_denied_cmd"] == info["acl_access_denied_key"] == 0


def test_config_rewrite_keeps_user_lines_and_saves_acl_changes(acl_node, tmp_path, start_node):
    ops = as_user(acl_node, "ops", "apw")
    assert ops.execute_command("CONFIG", "REWRITE") in (b"OK", True)
    text = (tmp_path / "acl.conf").read_text()
    for line in USERS.splitlines():  # nothing changed: the lines as written
        assert line in text
    ops.execute_command("ACL", "SETUSER", "newbie", "on", ">npw", "~n.*", "+@produce")
    ops.execute_command("ACL", "DELUSER", "disabled")
    assert ops.execute_command("CONFIG", "REWRITE") in (b"OK", True)
    text = (tmp_path / "acl.conf").read_text()
    assert "user newbie on #" in text and "npw" not in text and "user disabled" not in text
    acl_node.stop()
    again = start_node(config_file=str(tmp_path / "acl.conf"), port=acl_node.port)
    newbie = as_user(again, "newbie", "npw")
    assert newbie.execute_command("ADDJOB", "n.1", "x", 0)
    with pytest.raises(NOPERM, match="no permissions to access the 'other' queue"):
        newbie.execute_command("ADDJOB", "other", "x", 0)
    assert raw(again.port, b"AUTH disabled xpw\r\n", expect=10).startswith(b"-WRONGPASS")
    assert raw(again.port, b"AUTH defpw\r\n", replies=1) == b"+OK\r\n"


def test_a_bad_user_line_stops_the_node_with_a_clear_error(tmp_path):
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "disque_py.cli", "server", "--port", str(port), "--dir", str(tmp_path),
         "--user", "alice", "on", "+@nosuch"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "Error in ACL SETUSER modifier '+@nosuch'" in proc.stdout + proc.stderr


def test_the_default_users_own_rules_apply_without_requirepass(start_node, tmp_path):
    conf = tmp_path / "default.conf"
    conf.write_text("user default on nopass ~public.* +@consume\nuser admin on >apw allkeys +@all\n")
    node = start_node(config_file=str(conf))
    reply = raw(node.port, b"ADDJOB public.a x 0\r\nGETJOB NOHANG FROM public.a\r\nACL WHOAMI\r\n", replies=3)
    assert reply == (b"-NOPERM this user has no permissions to run the 'addjob' command\r\n"
                     b"*-1\r\n$7\r\ndefault\r\n")  # fmt: skip
    assert raw(node.port, b"QLEN other\r\n", expect=10).startswith(b"-NOPERM")
    assert raw(node.port, b"HELLO 3\r\nQLEN public.a\r\n", replies=2).endswith(b":0\r\n")
    admin = as_user(node, "admin", "apw")
    assert admin.execute_command("ACL", "SETUSER", "default", "off") in (b"OK", True)
    assert raw(node.port, b"QLEN public.a\r\n", expect=10).startswith(b"-NOAUTH")
    assert raw(node.port, b"HELLO 3\r\n", expect=10).startswith(b"-NOAUTH")
    assert raw(node.port, b"AUTH admin apw\r\nQLEN public.a\r\n", replies=2) == b"+OK\r\n:0\r\n"
