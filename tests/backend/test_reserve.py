"""The precision a query keeps for clock skew (backend/coordinator/core/reserve.py) against a brute-force
quantile of the excesses it was shown, and its effect on the widths handed out (Query.budget)."""
import random

from backend.coordinator.core import aggregate
from backend.coordinator.core.queries import parse_query
from backend.coordinator.core.reserve import BINS, COUNT, FIRST, QUANTILE, Reserve
from backend.coordinator.precision.rows import Rows


def query(precision=10.0):
    return parse_query({"id": "q", "kind": "sum", "sources": ["a", "b"], "precision": precision}, ["a", "b"])


def test_exact_clocks_keep_no_reserve():
    r, q = Reserve(), query()
    for k in range(5 * COUNT):
        assert not r.observe(q, float(k), 10.0 - (k % 3))      # never past δ
    assert r.get("q") == 0.0


def test_the_reserve_is_the_quantile_of_the_excess_over_the_epochs():
    rng = random.Random(4)
    r, q = Reserve(), query(10.0)
    excess = [rng.choice([0.0] * 9 + [rng.uniform(0.0, 4.0)]) for _ in range(FIRST)]
    moved = [r.observe(q, float(k), 10.0 + x) for k, x in enumerate(excess)]
    assert moved[-1] and not any(moved[:-1])                # the first epoch ends after FIRST changes
    xs = sorted(excess)
    want = xs[min(len(xs) - 1, int(QUANTILE * len(xs)))]     # brute force, to the bin above
    assert want <= r.get("q") <= want + 10.0 / BINS + 1e-12
    q.reserve = r.get("q")
    assert aggregate.uniform_width(q) == (10.0 - q.reserve) / 2
    rows = Rows({"q": q})
    assert rows.budget == [10.0 - q.reserve]


def test_it_follows_the_excess_down_when_clocks_are_known_better():
    r, q = Reserve(), query(10.0)
    for k in range(FIRST):
        r.observe(q, float(k), 13.0)
    assert r.get("q") >= 3.0
    t = float(FIRST)
    for _ in range(3):                                       # answers now within δ − R: R comes down
        for _ in range(COUNT):
            t += 1.0
            r.observe(q, t, 10.0 - r.get("q"))
    assert r.get("q") == 0.0
