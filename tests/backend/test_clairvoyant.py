"""The clairvoyant minimum against a brute-force segmentation, and as a floor for the real filter."""
import random
from functools import lru_cache

from backend.sim.clairvoyant import minimum_reports
from edge.core.interval import IntervalFilter


def _brute(values, width):
    n = len(values)

    @lru_cache(maxsize=None)
    def best(i):
        if i == n:
            return 0
        out = n + 1
        for j in range(i + 1, n + 1):
            seg = values[i:j]
            if max(seg) - min(seg) > width:
                break
            out = min(out, 1 + best(j))
        return out
    return best(0)


def test_greedy_equals_brute_force_minimum():
    r = random.Random(0)
    for _ in range(300):
        vals = tuple(round(r.uniform(-5, 5), 1) for _ in range(r.randint(0, 14)))
        w = r.choice([0.0, 0.5, 1.0, 3.0])
        assert minimum_reports(vals, w) == _brute(vals, w)


def test_the_edge_filter_never_beats_the_clairvoyant_minimum():
    r = random.Random(1)
    for _ in range(100):
        v, vals = 0.0, []
        for _ in range(500):
            v += r.gauss(0, 1)
            vals.append(v)
        w = r.uniform(0.5, 10)
        f = IntervalFilter(width=w)
        sent = 0
        for x in vals:
            if f.check(x):
                f.recenter(x)
                sent += 1
        assert minimum_reports(vals, w) <= sent
