"""Olston adaptive filters: constraint rows and burden targets (App. A, B), the static optimum (App. F),
greedy growth within the budget, bad parameters, the experiment. Refinements: test_refinements.py; §3.4/§4: test_latency.py."""
import math
import random

import numpy as np
import pytest

from backend.coordinator.precision import optimal
from backend.coordinator.precision.rows import Rows, burden_targets
from backend.coordinator import protocols
from backend.coordinator.core.queries import parse_query
from backend.sim import engine
from test_sim import random_workload


def _queries(specs, ids):
    return {s["id"]: parse_query(s, set(ids)) for s in specs}


def test_burden_targets_solve_the_papers_system():
    # Oracle: App. B's equations written out term by term and solved densely.
    r = random.Random(3)
    ids = ["s%d" % i for i in range(12)]
    specs = []
    for j in range(6):
        srcs = r.sample(ids, r.randint(2, 7))
        specs.append({"id": "q%d" % j, "kind": "avg", "sources": srcs, "precision": 1.0,
                      "weights": [r.choice([-2.0, 0.5, 1.0, 3.0]) for _ in srcs]})
    rows = Rows(_queries(specs, ids))
    burden = {s: r.uniform(0, 5) for s in rows.of}
    T = burden_targets(rows, burden, eps=1e-12)
    m = len(rows.coef)
    A, b = np.zeros((m, m)), np.zeros(m)
    for j, cj in enumerate(rows.coef):
        A[j, j] = len(cj)
        for i, kij in cj.items():
            b[j] += burden[i] / kij
            for k, kik in rows.of[i]:
                if k != j:
                    A[j, k] += kik / kij
    assert np.allclose(A @ T, b, atol=1e-8)
    assert np.allclose(T, np.linalg.solve(A, b), atol=1e-6)


def test_single_query_target_is_the_mean_burden():
    ids = ["a", "b", "c"]
    rows = Rows(_queries([{"id": "q", "kind": "avg", "sources": ids, "precision": 2.0}], ids))
    T = burden_targets(rows, {"a": 1.0, "b": 2.0, "c": 6.0})
    assert T[0] == pytest.approx(3.0)


def test_rows_follow_appendix_a_and_b():
    ids = ["a", "b", "c"]
    qs = _queries([{"id": "avg", "kind": "avg", "sources": ids, "precision": 2.0, "weights": [1, -2, 1]},
                   {"id": "sum", "kind": "sum", "sources": ["a", "b"], "precision": 3.0},
                   {"id": "min", "kind": "min", "sources": ["b", "c"], "precision": 0.5},
                   {"id": "cnt", "kind": "count", "sources": ids, "precision": 0.0}], ids)
    rows = Rows(qs, phi=lambda k: 0.1)
    got = sorted((r.query[j], sorted(r.coef[j].items()), round(r.budget[j], 9)) for r in [rows] for j in range(len(rows.coef)))
    assert got == [("avg", [("a", 1.0), ("b", 2.0), ("c", 1.0)], round(2.0 * 3 - 0.4, 9)),
                   ("min", [("b", 1.0)], 0.4), ("min", [("c", 1.0)], 0.4),
                   ("sum", [("a", 1.0), ("b", 1.0)], 2.8)]
    widths = rows.fit({"a": 10.0, "b": 10.0, "c": 0.1})
    assert all(u <= b + 1e-12 for u, b in zip(rows.used(widths), rows.budget))


def test_optimal_static_matches_the_closed_form_for_one_query():
    # One AVG query: Lagrange gives W_i ∝ (C_i·s_i²)^(1/3), scaled to use the whole budget.
    ids = ["s%d" % i for i in range(5)]
    rows = Rows(_queries([{"id": "q", "kind": "avg", "sources": ids, "precision": 4.0}], ids))
    var = {s: (0.2 * (i + 1)) ** 2 for i, s in enumerate(ids)}
    w = optimal.solve(rows, var, lambda k: 1.0)
    g = {s: var[s] ** (1 / 3) for s in ids}
    scale = 4.0 * 5 / sum(g.values())
    for s in ids:
        assert w[s] == pytest.approx(g[s] * scale, rel=1e-3)


def _widths_over_time(spec):
    """Run ``spec`` and return the max over adjustment periods of Σ|K|W / budget per row."""
    sim = engine.Simulation(spec)
    worst = [0.0]
    orig = sim.protocol.period

    def period(coord, t):
        orig(coord, t)
        rows = sim.protocol.rows
        widths = {k: sim.protocol._width(s) for k, s in coord.cache.sources.items() if k in rows.of}
        for u, b in zip(rows.used(widths), rows.budget):
            worst[0] = max(worst[0], u / b if b else (0.0 if u == 0 else math.inf))
    sim.protocol.period = period
    res = sim.run()
    return res, worst[0], sim


def test_adaptive_grows_to_the_budget_and_never_beyond():
    spec = random_workload(7, "adaptive", count=10, duration=400)
    spec["queries"] = [{"id": "a", "kind": "avg", "sources": ["s%d" % i for i in range(6)], "precision": 5.0},
                       {"id": "b", "kind": "sum", "sources": ["s%d" % i for i in range(3, 10)], "precision": 9.0,
                        "weights": [1, -1, 2, 1, 1, 0.5, 1]},
                       {"id": "m", "kind": "max", "sources": ["s0", "s9"], "precision": 1.5}]
    spec["params"]["rule"] = "shrink"
    res, worst, sim = _widths_over_time(spec)
    assert res["violations"] == 0 and res["precision_misses"] == 0
    assert 0.9 < worst <= 1.0 + 1e-9          # slack is handed out, constraints always hold
    assert sim.protocol.stats["growth"] > 0
    assert res["by_kind"]["width"] >= sim.protocol.stats["growth"]   # growth messages are downlink


def test_adaptive_beats_uniform_on_overlapping_queries():
    # §1.2.1: uniform gives shared objects the narrowest share; adaptive moves the loose query's
    # budget to the objects only it reads (growth messages included in the count).
    ids = ["s%d" % i for i in range(8)]
    spec = {"seed": 4, "duration": 3000, "warmup": 500,
            "sources": {"generator": "random_walk", "count": 8, "step": [0.05, 2.0]},
            "queries": [{"id": "loose", "kind": "avg", "sources": "all", "precision": 6.0},
                        {"id": "tight", "kind": "avg", "sources": ids[:3], "precision": 0.3}]}
    uni = engine.run(dict(spec, protocol="uniform"))
    ada = engine.run(dict(spec, protocol="adaptive"))
    assert ada["violations"] == uni["violations"] == 0
    total = lambda r: r["messages"]["up"] + r["messages"]["down"]
    assert total(ada) < total(uni)


@pytest.mark.parametrize("bad,msg", [
    ({"cost": -1}, "cost"), ({"immediate": "yes"}, "immediate"), ({"rate": {"s0": "x"}}, "rate"),
    ({"eps": 2}, "eps"), ({"reports": -1}, "reports"), ({"reports": 1.5}, "reports"),
    ({"memory": 0}, "memory"), ({"growth_cost": -1}, "growth_cost"), ({"growth_cost": "x"}, "growth_cost"),
    ({"cap": 0}, "cap"), ({"cap": True}, "cap"),
])
def test_bad_adaptive_params_are_explained(bad, msg):
    with pytest.raises(ValueError, match=msg):
        protocols.make("adaptive", rule="shrink", **bad)


def test_experiment_smoke(tmp_path):
    import csv
    from backend.experiments import olston
    assert olston.main(str(tmp_path), smoke=True) == 0
    md = (tmp_path / "olston.md").read_text()
    assert "adaptive (paper)/uniform" in md and "adaptive/uniform" in md and "optimal static" in md
    assert "lattice widths" in md and (tmp_path / "fig8_multiquery.png").exists()
    rows = list(csv.DictReader(open(tmp_path / "olston.csv")))
    assert rows and all(r["violations"] == "0" for r in rows)
    assert {"randomwalk-1q", "randomwalk-1q-binary"} <= {r["workload"] for r in rows}
