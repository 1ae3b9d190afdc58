"""``disque-py top``'s arithmetic without nodes: sums, rates, pause, sorting, the tables."""

from __future__ import annotations

import io

import pytest

from disque_py.cli.top import SORT_KEYS, NodeSample, QueueStat, Sample, compute, parse_nodes, render, sort_queues


def node(node_id: str, at: float, queues: dict[str, QueueStat], *, reachable: bool = True, peers=None) -> NodeSample:
    port = 7711 + int(node_id[-1])
    return NodeSample(("127.0.0.1", port), at, reachable, None if reachable else "connection refused",
                      id=node_id, info={"registered_jobs": sum(q.len for q in queues.values())},
                      peers=peers or {}, queues=queues)  # fmt: skip


def q(length: int, jobs_in: int, jobs_out: int = 0, blocked: int = 0, paused: str = "none") -> QueueStat:
    return QueueStat(length, blocked, jobs_in, jobs_out, paused)


def test_lengths_and_blocked_are_summed_and_rates_come_from_the_counters_of_each_node():
    first = Sample(100.0, [node("n1", 10.0, {"a": q(5, 100, 95)}), node("n2", 10.5, {"a": q(2, 40, 38)})])
    second = Sample(102.0, [node("n1", 12.0, {"a": q(7, 120, 113, blocked=1)}),
                            node("n2", 11.5, {"a": q(3, 50, 47)})])  # fmt: skip
    (row,) = compute(second, first).queues
    assert (row.len, row.blocked) == (10, 1)
    assert row.in_rate == pytest.approx(20 / 2.0 + 10 / 1.0)
    assert row.out_rate == pytest.approx(18 / 2.0 + 9 / 1.0)
    assert set(row.nodes) == {"n1", "n2"}


def test_rates_are_unknown_after_one_sample_and_count_new_queues_and_reset_counters_from_zero():
    one = compute(Sample(0.0, [node("n1", 1.0, {"a": q(1, 3)})]))
    assert one.queues[0].in_rate is None and one.interval is None
    first = Sample(0.0, [node("n1", 1.0, {"a": q(1, 30)})])
    second = Sample(1.0, [node("n1", 2.0, {"a": q(1, 4), "new": q(6, 6)})])  # a: evicted and made again
    rates = {r.name: r.in_rate for r in compute(second, first).queues}
    assert rates == {"a": pytest.approx(4.0), "new": pytest.approx(6.0)}


def test_a_node_that_did_not_answer_before_gives_no_rate_and_an_unreachable_one_no_queues():
    first = Sample(0.0, [node("n1", 1.0, {}, reachable=False), node("n2", 1.0, {"b": q(1, 1)})])
    second = Sample(1.0, [node("n1", 2.0, {"a": q(2, 9)}), node("n2", 2.0, {"b": q(1, 1)}, reachable=False)])
    view = compute(second, first)
    assert [(r.name, r.len, r.in_rate) for r in view.queues] == [("a", 2, None)]
    assert [n.reachable for n in view.nodes] == [True, False]
    assert view.nodes[1].error == "connection refused"


def test_pause_is_what_any_node_pauses_and_says_when_not_every_node_does():
    view = compute(Sample(0.0, [node("n1", 1.0, {"p": q(0, 0, paused="in"), "all": q(0, 0, paused="all")}),
                                node("n2", 1.0, {"p": q(0, 0, paused="out"), "all": q(0, 0, paused="all")})]))  # fmt: skip
    rows = {r.name: r for r in view.queues}
    assert (rows["p"].paused, rows["p"].paused_everywhere) == ("all", False)
    assert (rows["all"].paused, rows["all"].paused_everywhere) == ("all", True)
    text = _text(view)
    assert "all*" in text  # some nodes only


def test_flags_of_a_node_come_from_the_other_nodes_tables():
    peers = {"n1": ("myself",), "n2": ("pfail",)}
    view = compute(Sample(0.0, [node("n1", 1.0, {}, peers=peers), node("n2", 1.0, {}, reachable=False)]))
    assert view.nodes[1].flags == ("pfail",)
    assert view.nodes[0].flags == ()


def _rows():
    first = Sample(0.0, [node("n1", 0.0, {"alpha": q(5, 0, 0), "beta": q(1, 0, 0), "gamma": q(9, 0, 0),
                                          "delta": q(3, 0, 0)})])  # fmt: skip
    second = Sample(1.0, [node("n1", 1.0, {"alpha": q(5, 7, 1, blocked=0), "beta": q(1, 2, 8, blocked=3),
                                           "gamma": q(9, 4, 2, blocked=1), "delta": q(3, 9, 5, blocked=2)})])  # fmt: skip
    return compute(second, first).queues


@pytest.mark.parametrize(
    "by, expected",
    [
        ("length", ["gamma", "alpha", "delta", "beta"]),
        ("in", ["delta", "alpha", "gamma", "beta"]),
        ("out", ["beta", "delta", "gamma", "alpha"]),
        ("blocked", ["beta", "delta", "gamma", "alpha"]),
        ("name", ["alpha", "beta", "delta", "gamma"]),
    ],
)
def test_each_sort_key_orders_the_rows_and_reverse_flips_them(by, expected):
    assert [r.name for r in sort_queues(_rows(), by)] == expected
    assert [r.name for r in sort_queues(_rows(), by, reverse=True)] == expected[::-1]


def test_ties_stay_in_name_order_and_unknown_sort_keys_are_refused():
    rows = compute(Sample(0.0, [node("n1", 0.0, {"b": q(1, 0), "a": q(1, 0), "c": q(2, 0)})])).queues
    assert [r.name for r in sort_queues(rows, "length")] == ["c", "a", "b"]
    assert set(SORT_KEYS) == {"length", "in", "out", "blocked", "name"}
    with pytest.raises(ValueError, match="sort by one of length, in, out, blocked, name"):
        sort_queues(rows, "size")


def test_the_tables_show_the_rows_in_order_the_sort_mark_and_an_unreachable_node():
    first = Sample(0.0, [node("n1", 0.0, {"x": q(1, 0)}), node("n2", 0.0, {})])
    second = Sample(1.0, [node("n1", 1.0, {"x": q(1, 0), "yy": q(4, 3)}), node("n2", 1.0, {}, reachable=False)])
    text = _text(compute(second, first), sort="length")
    assert text.index("yy") < text.index("x ")
    assert "LEN(l)v" in text and "IN/s(i)" in text
    assert "NO" in text and "connection refused" in text
    text = _text(compute(second, first), sort="name", limit=1)
    assert "QUEUE(n)^" in text and "... 1 more queue(s)" in text


def _text(view, **kw) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=160).print(render(view, **kw))
    return out.getvalue()


def test_a_view_of_every_queue_says_so_in_its_title_and_its_json():
    sample = Sample(0.0, [node("n1", 0.0, {"jobs": q(1, 0), "@result:D-x": q(1, 1)})], all_queues=True)
    view = compute(sample)
    assert view.all_queues is True and view.to_json()["all_queues"] is True
    assert "queues 2 (the cluster's own too)" in _text(view)
    plain = compute(Sample(0.0, [node("n1", 0.0, {"jobs": q(1, 0)})]))
    assert plain.to_json()["all_queues"] is False and "own too" not in _text(plain)


def test_parse_nodes():
    assert parse_nodes("127.0.0.1:7711, 10.0.0.1:7712,[::1]:7713,127.0.0.1:7711") == [
        ("127.0.0.1", 7711), ("10.0.0.1", 7712), ("::1", 7713)]  # fmt: skip
    with pytest.raises(ValueError, match="^no node given$"):
        parse_nodes("")
    for bad in ("host", "host:port", ":7711", "h:0", "h:70000"):
        with pytest.raises(ValueError, match="^expected HOST:PORT, got '%s'$" % bad):
            parse_nodes(bad)


def test_a_table_cell_keeps_the_reason_of_an_error_and_the_json_all_of_it():
    from disque_py.cli.top import short_error

    long = "cannot connect to 127.0.0.1:7712: Error 111 connecting to 127.0.0.1:7712. Connection refused."
    assert short_error(long) == "connection refused"
    assert short_error("connection to 127.0.0.1:7712 lost: Timeout reading from socket") == "timeout reading from socket"
    assert short_error("NOAUTH Authentication required.") == "NOAUTH Authentication required"
    view = compute(Sample(0.0, [NodeSample(("127.0.0.1", 7712), 0.0, False, long)]))
    assert view.to_json()["nodes"][0]["error"] == long and "connection refused" in _text(view)


def test_the_node_table_names_both_memories_the_data_estimate_and_the_rss():
    # INFO's used_memory is the estimate maxmemory is checked against, not the process's memory:
    # the table labels it so and shows the RSS beside it
    sample = NodeSample(("127.0.0.1", 7711), 0.0, True, None, id="n1",
                        info={"used_memory": 6 * 1024, "maxmemory": 1024**3, "used_memory_rss": 52 * 1024**2})  # fmt: skip
    view = compute(Sample(0.0, [sample]))
    text = _text(view)
    header = next(line for line in text.splitlines() if "ADDRESS" in line)
    assert header.split()[-5:-3] == ["DATA(est)/MAX", "RSS"]
    row = next(line for line in text.splitlines() if "127.0.0.1:7711" in line)
    assert "6.0K/1.0G" in row and "52.0M" in row
    assert view.to_json()["nodes"][0]["used_memory"] == 6 * 1024
    assert view.to_json()["nodes"][0]["used_memory_rss"] == 52 * 1024**2
