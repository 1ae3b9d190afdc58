"""``scripts/bench instructions`` (scripts/benchmarks/bench_instructions.py): reading callgrind's
totals, the per-job difference, the comparison with the baseline and its options (the runs under
callgrind themselves are measured, not tested)."""

from __future__ import annotations

import pytest

from benchmarks.bench_instructions import (
    LOADS, compare, fit, idle_rate, jobs_of, markdown, parse_args, parse_totals, per_job, spread,
)  # fmt: skip

CALLGRIND_TAIL = b"""fn=(12) PyEval_EvalFrameDefault
0 12

summary: 1582662712

totals: 1582662712
"""


def test_totals_line_read_and_summary_accepted_alone():
    assert parse_totals(CALLGRIND_TAIL) == 1582662712
    assert parse_totals("events: Ir\nsummary: 77 3\n") == 77
    assert parse_totals(b"totals: 12\nsummary: 99\n") == 12
    with pytest.raises(ValueError, match="no totals: or summary: line"):
        parse_totals(b"events: Ir\nfn=main\n0 5\n")


def test_per_job_is_the_difference_over_the_extra_jobs():
    assert per_job(1_500_000_000, 1_900_000_000, 500, 3000) == 160_000
    with pytest.raises(ValueError, match="the second run needs more jobs than the first"):
        per_job(1, 2, 3000, 3000)
    # timers: 4 M instructions per second the nodes were up; the N2 run lasted 10 s longer
    rate = idle_rate(1_500_000_000, 1_520_000_000, 3.0, 8.0)
    assert rate == 4_000_000
    assert per_job(1_500_000_000, 1_940_000_000, 500, 3000, 3.0, 13.0, rate) == 160_000
    with pytest.raises(ValueError, match="the idle run must last longer"):
        idle_rate(1, 2, 5.0, 5.0)
    assert spread([100.0, 101.0]) == pytest.approx(1 / 100.5)
    assert spread([5.0]) == 0.0


def test_batched_load_runs_whole_batches_of_110():
    assert jobs_of("cycle-batched", 500) == 440 and jobs_of("cycle-batched", 3000) == 2970
    assert jobs_of("cycle-batched", 50) == 110
    assert jobs_of("cycle-unpipelined", 500) == 500 and jobs_of("replicate3-cycle", 3000) == 300


def test_moves_beyond_the_threshold_are_flagged_both_ways():
    rows = {r.load: r for r in compare(
        {"a": 101.5, "b": 98.0, "c": 100.9, "d": None, "e": 50.0},
        {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0},
        threshold=1.0,
    )}  # fmt: skip
    assert (rows["a"].flag, rows["b"].flag, rows["c"].flag) == ("WORSE", "BETTER", "")
    assert rows["a"].change == pytest.approx(1.5) and rows["b"].change == pytest.approx(-2.0)
    assert rows["d"].change is None and rows["d"].flag == ""  # not measured (n/a)
    assert rows["e"].baseline is None and rows["e"].flag == ""  # no baseline yet
    table = markdown(list(rows.values()), {"a": 0.002}, 1.0)
    assert "| a | 102 | 0.20 % | 100 | +1.50 % | **WORSE** (> 1 %) |" in table
    assert "| d | n/a |" in table


def test_options_defaults_quick_and_refused(tmp_path):
    a = parse_args([])
    assert (a.n1, a.n2, a.repeat, a.loads) == (500, 3000, 2, list(LOADS))
    a = parse_args(["--quick", "--only", "cycle-batched"])
    assert (a.n1, a.n2, a.repeat, a.loads) == (200, 1000, 1, ["cycle-batched"])
    for bad in (["--only", "addjob"], ["--n1", "3000", "--n2", "500"], ["--repeat", "0"], ["--tree", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            parse_args(bad)
        assert exc.value.code == 2, bad


def test_least_squares_recovers_start_up_per_job_and_rate():
    def total(n, w):
        return 1_400_000_000 + 150_000 * n + 5_000_000 * w

    runs = [(n, w, total(n, w)) for n, w in ((500, 3.0), (3000, 12.0), (500, 8.5), (500, 1.5), (3000, 30.0))]
    start, job, rate = fit(runs)
    assert (start, job, rate) == (pytest.approx(1.4e9), pytest.approx(150_000), pytest.approx(5e6))
    with pytest.raises(ValueError, match="do not tell jobs from seconds apart"):
        fit([(500, 1.0, 10), (500, 1.0, 11), (500, 1.0, 12)])
