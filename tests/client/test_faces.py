"""One client, two faces: both clients are made from one declaration of each command and of
the settings (``client/commands.py``, listed in ``client/base.py``; ``ClientConfig``).

* every command of the declarations is a method of both faces with the declaration's
  signature, docstring and options, a coroutine on the trio face (the check is first shown
  to catch a face written by hand that fell behind);
* the constructors of both faces are ``ClientConfig``'s;
* a type checker sees each face's results and refuses a misspelled option or setting;
* on a real node, each face sends exactly the ADDJOB its declaration builds, every option
  given (the node's slow log shows what it received).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import uuid

import pytest
import trio

from disque_py import AsyncClient, Client, ClientConfig
from disque_py.client import commands as cmd
from disque_py.client.base import ClientBase, _Declared

from .conftest import ROOT, addr

FACES = {"blocking": Client, "trio": AsyncClient}


def declarations() -> dict[str, _Declared]:
    return {name: d for name, d in vars(ClientBase).items() if isinstance(d, _Declared)}


def behind(face: type, awaited: bool) -> list[str]:
    """What ``face`` lacks or has otherwise than the declarations: one line each."""
    out = []
    for name, declared in declarations().items():
        method = getattr(face, name, None)
        if method is None:
            out.append("%s: no method" % name)
            continue
        want = list(inspect.signature(declared.build).parameters.values())[declared.skip :]
        have = list(inspect.signature(method).parameters.values())[1:]
        for param in want:
            got = next((p for p in have if p.name == param.name), None)
            if got is None:
                out.append("%s: no %s" % (name, param.name))
            elif (got.kind, got.default, got.annotation) != (param.kind, param.default, param.annotation):
                out.append("%s: %s is %s, declared %s" % (name, param.name, got, param))
        out += ["%s: %s is not declared" % (name, p.name) for p in have if p.name not in {w.name for w in want}]
        if inspect.getdoc(method) != inspect.getdoc(declared.build):
            out.append("%s: another docstring" % name)
        is_async = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
        if is_async != awaited:
            out.append("%s: %s" % (name, "not awaitable" if awaited else "awaitable"))
    return out


def test_both_faces_have_every_command_as_declared():
    assert {"add_job", "add_jobs", "get_jobs", "ack", "nack", "release", "qscan", "jscan", "pipeline",
            "execute"} <= set(declarations())  # fmt: skip
    assert behind(Client, awaited=False) == []
    assert behind(AsyncClient, awaited=True) == []
    for name, declared in declarations().items():
        assert Client.__dict__[name].__wrapped__ is AsyncClient.__dict__[name].__wrapped__ is declared.build
    # scans: an iterator on one face, an async iterator on the other
    assert inspect.isgeneratorfunction(Client.qscan) and inspect.isasyncgenfunction(AsyncClient.jscan)
    # what is not a command is each face's own: connecting, closing, HELLO (it teaches the node list)
    own = {name for name in dir(Client) if not name.startswith("_")} ^ {n for n in dir(AsyncClient) if not n.startswith("_")}
    assert own == {"close", "aclose", "on_other_nodes"}


def test_a_face_written_by_hand_that_fell_behind_is_caught():
    class Stale(Client):  # an ADDJOB option and a command the declarations have, missing here
        def add_job(self, queue, body, *, timeout_ms=5000, replicate=None, delay=None, retry=None, ttl=None,
                    maxlen=None, async_=False, backoff=None, maxdeliver=None, deadletter=None):  # fmt: skip
            """ADDJOB, as it was."""
            return self._call(cmd.addjob(queue, body, timeout_ms=timeout_ms))

    problems = behind(Stale, awaited=False)
    assert "add_job: no dedup" in problems and "add_job: another docstring" in problems
    assert any(p.startswith("add_job: timeout_ms is") for p in problems)  # no annotation: not as declared
    assert all(p.startswith("add_job: ") for p in problems)  # the rest is made from the declarations
    assert "fast_ack: no method" in behind(type("Bare", (), {}), awaited=False)
    assert behind(AsyncClient, awaited=False)[:1] == ["add_job: awaitable"]


def test_nacks_trace_is_on_both_faces():
    for face in FACES.values():
        assert list(inspect.signature(face.nack).parameters)[1:] == ["ids", "delay", "reason", "trace", "dead"]


def test_every_addjob_option_is_on_both_faces_as_declared():
    options = [p for p in inspect.signature(cmd.addjob).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert {"timeout_ms", "retry", "dedup"} <= {p.name for p in options}
    for face in FACES.values():
        params = inspect.signature(face.add_job).parameters
        assert [params[p.name] for p in options] == options


def test_the_settings_are_declared_once():
    declared = list(inspect.signature(ClientConfig).parameters.values())
    assert "max_retries" in [p.name for p in declared] and len(declared) == 23
    for face in FACES.values():
        assert list(inspect.signature(face).parameters.values()) == declared
    sync = Client("127.0.0.1:1", max_retries=2, failover_timeout=0.5, affinity=True, username="u", password="p")
    assert (sync.config.max_retries, sync.config.failover_timeout, sync.config.username) == (2, 0.5, "u")
    aio = AsyncClient.from_config(sync.config, max_idle=3)
    assert (aio.config.max_retries, aio.config.failover_timeout, aio.config.password, aio.max_idle) == (2, 0.5, "p", 3)
    assert aio.config.affinity is not None and aio.config.affinity is not sync.config.affinity  # a fresh one
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_retrys'"):
        Client(max_retrys=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_retrys'"):
        AsyncClient(max_retrys=2)


MYPY_SNIPPET = """
    from disque_py import AsyncClient, Client

    c = Client("127.0.0.1:7711", max_retries=2)
    reveal_type(c.add_job("q", b"x", retry=3, dedup="k"))
    reveal_type(c.get_jobs("q", count=2))
    reveal_type(c.qscan(count=10))
    reveal_type(c.add_jobs("q", [b"a"], batch=10))

    async def trio_face(a: AsyncClient) -> None:
        adding = a.add_job("q", b"x")
        print(reveal_type(adding))
        reveal_type(await adding)
        reveal_type(await a.get_job("q", timeout_ms=10))
        reveal_type(a.jscan(queue="q"))
        await a.nack("D-1", delay="1")

    Client("127.0.0.1:7711", max_retrys=2)
    c.add_job("q", b"x", retries=3)
    AsyncClient(socket_timeout="5")
"""


def test_a_type_checker_sees_each_face_and_refuses_a_misspelled_option(tmp_path):
    snippet = tmp_path / "use.py"
    snippet.write_text(textwrap.dedent(MYPY_SNIPPET))
    cmdline = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-error-summary",
               "--cache-dir", str(tmp_path / "cache"), str(snippet)]  # fmt: skip
    out = subprocess.run(cmdline, capture_output=True, text=True, timeout=300, cwd=str(ROOT)).stdout
    notes = [line.split("Revealed type is ")[1].strip('"') for line in out.splitlines() if "Revealed type" in line]
    assert notes == [
        "str",
        "list[disque_py.client.model.Job]",
        "typing.Iterator[str]",
        "list[str]",
        "typing.Coroutine[Any, Any, str]",
        "str",
        "disque_py.client.model.Job | None",
        "typing.AsyncIterator[Any]",
    ], out
    errors = [line.partition(": error: ")[2] for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 4, out
    assert errors[0].startswith('Argument "delay" has incompatible type "str"; expected "float | None"')
    assert errors[1].startswith('Unexpected keyword argument "max_retrys" for "Client"')
    assert errors[2].startswith('Unexpected keyword argument "retries"')
    assert errors[3].startswith('Argument "socket_timeout" to "Client" has incompatible type "str"')


SAMPLES = {
    "timeout_ms": 2000, "replicate": 1, "delay": 1, "retry": 30, "ttl": 600, "maxlen": 100, "async_": True,
    "backoff": (0.5, 2), "maxdeliver": 3, "deadletter": "faces.dead", "priority": 7, "group": "tenant-7",
}  # fmt: skip


def wire(argv: tuple) -> list[bytes]:
    return [a if isinstance(a, bytes) else str(a).encode() for a in argv]


async def test_each_face_sends_the_addjob_its_declaration_builds(start_node):
    node = start_node(slowlog_log_slower_than=0, slowlog_max_len=1000)
    q = "faces-" + uuid.uuid4().hex[:8]
    options = {p for p in inspect.signature(cmd.addjob).parameters if p not in ("queue", "body")}
    assert set(SAMPLES) | {"dedup"} == options, "give every ADDJOB option a value to send here"
    raw = node.client(protocol=2)
    sent = {}
    with Client(addr(node)) as sync:
        sent["blocking"] = sync.add_job(q, b"from the blocking face", dedup="b", **SAMPLES)
    async with AsyncClient(addr(node)) as aio:
        sent["trio"] = await aio.add_job(q, b"from the trio face", dedup="t", **SAMPLES)
    logged = [entry[3] for entry in raw.execute_command("SLOWLOG", "GET", 1000) if entry[3][:1] == [b"ADDJOB"]]
    assert logged[::-1] == [
        wire(cmd.addjob(q, b"from the blocking face", dedup="b", **SAMPLES).argv),
        wire(cmd.addjob(q, b"from the trio face", dedup="t", **SAMPLES).argv),
    ]
    for job_id in sent.values():
        show = raw.execute_command("SHOW", job_id)
        fields = dict(zip(show[::2], show[1::2]))
        assert (fields[b"retry"], fields[b"ttl"] <= 600, fields[b"maxdeliver"]) == (30, True, 3)
        assert fields[b"priority"] == 7 and fields[b"group"] == b"tenant-7"


def test_a_scan_checks_its_options_before_the_first_page():
    client = Client("127.0.0.1:1", failover_timeout=0.1)  # never connects: the check comes first
    with pytest.raises(ValueError, match="unknown job state 'gone'"):
        next(client.jscan(states="gone"))

    async def trio_face() -> None:
        with pytest.raises(ValueError, match="reply must be 'id' or 'all'"):
            await AsyncClient("127.0.0.1:1").jscan(reply="ids").__anext__()

    trio.run(trio_face)
