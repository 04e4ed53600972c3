"""Answer intervals against a brute-force oracle: they contain every feasible exact answer and are tight."""
import itertools
import math
import random

from backend.coordinator.core import aggregate
from backend.coordinator.core.queries import QueryError, parse_query

import pytest


def _rand_case(r, kind):
    n = r.randint(1, 5)
    srcs = ["s%d" % i for i in range(n)]
    spec = {"id": "q", "kind": kind, "sources": srcs, "precision": 1.0}
    if kind in ("sum", "avg") and r.random() < 0.6:
        spec["weights"] = [r.choice([-2.5, -1, 0.5, 1, 3]) for _ in srcs]
    if kind == "count":
        a = r.uniform(-5, 5)
        spec["range"] = [a, a + r.uniform(0, 6)]
    q = parse_query(spec, set(srcs))
    bounds = {}
    for s in srcs:
        lo = r.uniform(-10, 10)
        bounds[s] = (lo, lo + r.choice([0.0, r.uniform(0, 8)]))
    return q, bounds


@pytest.mark.parametrize("kind", ["sum", "avg", "min", "max", "count"])
def test_interval_contains_every_feasible_answer_and_is_tight(kind):
    r = random.Random(kind)
    for _ in range(300):
        q, bounds = _rand_case(r, kind)
        lo, hi = aggregate.answer(q, bounds.__getitem__)
        # corners (and a point inside each range edge for count) of the box of feasible values
        pts = {s: sorted({b[0], b[1], (b[0] + b[1]) / 2} | ({q.range[0], q.range[1]} if q.range else set()))
               for s, b in bounds.items()}
        pts = {s: [p for p in v if bounds[s][0] <= p <= bounds[s][1]] for s, v in pts.items()}
        vals = []
        for combo in itertools.product(*(pts[s] for s in q.sources)):
            v = aggregate.exact(q, dict(zip(q.sources, combo)).__getitem__)
            assert lo - 1e-9 <= v <= hi + 1e-9
            vals.append(v)
        assert min(vals) == pytest.approx(lo, abs=1e-9) and max(vals) == pytest.approx(hi, abs=1e-9)


def test_uniform_width_meets_precision_exactly():
    r = random.Random(3)
    for _ in range(200):
        kind = r.choice(["sum", "avg", "min", "max"])
        q, _ = _rand_case(r, kind)
        w = aggregate.uniform_width(q)
        bounds = {s: (0.0, w) for s in q.sources}
        lo, hi = aggregate.answer(q, bounds.__getitem__)
        assert hi - lo == pytest.approx(q.precision, rel=1e-9)


def test_unknown_bounds_give_unbounded_answers():
    q = parse_query({"id": "q", "kind": "sum", "sources": ["a", "b"], "precision": 1}, {"a", "b"})
    lo, hi = aggregate.answer(q, {"a": (0.0, 1.0), "b": (-math.inf, math.inf)}.__getitem__)
    assert (lo, hi) == (-math.inf, math.inf)


@pytest.mark.parametrize("spec,msg", [
    ({"id": "", "kind": "sum"}, "query id"),
    ({"id": "q", "kind": "median"}, "kind must be one of"),
    ({"id": "q", "kind": "sum", "sources": ["zz"]}, "unknown sources"),
    ({"id": "q", "kind": "sum", "sources": ["a"], "precision": -1}, "precision must be >= 0"),
    ({"id": "q", "kind": "min", "sources": ["a"], "weights": [2]}, "weights apply"),
    ({"id": "q", "kind": "count", "sources": ["a"], "range": [3, 1]}, "a <= b"),
    ({"id": "q", "kind": "sum", "sources": ["a", "a"]}, "repeat"),
    ({"id": "q", "kind": "avg", "sources": ["a"], "precision": float("nan")}, "finite"),
])
def test_bad_query_specs_are_explained(spec, msg):
    with pytest.raises(QueryError, match=msg):
        parse_query(spec, {"a", "b"})


@pytest.mark.parametrize("kind", ["sum", "avg", "min", "max", "count"])
def test_running_aggregate_matches_the_batch_oracle_on_every_prefix(kind):
    r = random.Random("running-" + kind)
    for _ in range(20):
        q, bounds = _rand_case(r, kind)
        run = aggregate.Running(q, bounds.__getitem__)
        for step in range(1500):
            s = r.choice(q.sources)
            lo = r.uniform(-1e3, 1e3) if r.random() < 0.5 else bounds[s][0] + r.uniform(-1, 1)
            bounds[s] = r.choice([(lo, lo + r.uniform(0, 5)), (-math.inf, math.inf), (lo, lo)]) \
                if r.random() < 0.05 else (lo, lo + r.uniform(0, 5))
            run.update(s, bounds[s])
            got, want = run.interval(), aggregate.answer(q, bounds.__getitem__)
            if math.isinf(want[0]) or math.isinf(want[1]):
                assert got == want or (got[0] <= want[0] and got[1] >= want[1])
                continue
            assert got[0] <= want[0] + 1e-9 * (1 + abs(want[0])) and got[1] >= want[1] - 1e-9 * (1 + abs(want[1]))
            assert got[0] >= want[0] - 1e-9 * (1 + abs(want[0])) - 1e-6 and got[1] <= want[1] + 1e-6


def test_all_expands_in_the_given_order_so_weights_line_up():
    order = ["s%d" % i for i in range(50)]
    q = parse_query({"id": "q", "kind": "sum", "sources": "all", "weights": list(range(1, 51))}, order)
    assert q.sources == order and [q.weights[s] for s in order] == list(range(1, 51))


def test_running_sums_stay_exact_over_many_updates_of_very_different_magnitudes():
    """No re-summing: after every one of 20,000 updates the running SUM is the exact (correctly rounded)
    sum of the current terms, where a plain running float sum drifts (cancellation of 1e12-sized terms)."""
    r = random.Random("exact")
    n = 40
    srcs = ["s%d" % i for i in range(n)]
    q = parse_query({"id": "q", "kind": "sum", "sources": srcs, "precision": 1.0,
                     "weights": [r.choice([-3.0, 0.1, 1.0, 7.0]) for _ in srcs]}, set(srcs))
    bounds = {s: (0.0, 1.0) for s in srcs}
    run = aggregate.Running(q, bounds.__getitem__)
    plain = aggregate.answer(q, bounds.__getitem__)[0]
    drift = 0.0
    for step in range(20000):
        s = r.choice(srcs)
        lo = r.choice([r.uniform(-1e12, 1e12), r.uniform(-1e-3, 1e-3), r.uniform(-5, 5)])
        old = run._terms(s, bounds[s])[0]
        bounds[s] = (lo, lo + r.uniform(0, 2))
        run.update(s, bounds[s])
        plain += run._terms(s, bounds[s])[0] - old
        terms = [run._terms(x, bounds[x]) for x in srcs]
        exact_lo, exact_hi = math.fsum(t[0] for t in terms), math.fsum(t[1] for t in terms)
        assert (math.fsum(run.lo), math.fsum(run.hi)) == (exact_lo, exact_hi)
        got = run.interval()
        assert got[0] <= exact_lo and exact_hi <= got[1]
        drift = max(drift, abs(plain - exact_lo))
    assert drift > 1e-3          # the workload is one where a plain running sum would have drifted
