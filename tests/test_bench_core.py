"""``scripts/bench core`` (scripts/benchmarks/bench_core.py): the workload it times is the one it describes
(times are not tested)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_core import core_main, run_core


def test_cross_node_jobs_move_once_and_their_acks_are_collected_on_both_holders():
    r = run_core(jobs=300)
    assert (r["received_once"], r["duplicates"], r["addjob_errors"]) == (300, 0, 0)
    per_job = r["messages_per_job"]
    for kind in ("YOURJOBS", "SETACK", "GOTACK"):
        assert per_job[kind] == 1.0, per_job  # one push, then the two-holder ack GC
    assert per_job.get("DELJOB", 0) == 0, per_job  # the other holder deleted its copy on SETACK
    assert r["jobs_left"] == {"A": 0, "B": 0, "C": 0}
    assert {"A YOURJOBS", "B ADDJOB", "A ACKJOB", "B SETACK"} <= set(r["by_input_us_per_job"])


def test_same_node_jobs_send_nothing_and_replicated_ones_are_copied_twice():
    same = run_core(jobs=200, same_node=True)
    assert same["received_once"] == 200 and not any(k in same["messages_per_job"] for k in ("YOURJOBS", "SETACK"))
    repl = run_core(jobs=200, replicate=3, same_node=True)
    assert repl["received_once"] == 200 and repl["duplicates"] == 0
    assert repl["messages_per_job"]["REPLJOB"] == 2.0 and repl["messages_per_job"]["DELJOB"] == 2.0
    assert repl["jobs_left"] == {"A": 0, "B": 0, "C": 0}


def test_a_backlog_moves_by_pull_in_batches_and_every_job_is_received_once():
    r = run_core(jobs=1000, backlog=True)
    assert r["backlog"] and (r["received_once"], r["duplicates"], r["addjob_errors"]) == (1000, 0, 0)
    per_job = r["messages_per_job"]
    # pulled: YOURJOBS answers NEEDJOBS with batches of many jobs, not a message per job
    assert 0 < per_job["YOURJOBS"] <= 0.1 and 0 < per_job["NEEDJOBS"] <= 0.2, per_job
    assert per_job["SETACK"] == per_job["GOTACK"] == 1.0, per_job
    assert {"B NEEDJOBS", "A YOURJOBS"} <= set(r["by_input_us_per_job"])
    assert r["jobs_left"] == {"A": 0, "B": 0, "C": 0}


def test_a_backlog_on_the_consumers_node_is_served_at_once_and_moves_nothing():
    r = run_core(jobs=300, same_node=True, backlog=True)
    assert (r["received_once"], r["duplicates"]) == (300, 0)  # GETJOB replies at once, not as effects
    per_job = r["messages_per_job"]
    assert not any(k in per_job for k in ("YOURJOBS", "SETACK", "REPLJOB")), per_job
    # NEEDJOBS only once the queue is empty and the consumers block: discovery, nothing to move
    assert per_job.get("NEEDJOBS", 0) * 300 <= 4, per_job
    assert r["jobs_left"] == {"A": 0, "B": 0, "C": 0}


def test_cli(capsys):
    assert core_main(["--jobs", "50", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["received_once"] == 50
    assert core_main(["--jobs", "50", "--same-node"]) == 0
    assert "A->A, REPLICATE 1, 50 jobs" in capsys.readouterr().out
    assert core_main(["--jobs", "50", "--backlog"]) == 0
    assert "B->A from a backlog, REPLICATE 1, 50 jobs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        core_main(["--jobs", "0"])
    assert exc.value.code == 2 and "error: --jobs must be >= 1" in capsys.readouterr().err
