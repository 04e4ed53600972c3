"""Olston §3.2 as published against its three refinements (adaptive.REFINED: pooled burden, capped growth,
priced growth): per-period growth, widths in force, and reports against the paper setting and the static optimum."""
import pytest

from backend.coordinator.precision import adaptive
from backend.sim import engine


def _single_avg_spec(params):
    return {"seed": 3, "duration": 1500, "protocol": "adaptive", "params": dict(params, rule="shrink", period=10.0, shrink=0.05),
            "sources": {"generator": "random_walk", "count": 8, "step": [0.1, 2.0], "start": [0.0, 100.0]},
            "queries": [{"id": "q", "kind": "avg", "sources": "all", "precision": 6.0}]}


PAPER = {"reports": 0, "cap": None, "growth_cost": 0}


def _trace_periods(spec):
    """Run ``spec``; per adjustment period: (report counts, widths before, widths after growth)."""
    sim = engine.Simulation(spec)
    log = []
    orig = sim.protocol.period

    def period(coord, t):
        n = {k: s.reports for k, s in coord.cache.sources.items()}
        before = {k: s.filt.width for k, s in coord.cache.sources.items()}
        orig(coord, t)
        log.append((n, before, {k: s.filt.width for k, s in coord.cache.sources.items()}))
    sim.protocol.period = period
    return sim.run(), log


def _grown(entry):
    _, before, after = entry
    return {k: after[k] / before[k] for k in after if after[k] > before[k]}


def test_paper_setting_gives_all_slack_to_one_object():
    # reports=0, cap=None, growth_cost=0 is §3.2 as published: on a single AVG row the top-deviation
    # object takes the whole slack, so exactly one growth message per period.
    res, log = _trace_periods(_single_avg_spec(PAPER))
    assert res["violations"] == 0
    assert max(len(_grown(e)) for e in log) == 1 and sum(len(_grown(e)) for e in log) > 0.9 * len(log)


def test_pooled_burden_uses_the_newest_periods_holding_enough_reports():
    # Oracle: the window written out from the full per-period history (counts and widths in force).
    K, M, T = 5, 8, 10.0
    spec = _single_avg_spec({"reports": K, "memory": M})
    sim = engine.Simulation(spec)
    got, log = [], []
    pooled, orig = sim.protocol._pooled, sim.protocol.period

    def spy(key, n, width, period):
        out = pooled(key, n, width, period)
        got[-1][key] = (n, width, out)
        return out

    def period(coord, t):
        got.append({})
        orig(coord, t)
    sim.protocol._pooled, sim.protocol.period = spy, period
    assert sim.run()["violations"] == 0
    hist = {}
    for entry in got:
        for key, (n, width, (N, E)) in entry.items():
            hist.setdefault(key, []).append((n, T / width ** 2))
            want_n = want_e = 0.0
            for k, (nk, ek) in enumerate(reversed(hist[key])):
                if want_n >= K or k >= M:
                    break
                want_n += nk
                want_e += ek
            assert (N, E) == (want_n, pytest.approx(want_e, rel=1e-9))
    assert any(N >= K for e in got for _, _, (N, _) in e.values())        # both limits were reached
    assert any(N < K and N > 0 for e in got for _, _, (N, _) in e.values())


def test_widths_in_force_are_those_left_by_the_previous_adjustment():
    spec = _single_avg_spec(adaptive.REFINED)
    sim = engine.Simulation(spec)
    seen, after = [], []
    pooled, orig = sim.protocol._pooled, sim.protocol.period
    sim.protocol._pooled = lambda key, n, width, T: (seen[-1].__setitem__(key, width), pooled(key, n, width, T))[1]

    def period(coord, t):
        seen.append({})
        orig(coord, t)
        after.append({k: s.filt.width for k, s in coord.cache.sources.items()})
    sim.protocol.period = period
    sim.run()
    assert len(seen) > 10
    for k in range(1, len(seen)):
        assert seen[k] == after[k - 1]


def test_capped_growth_spreads_and_only_the_leftover_exceeds_the_cap():
    res, log = _trace_periods(_single_avg_spec(dict(adaptive.REFINED, cap=0.1, growth_cost=0)))
    assert res["violations"] == 0
    assert max(len(_grown(e)) for e in log) > 1                    # the slack went to several objects
    for e in log:
        assert sum(f > 1.1 + 1e-9 for f in _grown(e).values()) <= 1   # one object takes what is left


def test_priced_growth_pays_for_itself():
    class Coord:
        period, shrink = 10.0, 0.05
    p = adaptive.Adaptive(growth_cost=2.0, cost={"a": 0.5, "b": 1.0})
    # saved = r·T/S·(1 − (W/(W+ΔW))²) = 0.1·200·(1 − 1/4) = 15 reports
    assert p._pays("a", 0.1, 1.0, 1.0, Coord) and p._pays("b", 0.1, 1.0, 1.0, Coord)
    assert not p._pays("b", 0.001, 1.0, 1.0, Coord)             # 0.15 reports < 2 × cost 1
    # threshold for "a": 2 × 0.5 = 1 report, i.e. r = 1/150
    assert p._pays("a", 1.001 / 150, 1.0, 1.0, Coord) and not p._pays("a", 0.999 / 150, 1.0, 1.0, Coord)
    # against the alternative: the slack would otherwise go to an object that saves more with it
    assert p._pays("b", 0.02, 1.0, 1.0, Coord)                                # 3 reports alone
    assert not p._pays("b", 0.02, 1.0, 1.0, Coord, (0.1, 1.0, 1.0, 1.0))      # 3 − 15 < 2
    assert p._pays("b", 0.02, 1.0, 1.0, Coord, (0.1, 1.0, 1.0, 0.0))          # the other has no room
    assert p._pays("b", 0.1, 1.0, 1.0, Coord, (0.1, 1.0, 2.0, 1.0))           # 15 − 0.1·(1/4 − 1/9)·200
    assert not p._pays("b", 0.1, 1.0, 1.0, Coord, (0.1, 1.0, 0.7, 1.0))
    # an unaffordable price leaves only the most deviating object to grow, even with a cap
    res, log = _trace_periods(_single_avg_spec(dict(adaptive.REFINED, cap=0.1, growth_cost=1e9)))
    assert res["violations"] == 0 and max(len(_grown(e)) for e in log) == 1


def _gaussian_walk(delta, duration=4000):
    return {"seed": 1, "duration": duration, "warmup": duration // 4,
            "sources": {"generator": "random_walk", "count": 10, "step": [0.1, 2.0], "start": [0.0, 100.0],
                        "steps": "normal"},
            "queries": [{"id": "q", "kind": "avg", "sources": "all", "precision": delta}]}


def test_default_sends_fewer_reports_than_the_paper_setting_on_a_low_rate_random_walk():
    spec = _gaussian_walk(10.0)
    paper = engine.run(dict(spec, protocol="adaptive", params=dict(PAPER, rule="shrink")))
    ours = engine.run(dict(spec, protocol="adaptive", params=dict(adaptive.REFINED, rule="shrink")))
    assert paper["violations"] == ours["violations"] == 0
    assert ours["messages"]["up"] < 0.95 * paper["messages"]["up"]


@pytest.mark.parametrize("delta", [2.0, 10.0])
def test_default_is_within_ten_percent_of_optimal_static_on_a_random_walk(delta):
    # §3.3 idealized (growth messages free): the offline optimum knows the step sizes, adaptive does not.
    spec = _gaussian_walk(delta, 6000)
    static = engine.run(dict(spec, protocol="optimal_static"))
    ours = engine.run(dict(spec, protocol="adaptive", params=dict(adaptive.REFINED, rule="shrink")))
    assert static["violations"] == ours["violations"] == 0
    assert ours["messages"]["up"] <= 1.10 * static["messages"]["up"]
