"""The benchmark's maximum-rate search (the runs themselves are measured, not tested)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.bench import Bench
from benchmarks.common import Sizes

# The benchmark tests start clusters on a base port and fixed shifts from it (+100, +200, the
# bus +10000): each takes a range found free when it starts (the other tests take random free
# ports from the same range, tests/integration/conftest.py), and under pytest-xdist they run in
# one worker, one after the other.
pytestmark = pytest.mark.xdist_group("bench-ports")


def base_port() -> int:
    from tests.integration.conftest import consecutive_free_ports

    return consecutive_free_ports(256)


class _Searcher:
    """Just what Bench.fed_ramps needs; each step passes when the rate is at most the placement's limit."""

    def __init__(self, cross_limit: float, same_limit: float, fast: dict[bool, float] | None = None) -> None:
        self.sizes = Sizes()
        self.limits = {False: cross_limit, True: same_limit}
        # p99 is 1 ms up to this rate and 50 ms above it (default: always 1 ms)
        self.fast = fast or {False: float("inf"), True: float("inf")}
        self.calls: list[tuple[str, float]] = []
        self.replicates: set[int] = set()
        self._ramp_plan = Bench._ramp_plan.__get__(self)

    def fed_run(self, rate: float, replicate: int, duration: float, *, same_node: bool = False) -> dict:
        self.calls.append(("A->A" if same_node else "B->A", rate))
        self.replicates.add(replicate)
        p99 = 1.0 if rate <= self.fast[same_node] else 50.0
        return {"rate": rate, "ok": rate <= self.limits[same_node], "p99_ms": p99}


def test_ramps_alternate_and_find_each_maximum():
    s = _Searcher(cross_limit=6000, same_limit=20000)
    out = Bench.fed_ramps(s)
    assert (out[False]["max_rate"], out[False]["first_failed_rate"]) == (5750, 6400)
    assert (out[True]["max_rate"], out[True]["first_failed_rate"]) == (19400, 21600)
    # strictly alternating while both searches run, the longer one alone after
    where = [w for w, _ in s.calls]
    n_cross = len(out[False]["steps"])
    assert where[: 2 * n_cross] == ["B->A", "A->A"] * n_cross
    assert set(where[2 * n_cross:]) == {"A->A"}
    assert out[False]["best"] == {"rate": 5750, "ok": True, "p99_ms": 1.0}
    assert [st["rate"] for st in out[True]["steps"]] == [r for w, r in s.calls if w == "A->A"]


def test_ramps_search_with_the_replicate_asked_for():
    s = _Searcher(cross_limit=6000, same_limit=20000)
    out = Bench.fed_ramps(s, replicate=3)
    assert s.replicates == {3}
    assert out[False]["replicate"] == out[True]["replicate"] == 3


def test_federation_layouts_pin_the_nodes_where_they_say():
    """Real nodes: the federation suite's default layout keeps A on the server CPU, B on the client CPU and
    lets C run on either; node-per-core pins C to the client CPU too; one-core (and the replication and
    queues suites, whatever --fed-layout says) keeps all three on the server CPU."""
    import os

    from benchmarks.common import CLIENT_CPU, SERVER_CPU

    server, client = int(SERVER_CPU), int(CLIENT_CPU)
    assert Bench(Sizes(), base_port()).fed_layout == "pair-per-core"
    for layout, expected in (("pair-per-core", [[server], [client], sorted({server, client})]),
                             ("node-per-core", [[server], [client], [client]]),
                             ("one-core", [[server]] * 3), (None, [[server]] * 3)):  # fmt: skip
        bench = Bench(Sizes(), base_port())
        try:
            nodes = bench.start_fed_cluster("layout", **({"layout": layout} if layout else {}))
            assert [sorted(os.sched_getaffinity(n.proc.pid)) for n in nodes] == expected
        finally:
            bench.stop_all()


def _search(where: str, replicate: int, top: int, steps: list[tuple[int, float]], limit: float | None) -> dict:
    return {"where": where, "replicate": replicate, "max_rate": top, "first_failed_rate": None, "best": None,
            "p99_limit_ms": limit, "steps": [{"rate": r, "ok": True, "p99_ms": p99, "achieved_per_s": r,
                                              "missing": 0, "duplicates": 0, "unexpected": 0, "addjob_errors": 0,
                                              "jobs_produced": 10, "client_cpu_pct": 1.0}
                                             for r, p99 in steps]}  # fmt: skip


def test_report_judges_each_replicate_by_the_maximum_every_run_kept():
    """The target's maximum is, for each placement alike, the highest rate at which every run (both searches'
    steps, and the fixed runs) kept p99 under 10 ms, at that rate and below: a ceiling-search step over 10 ms
    at a rate under a search's maximum cuts it, on the cross-node side and on the same-node side."""
    from benchmarks.federation import fed_kept_max, federation_report

    for layout in ("one-core", "node-per-core", "pair-per-core"):
        bench = Bench(Sizes(), base_port(), fed_layout=layout)
        res = bench.results
        # REPLICATE 1: the searches alone give 900 vs 1,000, but the cross-node ceiling search had 20 ms at
        # 800/s, so the cross-node maximum is 600/s: 60 %
        res["fed_fast_cross_r1"] = _search("B->A", 1, 900, [(600, 1.0), (900, 2.0)], 10.0)
        res["fed_fast_same_r1"] = _search("A->A", 1, 1000, [(600, 1.0), (1000, 2.0)], 10.0)
        res["fed_max_cross_r1"] = _search("B->A", 1, 1500, [(800, 20.0), (1500, 300.0)], None)
        res["fed_max_same_r1"] = _search("A->A", 1, 1600, [(800, 1.0), (1600, 300.0)], None)
        # REPLICATE 3: the searches alone give 750 vs 1,000 (75 %), but the same-node ceiling search had 30 ms
        # at 900/s, so the same-node maximum is 500/s: 150 %
        res["fed_fast_cross_r3"] = _search("B->A", 3, 750, [(500, 3.0), (750, 4.0)], 10.0)
        res["fed_fast_same_r3"] = _search("A->A", 3, 1000, [(500, 3.0), (1000, 3.0)], 10.0)
        res["fed_max_same_r3"] = _search("A->A", 3, 1200, [(900, 30.0), (1200, 200.0)], None)
        report = "\n".join(federation_report(bench))
        assert "Federation (layout %s)" % layout in report
        assert "the target's maximum), REPLICATE 1" in report and "Throughput ceiling, REPLICATE 1" in report
        assert ("| Max with p99 < 10 ms in every run at it and below, B → A vs A → A, REPLICATE 1 (the "
                "latency-bounded search alone: 900 vs 1,000) | 600 vs 1,000 jobs/s = 60% | — | >= 80% | **NO** |"
                ) in report  # fmt: skip
        assert ("| Max with p99 < 10 ms in every run at it and below, B → A vs A → A, REPLICATE 3 (the "
                "latency-bounded search alone: 750 vs 1,000) | 750 vs 500 jobs/s = 150% | — | >= 80% | yes |"
                ) in report  # fmt: skip
        rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| p99 < 10 ms at every")}
        r1 = next(v for k, v in rows.items() if "REPLICATE 1" in k)
        r3 = next(v for k, v in rows.items() if "REPLICATE 3" in k)
        assert "| 600/s: 1.00 ms |" in r1 and "800" not in r1 and r1.endswith("| yes |")
        assert "500/s: 3.00 ms; 750/s: 4.00 ms" in r3 and r3.endswith("| yes |")
        assert ("| Throughput ceiling (p99 <= 1000 ms), B → A vs A → A, REPLICATE 1 (for reading the rows above) "
                "| 1,500 vs 1,600 jobs/s = 94% | — | — | — |") in report
    # a rate counts only if every run at it passed, and nothing above the first rate that did not
    steps = _search("B->A", 1, 0, [(100, 1.0), (200, 2.0), (300, 3.0)], 10.0)["steps"]
    assert fed_kept_max(steps) == 300
    assert fed_kept_max(steps + [dict(steps[1], p99_ms=12.0)]) == 100
    assert fed_kept_max(steps + [dict(steps[2], missing=1)]) == 200
    assert fed_kept_max(steps + [dict(steps[2], achieved_per_s=250)]) == 200
    assert fed_kept_max([dict(steps[0], p99_ms=None)]) == 0


def test_ramp_replicates_option():
    import argparse

    import pytest

    from benchmarks.federation import _replicates

    assert _replicates("1,3") == (1, 3) and _replicates("2") == (2,)
    for bad in ("", "0", "4"):
        with pytest.raises(argparse.ArgumentTypeError, match="^REPLICATE factors from 1 to 3, e.g. 1,3: '%s'$" % bad):
            _replicates(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="^comma-separated REPLICATE factors, e.g. 1,3: '1,x'$"):
        _replicates("1,x")


def test_a_failing_start_goes_down():
    s = _Searcher(cross_limit=300, same_limit=100000)
    out = Bench.fed_ramps(s)
    assert out[False]["max_rate"] is not None and out[False]["max_rate"] <= 300
    assert out[False]["first_failed_rate"] is not None and out[False]["first_failed_rate"] > out[False]["max_rate"]


def test_a_p99_limit_makes_steps_over_it_fail():
    s = _Searcher(cross_limit=6000, same_limit=20000, fast={False: 3000, True: 12000})
    out = Bench.fed_ramps(s, p99_limit_ms=10.0)
    assert out[False]["max_rate"] <= 3000 < out[False]["first_failed_rate"]
    assert out[True]["max_rate"] <= 12000 < out[True]["first_failed_rate"]
    assert out[False]["p99_limit_ms"] == 10.0
    failed = next(st for st in out[False]["steps"] if st["rate"] == out[False]["first_failed_rate"])
    assert failed["ok"] is False and failed["p99_ms"] == 50.0  # sustained, but over the latency limit
    # without the limit the same runs find the sustained maxima
    assert Bench.fed_ramps(_Searcher(6000, 20000, {False: 3000, True: 12000}))[False]["max_rate"] == 5750


def test_missing_jobs_still_held_by_a_node_are_told_apart():
    from benchmarks.federation import _fed_tally

    base = {"duplicates": 0, "unexpected": 0, "addjob_errors": 0}
    told = _fed_tally({**base, "missing": 12, "missing_states": {"queued": 9, "active": 2, "absent": 1}})
    assert told.startswith("12 missing (9 still queued; 2 delivered to a consumer that had stopped reading")
    assert "; 1 on no node: lost)" in told
    assert "lost" not in _fed_tally({**base, "missing": 3, "missing_states": {"queued": 3, "absent": 0}})
    # results saved before the SHOW lookup: queue lengths only
    assert _fed_tally({**base, "missing": 7, "still_queued": 7}).startswith(
        "7 missing (7 of them still queued when the client stopped waiting)")
    assert _fed_tally({**base, "missing": 7, "still_queued": 0}).startswith("7 missing, 0 duplicates")
    assert _fed_tally({**base, "missing": 0, "still_queued": 4}).startswith("0 missing, 0 duplicates")


def test_missing_job_states_are_looked_up_on_every_node(tmp_path):
    """A real node: one job queued, one delivered and not acknowledged, one ID that no node has."""
    from benchmarks.bench import Bench

    from .integration.conftest import NodeProcess

    node = NodeProcess(tmp_path).start()
    try:
        r = node.client()
        queued = [r.execute_command("ADDJOB", "q", "a", 0).decode() for _ in range(3)]
        active = [r.execute_command("ADDJOB", "q2", "b", 0).decode() for _ in range(2)]
        assert sorted(j[1].decode() for j in r.execute_command("GETJOB", "COUNT", 2, "FROM", "q2")) == sorted(active)
        lost = queued[0][:-8] + "ABCD" + queued[0][-4:]
        # pipelined in chunks; a job seen on two nodes counts once
        states = Bench._fed_states([node, node], [lost, *active, *queued], chunk=4)
        assert states == {"queued": 3, "active": 2, "absent": 1}
    finally:
        node.stop()

def test_the_reference_measured_here_is_shown_beside_the_issue_figure():
    from benchmarks.replication import replication_report

    def latency_run(rps: float, p50: float, p99: float) -> dict:
        return {"requests_per_s": rps, "p50_ms": p50, "p99_ms": p99, "clients": 50, "n": 100000,
                "node_cpu_pct": [60.0, 20.0, 20.0]}  # fmt: skip

    bench = Bench(Sizes(), 17711)
    bench.results["repl_addjob"] = latency_run(15000, 2.5, 6.0)
    table = "\n".join(replication_report(bench))
    assert "| ~52k/s, p50 0.86 ms |" in table and "here:" not in table  # no --disque-server: the issue's figure
    bench.results["ref_repl_addjob"] = latency_run(29806, 1.48, 3.58)
    table = "\n".join(replication_report(bench))
    assert "here: 29,806/s, p50 / p99 1.48 ms / 3.58 ms (issue: ~52k/s, p50 0.86 ms)" in table
    assert "Disque 1.0-rc1 node CPU (origin / others), same runs: ADDJOB REPLICATE 3 60% / 20% / 20%." in table


def test_a_missing_reference_binary_is_refused_before_anything_starts(capsys):
    import pytest

    from benchmarks.bench import main

    with pytest.raises(SystemExit) as exc:
        main(["--only", "addjob", "--disque-server", "/nonexistent/disque-server"])
    assert exc.value.code == 2
    assert "--disque-server /nonexistent/disque-server: no such executable" in capsys.readouterr().err


def test_the_federation_load_generator_runs_with_the_scheduling_policy_asked_for():
    """Real nodes and a real load generator: a short run of the federation suite reads back the policy it
    ran with; SCHED_BATCH by default, the normal policy when asked."""
    for sched, expected in ((None, "batch"), ("normal", "normal")):
        bench = Bench(Sizes(fed_warmup=0.2), base_port(), **({"fed_client_sched": sched} if sched else {}))
        try:
            r = bench.fed_run(50, 1, 0.5)
        finally:
            bench.stop_all()  # and its scratch directory
        assert r["client_sched"] == expected
        assert r["missing"] == 0 and r["duplicates"] == 0 and r["jobs_produced"] == 35


def test_the_benchmarks_are_not_in_the_installed_package(tmp_path):
    """A plain (non-editable) install holds the launcher but no benchmark module; the benchmarks'
    results go to bench-results/ of this checkout."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks import common

    root = Path(__file__).resolve().parents[1]
    assert common.ROOT == root and common.SCRIPTS == root / "scripts"
    assert common.default_results_path("0123456789abcdef").parent == root / "bench-results"
    # from a copy: a build/ left in the checkout by an older build could hold modules that moved since
    source = tmp_path / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "run", "bench-results",
                                                                "__pycache__"))  # fmt: skip
    target = tmp_path / "site"
    # DISQUE_PY_PURE=1: what the package holds, not the compiled build (minutes of mypyc here);
    # --no-build-isolation: built with this environment's setuptools, not a fresh environment's
    # (its own install of the build requirements, mypy's included, took most of the test's time)
    env = {**os.environ, "DISQUE_PY_PURE": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
                         capture_output=True, text=True, timeout=240, env=env)  # fmt: skip
    # the build is setup.py's, the code under test: a failure fails (never a skip)
    assert out.returncode == 0, "pip could not build the package: %s" % out.stderr.strip()[-2000:]
    installed = sorted(str(p.relative_to(target)) for p in target.rglob("*.py"))
    assert "disque_py/cli/launcher.py" in installed and "disque_py/cli/devcluster.py" in installed
    assert not [p for p in installed if "bench" in p or p.startswith("benchmarks")], installed


def test_same_node_fixed_runs_are_compared_with_disques_own():
    """Real nodes: a fixed-rate run with the producer on A beside the consumers (``--fed-same-node``) moves
    nothing between nodes, and the report sets its p99 against Disque's same-node run of the same rate."""
    from benchmarks.federation import federation_report

    bench = Bench(Sizes(fed_warmup=0.2), base_port())
    try:
        r = bench.fed_run(50, 1, 0.5, same_node=True)
    finally:
        bench.stop_all()
    assert r["where"] == "A->A" and r["pushed"] == 0 and r["pulled"] == 0
    assert r["missing"] == 0 and r["duplicates"] == 0 and r["jobs_produced"] == 35
    bench.results["fed_r1_50_same"] = r
    row = "| A → A (same node), REPLICATE 1, 50 jobs/s |"
    assert row not in "\n".join(federation_report(bench))  # no Disque run: nothing to compare with
    for factor, verdict in ((2.0, "| yes |"), (0.5, "| **NO** |")):
        bench.results["ref_fed_r1_50_same"] = dict(r, p99_ms=r["p99_ms"] * factor)
        line = next(x for x in federation_report(bench) if x.startswith(row))
        assert line.endswith(verdict)


ROOT = Path(__file__).resolve().parent.parent


def test_the_drain_benchmark_drains_and_checks_every_job():
    """scripts/bench drain on a few jobs: its own check (every job queued elsewhere, none left)
    holds, and it prints its table and the drain's JSON."""
    out = subprocess.run([str(ROOT / "scripts" / "bench"), "drain", "--jobs", "300"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "| jobs | drain (s) | jobs/s |" and lines[2].startswith("| 300 |"), out.stdout
    drained = json.loads(lines[-1])
    assert drained["drained"] is True and drained["moved"] == 300 and drained["left"]["total"] == 0
