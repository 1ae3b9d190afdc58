"""``scripts/bench aof`` (scripts/benchmarks/bench_aof.py): its options, its load file and its report
(the runs themselves are measured, not tested)."""

from __future__ import annotations

import pytest

from benchmarks.bench_aof import MODES, AofBench, markdown_report, parse_args, sizes_of, write_load_file
from disque_py.core.job import QUEUED
from disque_py.persistence.records import LoadJob, RecordReader

NODE = "0123456789abcdef0123456789abcdef01234567"


def test_options_default_quick_and_refused(capsys):
    a = parse_args([])
    assert a.suites == ["throughput", "load"] and a.disque_server is None and a.servers_measured is None
    sizes, rounds, jobs = sizes_of(a)
    assert (sizes.n_p1, sizes.n_p32, rounds, jobs) == (100_000, 500_000, 2, 1_000_000)
    sizes, rounds, jobs = sizes_of(parse_args(["--quick", "--only", "load", "--jobs", "500"]))
    assert (sizes.n_p1, sizes.n_p32, rounds, jobs) == (2_000, 10_000, 1, 500)
    assert MODES["always"] == ["--appendonly", "yes", "--appendfsync", "always"] and MODES["off"][1] == "no"
    for bad, why in ((["--only", "addjob"], "unknown suite(s) addjob"),
                     (["--servers", "disque"], "--servers disque needs --disque-server"),
                     (["--servers", "redis"], "--servers: a comma-separated list of disque-py, disque"),
                     (["--jobs", "0"], "--jobs must be >= 1"),
                     (["--write-aof", "x.aof"], "--write-aof needs --node-id"),
                     (["--write-aof", "x.aof", "--node-id", "short"], "--write-aof needs --node-id"),
                     (["--disque-server", "/nonexistent/disque-server"], "--disque-server /nonexistent/disque-server: no such executable")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            parse_args(bad)
        assert exc.value.code == 2, bad
        assert "scripts/bench aof: error: " + why in capsys.readouterr().err, bad


def test_the_load_file_holds_the_nodes_own_single_copy_queued_jobs(tmp_path):
    path = tmp_path / "disque.aof"
    size = write_load_file(path, NODE, 250, body_size=20, queues=7, now_ms=1_800_000_000_000)
    data = path.read_bytes()
    assert len(data) == size
    reader = RecordReader()
    recs = [r for _, r in reader.feed(data)]
    assert reader.finish() is None and len(recs) == 250
    assert all(type(r) is LoadJob for r in recs)
    assert len({r.id for r in recs}) == 250 and all(r.id.startswith(b"D-01234567-") for r in recs)
    assert {(r.state, r.repl, r.nodes, len(r.body)) for r in recs} == {(QUEUED, 1, (NODE,), 20)}
    assert {r.queue for r in recs} == {b"queue-%d" % i for i in range(7)}
    assert {r.expire for r in recs} == {1_800_000_000_000 + 86_400_000}
    with pytest.raises(ValueError, match="a node ID has 40 characters"):
        write_load_file(path, "short", 1)


def test_the_report_puts_both_servers_and_their_ratios_side_by_side(tmp_path):
    from benchmarks.common import Sizes

    bench = AofBench(Sizes(), 17711, disque_server="/bin/true", tmp=tmp_path)
    for kind, scale in (("disque-py", 1.0), ("disque", 4.0)):
        for name in ("p1", "p32"):
            for mode, rate in (("off", 1000), ("no", 900), ("everysec", 800), ("always", 200)):
                bench.results[bench.key(kind, "aof_%s_%s" % (mode, name))] = {"requests_per_s": rate * scale}
        bench.results[bench.key(kind, "aof_load")] = {"jobs": 1000, "aof_bytes": 5000, "ping_s": 0.5,
                                                      "loaded_s": 1.0, "jobs_per_s": 1000 * scale}  # fmt: skip
    report = markdown_report(bench, {"nproc": 2})
    assert "| disque-py | 1 | 1,000/s | 900/s | 800/s | 200/s | 0.80 | 0.25 |" in report
    assert "| disque | 32 | 4,000/s | 3,600/s | 3,200/s | 800/s | 0.80 | 0.25 |" in report
    assert "| 1 | 0.25 | 0.25 | 0.25 | 0.25 |" in report
    assert "Load rate disque-py / Disque: 0.25." in report


def test_redis_server_as_a_yardstick_runs_under_the_same_aof_settings_and_gets_its_ratios(tmp_path):
    from benchmarks.common import Sizes

    a = parse_args(["--servers", "disque-py,redis-server", "--only", "throughput"])
    assert a.servers_measured == ("disque-py", "redis-server")
    bench = AofBench(Sizes(), 17711, servers_measured=a.servers_measured, tmp=tmp_path)
    assert bench.kinds() == ["disque-py", "redis-server"]
    assert bench.key("redis-server", "aof_always_p1") == "redis_aof_always_p1"
    assert bench.key("disque", "aof_always_p1") == "ref_aof_always_p1" and bench.key("disque-py", "x") == "x"
    bench.aof_flags = list(MODES["always"])
    argv = bench.server_argv("redis-server", 17711, tmp_path)
    assert "redis-server" in argv and argv[-4:] == MODES["always"] and "--save" in argv
    for kind, scale in (("disque-py", 1.0), ("redis-server", 5.0)):
        for name in ("p1", "p32"):
            for mode in MODES:
                bench.results[bench.key(kind, "aof_%s_%s" % (mode, name))] = {"requests_per_s": 1000 * scale}
    report = markdown_report(bench, {"nproc": 2})
    assert "disque-py / redis-server (LPUSH), same runs:" in report and "disque-py / Disque" not in report
    assert "| 32 | 0.20 | 0.20 | 0.20 | 0.20 |" in report
    assert "| redis-server | 1 | 5,000/s |" in report
