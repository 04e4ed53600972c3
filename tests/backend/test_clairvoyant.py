"""The clairvoyant minima (constant and linear pieces) against brute-force segmentations, and as a floor for the real filter."""
import random
from functools import lru_cache

from backend.sim.clairvoyant import minimum_reports, minimum_segments
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


def _fits(pts, h, eps=1e-9):
    """Brute force: a line within ±h of every (t, v) exists iff one through two band endpoints at distinct
    times does (a non-empty bounded feasible polygon has a vertex), or all times are equal and the range fits."""
    times = {t for t, _ in pts}
    if len(times) == 1:
        return max(v for _, v in pts) - min(v for _, v in pts) <= 2 * h + eps
    for t1, v1 in pts:
        for t2, v2 in pts:
            if t2 <= t1:
                continue
            for a in (v1 - h, v1 + h):
                for b in (v2 - h, v2 + h):
                    s = (b - a) / (t2 - t1)
                    if all(abs(a + s * (t - t1) - v) <= h + eps for t, v in pts):
                        return True
    return False


def _brute_segments(times, values, width):
    pts = list(zip(times, values))
    n = len(pts)

    @lru_cache(maxsize=None)
    def best(i):
        if i == n:
            return 0
        return min(1 + best(j) for j in range(i + 1, n + 1) if _fits(pts[i:j], width / 2))
    return best(0)


def test_linear_minimum_equals_brute_force_minimum():
    r = random.Random(2)
    for _ in range(400):
        n = r.randint(0, 11)
        times = tuple(sorted(r.choice([r.uniform(0, 20), float(r.randint(0, 6))]) for _ in range(n)))
        values = tuple(r.uniform(-5, 5) for _ in range(n))
        w = r.choice([0.3, 1.0, 3.0, 6.0])
        got = minimum_segments(times, values, w)
        assert got == _brute_segments(times, values, w), (times, values, w)
        assert got <= minimum_reports(values, w)


def test_linear_minimum_on_lines_and_kinks():
    assert minimum_segments([], [], 1.0) == 0
    assert minimum_segments(range(50), [3.0 * t - 7 for t in range(50)], 0.01) == 1
    assert minimum_segments(range(9), [0, 1, 2, 3, 4, 3, 2, 1, 0], 0.01) == 2
    assert minimum_segments([0, 0, 1, 1], [0.0, 0.5, 1.0, 1.5], 0.6) == 1     # equal times share a band
    assert minimum_segments([0, 0, 1, 1], [0.0, 0.5, 1.0, 1.7], 0.6) == 2
