"""The release in the AOF (``VERSION`` records, persistence/records.py): written by real nodes,
read back, and a newer release's file refused with what to do, on real node processes."""

from __future__ import annotations

from disque_py import __version__
from disque_py.persistence import records
from disque_py.persistence.records import Queued, Version

from ..integration.conftest import start_node  # noqa: F401  (fixture)
from .test_aof_process import AOF, addjob, aof_path, failed_start, log_mark, log_since, records_of, restart, show


def kinds(path) -> list:
    return [type(r).__name__ if type(r) is not Version else r.release for _, r in records_of(path.read_bytes())]


def test_a_node_writes_its_release_first_and_again_only_after_another_one(start_node):  # noqa: F811
    node = start_node(**AOF)
    r = node.client()
    first = addjob(r, "q", b"one")
    assert node.stop() == 0
    path = aof_path(node)
    assert kinds(path) == [__version__, "LoadJob"]
    node = restart(start_node, node)
    addjob(node.client(), "q", b"two")
    assert node.stop() == 0
    assert kinds(path) == [__version__, "LoadJob", "LoadJob"]  # the same release: no second VERSION
    # a file of 0.1.0 (no VERSION record): ours before what this node appends
    data = path.read_bytes()
    path.write_bytes(data[len(records.encode_version(__version__)):])
    node = restart(start_node, node)
    addjob(node.client(), "q", b"three")
    assert show(node.client(), first)["body"] == b"one"
    assert node.stop() == 0
    assert kinds(path) == ["LoadJob", "LoadJob", __version__, "LoadJob"]


def test_a_newer_release_s_records_this_one_knows_are_loaded(start_node):  # noqa: F811
    node = start_node(**AOF)
    job_id = addjob(node.client(), "q", b"kept")
    assert node.stop() == 0
    path = aof_path(node)
    with open(path, "ab") as f:
        f.write(records.encode_version("99.0.0") + records.encode(Queued(job_id)))
    mark = log_mark(node)
    node = restart(start_node, node)
    assert "written in part by disque-py 99.0.0, newer than this node's %s: every record was read" % __version__ \
        in log_since(node, mark)  # fmt: skip
    assert show(node.client(), job_id)["body"] == b"kept"
    assert node.stop() == 0
    assert kinds(path)[-3:] == ["99.0.0", "Queued", __version__]


def test_a_newer_release_s_record_this_one_cannot_read_stops_the_node_saying_why(start_node):  # noqa: F811
    node = start_node(**AOF)
    addjob(node.client(), "q", b"kept")
    assert node.stop() == 0
    path = aof_path(node)
    future = records._finish([b"FUTUREJOB", b"something new"])  # a kind of a later release
    with open(path, "ab") as f:
        f.write(records.encode_version("99.0.0"))
        offset = f.tell()
        f.write(future)
    before = path.read_bytes()
    code, log = failed_start(node.dir, node.port, **node.directives)
    assert code != 0
    assert ("written in part by disque-py 99.0.0, newer than this node's %s, and its record at byte offset %d is "
            "one this release cannot read (unknown kind of record). Start this node with disque-py 99.0.0 or later"
            % (__version__, offset)) in log, log  # fmt: skip
    assert "Traceback" not in log
    assert path.read_bytes() == before  # nothing cut
    # without a newer VERSION before it, the same record is damage as before (check-aof's advice)
    path.write_bytes(before.replace(records.encode_version("99.0.0"), b""))
    code, log = failed_start(node.dir, node.port, **node.directives)
    assert code != 0 and "corrupt record at byte offset" in log and "check-aof --fix" in log
