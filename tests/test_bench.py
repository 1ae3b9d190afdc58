"""The benchmark's maximum-rate search (the runs themselves are measured, not tested)."""

from __future__ import annotations

from disque_py.bench import Bench, Sizes


class _Searcher:
    """Just what Bench.fed_ramps needs; each step passes when the rate is at most the placement's limit."""

    def __init__(self, cross_limit: float, same_limit: float) -> None:
        self.sizes = Sizes()
        self.limits = {False: cross_limit, True: same_limit}
        self.calls: list[tuple[str, float]] = []
        self._ramp_plan = Bench._ramp_plan.__get__(self)

    def fed_run(self, rate: float, replicate: int, duration: float, *, same_node: bool = False) -> dict:
        self.calls.append(("A->A" if same_node else "B->A", rate))
        return {"rate": rate, "ok": rate <= self.limits[same_node]}


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
    assert out[False]["best"] == {"rate": 5750, "ok": True}
    assert [st["rate"] for st in out[True]["steps"]] == [r for w, r in s.calls if w == "A->A"]


def test_a_failing_start_goes_down():
    s = _Searcher(cross_limit=300, same_limit=100000)
    out = Bench.fed_ramps(s)
    assert out[False]["max_rate"] is not None and out[False]["max_rate"] <= 300
    assert out[False]["first_failed_rate"] is not None and out[False]["first_failed_rate"] > out[False]["max_rate"]
