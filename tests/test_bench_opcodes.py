"""scripts/bench opcodes: the pieces that need no node (the runs themselves are a benchmark)."""

from __future__ import annotations

from benchmarks.bench_opcodes import SINGLE_NODE, _short


def test_a_function_is_named_without_the_tree_it_ran_from():
    """Two trees' counts compare function by function: the key drops the checkout's path."""
    assert _short("/work/a/disque_py/core/acks.py:Acks.tick") == "disque_py/core/acks.py:Acks.tick"
    assert _short("/tmp/old/cluster_bus/links.py:Bus.release") == "cluster_bus/links.py:Bus.release"
    assert _short("/v/lib/python3.11/site-packages/trio/_core/_run.py:Runner.reschedule") == (
        "trio/_core/_run.py:Runner.reschedule")


def test_only_single_node_loads_that_drain_are_offered():
    assert SINGLE_NODE == ["cycle-batched", "cycle-unpipelined", "cycle-batched-policy"]
