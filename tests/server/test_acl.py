"""Users and rights (server/acl.py): rule parsing, matching, the check, and the command tables."""

from __future__ import annotations

import hashlib

import pytest

from disque_py.config import Config, config_set, load_config
from disque_py.core.node import Node
from disque_py.server.acl import Acl, AclError, Rights, User
from disque_py.server.app import NODE_COMMANDS

RIGHTS = Rights(NODE_COMMANDS)  # what a node's users are given rights over
CATEGORIES = RIGHTS.categories
ALL_COMMANDS = RIGHTS.all_commands
ALWAYS = RIGHTS.always
command_key = RIGHTS.command_key


def make_acl(*args) -> Acl:
    return Acl(*args, commands=NODE_COMMANDS)


def user(*rules: str) -> User:
    u = User(b"u", RIGHTS)
    for rule in rules:
        u.apply(rule.encode())
    return u


def no_jobs(job_id: bytes) -> None:
    return None


# --- every command the node answers has a place ----------------------------


def test_every_command_is_in_a_category_or_always_allowed():
    node = Node("0" * 40, seed=b"s" * 20, now=0)
    names = {spec.name for spec in NODE_COMMANDS}
    assert set(node.commands) <= names and {b"addjob", b"acl", b"config", b"cluster"} <= names
    missing = [n.decode() for n in names if n.decode() not in ALWAYS and n.decode() not in ALL_COMMANDS]
    assert missing == []
    # and no category names a command the node does not have
    known = {n.decode() for n in names} | {"client|kill", "client|list"}
    known |= {"slowlog|" + sub for sub in ("get", "len", "reset", "help")}
    known |= {"latency|" + sub for sub in ("latest", "history", "reset", "doctor", "help")}
    known |= {"worker|" + sub for sub in ("beat", "forget", "list")}
    known |= {"group|" + sub for sub in ("info", "list")}
    assert ALL_COMMANDS <= known and {k.split("|")[0] for k in ALWAYS} <= known


def test_subcommands_are_named_by_their_own_key():
    assert command_key(b"client", [b"CLIENT", b"KILL", b"ID", b"1"]) == "client|kill"
    assert command_key(b"client", [b"client", b"list"]) == "client|list"
    assert command_key(b"client", [b"CLIENT", b"SETNAME", b"x"]) == "client|setname"
    assert command_key(b"client", [b"CLIENT", b"NOPE"]) == "client"  # answered with its syntax error
    assert command_key(b"acl", [b"ACL", b"WHOAMI"]) == "acl|whoami"
    assert command_key(b"acl", [b"ACL", b"SETUSER", b"x"]) == "acl"
    assert command_key(b"addjob", [b"ADDJOB", b"q", b"b", b"0"]) == "addjob"


# --- rules -------------------------------------------------------------------


def test_a_new_user_has_nothing():
    u = User(b"x", RIGHTS)
    assert not u.enabled and not u.nopass and u.passwords == [] and u.commands == set()
    assert not u.may_use(b"q") and not u.unrestricted


def test_passwords_are_kept_as_sha256_only():
    u = user(">secret", ">other")
    digest = hashlib.sha256(b"secret").hexdigest()
    assert u.passwords == [digest, hashlib.sha256(b"other").hexdigest()]
    assert "secret" not in " ".join(u.describe())
    u.apply(b"<secret")
    assert u.passwords == [hashlib.sha256(b"other").hexdigest()]
    with pytest.raises(AclError, match="does not exist"):
        u.apply(b"<secret")
    u.apply(("#" + digest.upper()).encode())  # the digest is taken in either case
    assert digest in u.passwords
    u.apply(("!" + digest).encode())
    assert digest not in u.passwords
    with pytest.raises(AclError, match="64 characters"):
        u.apply(b"#abc")
    u.apply(b"nopass")
    assert u.nopass and u.passwords == []
    u.apply(b">x")
    assert not u.nopass  # a password ends nopass, as in Redis
    u.apply(b"resetpass")
    assert not u.nopass and u.passwords == []


def test_categories_add_and_remove_and_overlap():
    u = user("+@consume")
    assert u.commands == set(CATEGORIES["consume"])
    u.apply(b"+@produce")
    u.apply(b"-@consume")
    assert u.commands == {"addjob"}  # the queue reads went with consume, though produce has them too
    u.apply(b"+qlen")
    u.apply(b"+client|kill")
    assert u.commands == {"addjob", "qlen", "client|kill"}
    u.apply(b"-addjob")
    assert u.commands == {"qlen", "client|kill"}
    u.apply(b"allcommands")
    assert u.commands == set(ALL_COMMANDS)
    u.apply(b"nocommands")
    assert u.commands == set()
    for bad in (b"+@nosuch", b"+nosuch", b"-@", b"+ping"):  # PING is always allowed: no rule
        with pytest.raises(AclError, match="^Unknown command or category name in ACL$"):
            u.apply(bad)
    with pytest.raises(AclError, match="^Syntax error$"):
        u.apply(b"bogus")


def test_keys_and_reset():
    u = user("~orders.*", "~invoices")
    assert u.patterns == [b"orders.*", b"invoices"] and not u.allkeys
    u.apply(b"~*")
    assert u.allkeys and u.may_use(b"anything")
    u.apply(b"resetkeys")
    assert not u.allkeys and not u.may_use(b"orders.x")
    u = user("on", ">pw", "allkeys", "+@all", "reset")
    assert (u.enabled, u.passwords, u.allkeys, u.commands) == (False, [], False, set())
    assert user("allkeys", "allcommands").unrestricted
    assert not user("allkeys", "+@produce").unrestricted


@pytest.mark.parametrize("pattern,queue,ok", [
    (b"orders.*", b"orders.x", True),
    (b"orders.*", b"orders.", True),
    (b"orders.*", b"payroll", False),
    (b"orders.*", b"xorders.a", False),
    (b"q?", b"q1", True),
    (b"q?", b"q12", False),
    (b"q[a-c]", b"qb", True),
    (b"q[^a-c]", b"qb", False),
    (b"a\\*", b"a*", True),
    (b"a\\*", b"ab", False),
])  # fmt: skip
def test_patterns_are_redis_globs(pattern, queue, ok):
    assert User(b"x", RIGHTS).may_use(queue) is False
    assert user("~" + pattern.decode()).may_use(queue) is ok


def test_describe_reads_back_as_the_same_user():
    for rules in (
        ["on", ">a", ">b", "~orders.*", "~x", "+@produce", "+@consume"],
        ["off", "nopass", "allkeys", "+@all"],
        ["on", "#" + "ab" * 32, "+@inspect", "+deljob"],
        [],
    ):
        u = user(*rules)
        again = make_acl("", [["u", *u.describe()]]).users[b"u"]
        assert again.describe() == u.describe()
        assert (again.enabled, again.nopass, again.passwords, again.commands, again.patterns, again.allkeys) == (
            u.enabled, u.nopass, u.passwords, u.commands, u.patterns, u.allkeys)


# --- the table -----------------------------------------------------------------


def test_default_user_follows_requirepass():
    acl = make_acl("")
    assert acl.default_open and acl.perms_of(acl.default) is None  # as before: no AUTH, never checked
    assert acl.authenticate(b"default", b"anything") is acl.default
    acl = make_acl("pw")
    assert not acl.default_open
    assert acl.authenticate(b"default", b"pw") is acl.default
    assert acl.authenticate(b"default", b"nope") is None
    cfg = load_config(None, ["--requirepass", "first"])
    acl = Acl.from_config(cfg, NODE_COMMANDS)
    assert acl.authenticate(b"default", b"first")
    config_set(cfg, b"requirepass", b"second")
    assert acl.authenticate(b"default", b"second") and not acl.authenticate(b"default", b"first")
    config_set(cfg, b"requirepass", b"")
    assert acl.default_open


def test_users_from_config_lines():
    cfg = load_config(None, ["--user", "alice", "on", ">secret", "~orders.*", "+@produce",
                             "--user", "bob", "on", "nopass", "+@consume", "allkeys"])  # fmt: skip
    assert cfg.user == [["alice", "on", ">secret", "~orders.*", "+@produce"],
                        ["bob", "on", "nopass", "+@consume", "allkeys"]]  # fmt: skip
    acl = Acl.from_config(cfg, NODE_COMMANDS)
    assert sorted(acl.users) == [b"alice", b"bob", b"default"]
    assert acl.authenticate(b"alice", b"secret").name == b"alice"
    assert acl.authenticate(b"alice", b"wrong") is None
    assert acl.authenticate(b"bob", b"whatever").name == b"bob"
    assert acl.authenticate(b"carol", b"secret") is None
    with pytest.raises(AclError, match="modifier 'bogus'"):
        make_acl("", [["x", "on", "bogus"]])


def test_setuser_is_all_or_nothing_and_keeps_the_object():
    acl = make_acl("")
    u, existed = acl.setuser(b"alice", [b"on", b">pw", b"+@produce", b"~q*"])
    assert not existed
    with pytest.raises(AclError, match="Error in ACL SETUSER modifier '\\+@nosuch'"):
        acl.setuser(b"alice", [b"-@produce", b"+@nosuch"])
    assert u.commands == set(CATEGORIES["produce"])  # nothing applied
    same, existed = acl.setuser(b"alice", [b"+@consume", b"off"])
    assert same is u and existed and not u.enabled and "getjob" in u.commands
    assert acl.authenticate(b"alice", b"pw") is None  # off
    with pytest.raises(AclError, match="Usernames can't contain spaces or null characters"):
        acl.setuser(b"has space", [])
    with pytest.raises(AclError, match="cannot be removed"):
        acl.deluser(b"default")
    assert acl.deluser(b"alice") and not acl.deluser(b"alice")


def test_check_commands_and_queues():
    acl = make_acl("")
    consumer = user("on", "allkeys", "+@consume")
    assert acl.check(consumer, b"addjob", [b"ADDJOB", b"q", b"b", b"0"], no_jobs) == (
        "cmd", "NOPERM this user has no permissions to run the 'addjob' command")
    assert acl.check(consumer, b"getjob", [b"GETJOB", b"FROM", b"q"], no_jobs) is None
    assert acl.check(consumer, b"ackjob", [b"ACKJOB", b"D-unknown"], no_jobs) is None  # allkeys: as before
    orders = user("on", "~orders.*", "+@produce", "+@consume")
    assert acl.check(orders, b"addjob", [b"ADDJOB", b"orders.x", b"b", b"0"], no_jobs) is None
    assert acl.check(orders, b"addjob", [b"ADDJOB", b"payroll", b"b", b"0"], no_jobs) == (
        "key", "NOPERM this user has no permissions to access the 'payroll' queue")
    getjob = [b"GETJOB", b"NOHANG", b"COUNT", b"2", b"from", b"orders.a", b"payroll"]
    assert acl.check(orders, b"getjob", getjob, no_jobs)[1].endswith("'payroll' queue")
    assert acl.check(orders, b"getjob", getjob[:-1], no_jobs) is None
    assert acl.check(orders, b"qlen", [b"QLEN", b"payroll"], no_jobs)[0] == "key"
    queues = {b"D-1": b"orders.a", b"D-2": b"payroll"}
    assert acl.check(orders, b"ackjob", [b"ACKJOB", b"D-1"], queues.get) is None
    assert acl.check(orders, b"ackjob", [b"ACKJOB", b"D-1", b"D-2"], queues.get)[1].endswith("'payroll' queue")
    assert "not known to this node" in acl.check(orders, b"show", [b"SHOW", b"D-3"], queues.get)[1]
    assert acl.check(orders, b"qscan", [b"QSCAN"], no_jobs)[0] == "cmd"  # not in its categories
    inspector = user("on", "~orders.*", "+@inspect")
    assert acl.check(inspector, b"qscan", [b"QSCAN"], no_jobs)[0] == "key"  # needs allkeys
    assert acl.check(user("on", "allkeys", "+@inspect"), b"jscan", [b"JSCAN"], no_jobs) is None
    nobody = user("on")
    for argv in ([b"PING"], [b"AUTH", b"a", b"b"], [b"HELLO"], [b"CLIENT", b"SETNAME", b"x"],
                 [b"ACL", b"WHOAMI"], [b"QUIT"], [b"COMMAND"]):  # fmt: skip
        assert acl.check(nobody, argv[0].lower(), argv, no_jobs) is None, argv
    for argv in ([b"CONFIG", b"GET", b"*"], [b"CLIENT", b"KILL", b"ID", b"1"], [b"CLIENT", b"LIST"],
                 [b"ACL", b"LIST"], [b"DEBUG", b"FLUSHALL"], [b"SHUTDOWN"], [b"CLUSTER", b"INFO"]):  # fmt: skip
        assert acl.check(orders, argv[0].lower(), argv, no_jobs)[0] == "cmd", argv


def test_config_rewrite_keeps_user_lines_and_saves_changed_users(tmp_path):
    from disque_py.config import rewrite_config

    path = tmp_path / "d.conf"
    original = "# users\nuser alice on >secret ~orders.* +@produce\nport 7711\nuser bob on nopass allkeys +@consume\n"
    path.write_text(original)
    cfg = load_config(str(path))
    acl = Acl.from_config(cfg, NODE_COMMANDS)
    rewrite_config(cfg)
    assert path.read_text() == original  # unchanged users: the lines as written (plain password included)
    acl.setuser(b"carol", [b"on", b">pw", b"~q*", b"+@inspect"])
    acl.deluser(b"bob")
    cfg.user = acl.config_lines()  # as ACL SETUSER / DELUSER do
    rewrite_config(cfg)
    text = path.read_text()
    assert "secret" not in text and "bob" not in text and "port 7711" in text
    assert text.index("user alice") < text.index("user carol") < text.index("port 7711")  # where they were
    again = Acl.from_config(load_config(str(path)), NODE_COMMANDS)
    assert sorted(again.users) == [b"alice", b"carol", b"default"]
    assert again.authenticate(b"alice", b"secret") and again.authenticate(b"carol", b"pw")
    assert again.users[b"carol"].describe() == acl.users[b"carol"].describe()


def test_config_lines_leave_out_the_default_user_requirepass_makes():
    assert make_acl("").config_lines() == [] and make_acl("pw").config_lines() == []
    acl = make_acl("pw")
    acl.setuser(b"default", [b"-@admin"])
    assert acl.config_lines()[0][:2] == ["default", "on"]
