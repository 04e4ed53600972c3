"""Vectorised screening and the vectorised checker against their scalar oracles."""
import bisect
import math
import random

import numpy as np

from backend.sim import truth as truth_mod
from backend.sim.screen import Screen, bound, models_bound, outside
from edge.core.interval import IntervalFilter


def test_outside_over_an_array_is_the_filters_own_report_test():
    r = random.Random(1)
    for _ in range(300):
        f = IntervalFilter(r.choice([0.0, 0.5, 3.0, float("inf")]))
        f.recenter(r.uniform(-5, 5))
        if r.random() < 0.3:
            f.set_width(r.uniform(0, 4), 1)
        lo, hi = bound(f)
        vals = np.array([r.choice([f.lo, f.hi, f.center, r.uniform(-9, 9)]) for _ in range(40)])
        assert outside(lo, hi, vals).tolist() == [f.check(v) for v in vals.tolist()]
    f = IntervalFilter(2.0)
    assert bound(f) is None                # no report yet: every reading counts
    f.recenter(1.0)
    f.set_filter(2.0, [(0.0, 5.0)], 1)
    assert bound(f) is None                # constraints: membership counts too


def test_screen_looks_at_every_reading_outside_the_bound():
    """Whatever the bounds and however often they change, the readings a source needs looked at
    (``next``) include every one outside its bound, and a looked-at reading inside is a checkpoint."""
    rng = np.random.default_rng(3)
    n, m = 5, 4000
    ss = rng.integers(0, n, size=m)
    vs = np.cumsum(rng.normal(0, 1, size=m))
    sc = Screen(ss, vs, n)
    bound = [None] * n
    i = looked = 0
    while i < m:
        k = sc.next()
        for j in range(i, min(k, m)):       # silent: inside its source's bound
            b = bound[ss[j]]
            assert b is not None and b[0] <= vs[j] <= b[1]
        if k >= m:
            break
        s = int(ss[k])
        if sc.silent(s, k, float(vs[k])):
            continue
        looked += 1
        i = k + 1
        sc.handed[s] = sc.local(s, i)           # what the engine's agent hand-over keeps
        sc.bound[s] = False
        bound[s] = (vs[k] - 3.0, vs[k] + 3.0)
        sc.set_bound(s, bound[s], i)
        if rng.random() < 0.2:              # another source's bound changes meanwhile
            o = int(rng.integers(0, n))
            if bound[o] is not None:
                bound[o] = (bound[o][0] - 0.5, bound[o][1] + 0.5)
                sc.set_bound(o, bound[o], i)
    assert 0 < looked < m / 2


def _brute(truth, answers, precision, end):
    """check() by definition: at each distinct time, the latest truth and answer so far."""
    def at(seq, t, strict=False):
        got = [e for e in seq if (e[0] < t if strict else e[0] <= t)]
        return max(enumerate(got), key=lambda p: (p[1][0], p[0]))[1] if got else None
    steps = [(-math.inf, precision)] if isinstance(precision, (int, float)) else precision
    times = sorted({e[0] for e in truth} | {e[0] for e in answers})
    viol = miss = checks = hits = 0
    vt = dt = 0.0
    for n, t in enumerate(times):
        tr, ans, prev = at(truth, t), at(answers, t), at(answers, t, True)
        nxt = times[n + 1] if n + 1 < len(times) else max(end, t)
        prec = [p for s, p in steps if s <= t][-1] if steps[0][0] <= t else steps[0][1]
        if tr is None or ans is None:
            continue
        tol = truth_mod.TOL * (1 + tr[2] + abs(tr[1]))
        if any(e[0] == t for e in answers) and prev is not None and not prev[3]:
            checks += 1
            hits += prev[1] - tol <= tr[1] <= prev[2] + tol
        if ans[3]:
            dt += nxt - t
            continue
        if not ans[1] - tol <= tr[1] <= ans[2] + tol:
            viol += 1
            vt += nxt - t
        if math.isfinite(ans[2] - ans[1]) and ans[2] - ans[1] > prec + tol:
            miss += 1
    return viol, vt, miss, dt, checks, hits


def test_vectorised_checker_matches_its_definition():
    r = random.Random(5)
    for case in range(200):
        times = sorted(r.choice([0.0, 1.0, 2.0, 2.5, 3.0, 4.0, 7.0]) for _ in range(r.randint(0, 12)))
        truth = [(t, r.uniform(-3, 3), r.uniform(0, 5)) for t in times]
        atimes = sorted(r.choice([0.0, 1.0, 2.0, 3.5, 4.0, 6.0]) for _ in range(r.randint(0, 10)))
        answers = []
        for t in atimes:
            lo = r.uniform(-4, 2)
            answers.append((t, lo, r.choice([lo + r.uniform(0, 4), float("inf")]), r.random() < 0.2))
        precision = r.choice([2.0, [(-math.inf, 2.0), (3.0, 1.0)]])
        end = 8.0                           # after every change (callers drop later answers)
        v, vt, m, dt = truth_mod.check(truth, answers, precision, end)
        bv, bvt, bm, bdt, checks, hits = _brute(truth, answers, precision, end)
        assert (v, m) == (bv, bm), case
        assert math.isclose(vt, bvt, abs_tol=1e-12) and math.isclose(dt, bdt, abs_tol=1e-12), case
        fid = truth_mod.fidelity(truth, answers, end)
        assert fid["checks"] == checks and (fid["check_fidelity"] == (hits / checks if checks else None)), case


def test_bulk_truth_is_the_per_reading_truth(monkeypatch):
    """``Truth.update_range`` against ``update`` + ``flush`` per instant: the same timelines (MIN, MAX and
    COUNT exactly, SUM and AVG within the checker's tolerance), for every chunk length."""
    from backend.coordinator.core.queries import parse_query
    rng = np.random.default_rng(11)
    ids = ["s%d" % i for i in range(7)]
    specs = [{"id": "sum", "kind": "sum", "sources": ids[:5], "weights": [1, -2, 0.5, 1, 3], "precision": 1},
             {"id": "avg", "kind": "avg", "sources": "all", "precision": 1},
             {"id": "min", "kind": "min", "sources": ids[2:], "precision": 1},
             {"id": "max", "kind": "max", "sources": ids[:4], "precision": 1},
             {"id": "cnt", "kind": "count", "sources": "all", "range": [-1.0, 1.5]},
             {"id": "all", "kind": "count", "sources": ids[:3]}]
    m = 5000
    t = np.sort(rng.integers(0, 1500, size=m)).astype(float)
    s = rng.integers(0, 7, size=m)
    v = np.round(rng.normal(0, 1.5, size=m), 1)          # repeated values: unchanged answers are not steps
    for chunk, cells in ((1, truth_mod.CELLS), (30, truth_mod.CELLS), (700, 20), (m, truth_mod.CELLS), (m, 7)):
        monkeypatch.setattr(truth_mod, "CELLS", cells)
        one, bulk = truth_mod.Truth(ids), truth_mod.Truth(ids)
        for tr in (one, bulk):
            for q in specs:
                tr.add_query(parse_query(q, ids), -1.0)
        for k in range(m):
            one.update(int(s[k]), float(v[k]))
            if k + 1 == m or t[k + 1] != t[k]:
                one.flush(float(t[k]))
        a = 0
        while a < m:
            e = min(m, a + chunk)
            while e < m and t[e] == t[e - 1]:           # whole instants
                e += 1
            bulk.update_range(s[a:e], v[a:e], t[a:e])
            a = e
        for q in specs:
            x, y = one.tracks[q["id"]].timeline, bulk.tracks[q["id"]].timeline
            if q["kind"] in ("sum", "avg"):
                # float sums in another order may call a step "unchanged" differently: compare the step
                # functions at every step of either
                for a_, b_ in ((x, y), (y, x)):
                    times = [p[0] for p in b_]
                    for tt, val, scale in a_:
                        other = b_[bisect.bisect_right(times, tt) - 1][1]
                        assert abs(other - val) <= 1e-9 * (1 + scale + abs(val)), (q["id"], chunk, tt)
            else:
                assert x == y, (q["id"], chunk)
        assert one.values == bulk.values


def test_models_bound_is_exactly_the_readings_that_change_a_model_choice():
    """``models_bound`` with the screen's scalar and array tests, against ``Chooser.sample`` and the
    filter's own check (``Agent.handle_sample`` with lines allowed): a reading is outside exactly when
    it changes a shadow cost, a line (origin, slope, gap, width) or makes a report; inside, only the
    sampling times and where the lines stand move."""
    from edge.core.predict import Chooser, LineFilter
    r = random.Random(5)
    silent = 0
    for trial in range(40):
        n = 400
        ts = np.cumsum([r.choice([1.0, 1.0, 2.0, r.uniform(0.2, 3.0)]) for _ in range(n)])
        drift = r.choice([0.0, 0.4, -1.5])
        vs = np.cumsum([drift + r.gauss(0, r.choice([0.05, 0.5, 2.0])) for _ in range(n)])
        sc = Screen(np.zeros(n, dtype=int), vs, 1, ts)
        f, ch = LineFilter(r.choice([1.0, 3.0, 8.0])), Chooser()
        outs = changes = 0
        for p in range(n):
            t, v = float(ts[p]), float(vs[p])
            if r.random() < 0.02:
                f.set_width(r.choice([0.5, 2.0, 6.0]), f.epoch + 1)
            b = models_bound(f, ch) if f.center is not None else None
            out = b is None or sc._out(0, b, p)
            if b is not None:
                assert bool(sc._outs(0, b, p, 1)[0]) == out
                assert sc._outs(0, b, max(p - 3, 0), 8).tolist()[p - max(p - 3, 0)] == out
            state = lambda: [(g.t0, g.v0, g.slope, g.gap, g.width) for g in (f,) + ch.shadows] + [list(ch.cost)]
            before = state()
            ch.sample(t, v, f.width)
            f.at(t)
            report = f.center is None or f.check(v)
            if report:
                ch.report(f, t, v, 3)
            changed = report or state() != before
            assert out or not changed, (trial, p)
            outs += out
            changes += changed
        assert outs == changes          # never a spare look either
        silent += n - outs
    assert silent > 40 * 400 / 4
