"""Guaranteed answer intervals from cached bounds (Olston et al. 2003 App. A and D), and exact answers.

``answer(query, known)`` takes ``known(key) -> (lo, hi)`` and returns the tightest interval that
contains the exact aggregate whenever every source value lies in its bound. ``exact(query, value)``
is the brute-force oracle used by the simulator's ground truth.
"""
import math

# Float summation error bound: |fsum - exact| is below one ulp; we pad by a relative 1e-12.
_PAD = 1e-12


def _pad(lo, hi, scale):
    e = _PAD * scale
    return lo - e, hi + e


def answer(q, known):
    """Interval [lo, hi] for query ``q`` given per-source bounds ``known(key)``."""
    k = q.kind
    if k in ("sum", "avg"):
        los, his = [], []
        for s in q.sources:
            w = q.weights[s]
            lo, hi = known(s)
            if w >= 0:
                los.append(w * lo)
                his.append(w * hi)
            else:
                los.append(w * hi)
                his.append(w * lo)
        if any(math.isinf(x) for x in los) or any(math.isinf(x) for x in his):
            return -math.inf, math.inf
        lo, hi = math.fsum(los), math.fsum(his)
        scale = math.fsum(abs(x) for x in los) + math.fsum(abs(x) for x in his)
        if k == "avg":
            n = len(q.sources)
            lo, hi, scale = lo / n, hi / n, scale / n
        return _pad(lo, hi, scale)
    if k == "min":
        bs = [known(s) for s in q.sources]
        return min(b[0] for b in bs), min(b[1] for b in bs)
    if k == "max":
        bs = [known(s) for s in q.sources]
        return max(b[0] for b in bs), max(b[1] for b in bs)
    if k == "count":
        if q.range is None:
            n = float(len(q.sources))
            return n, n
        a, b = q.range
        sure = maybe = 0
        for s in q.sources:
            lo, hi = known(s)
            if a <= lo and hi <= b:
                sure += 1
            if hi >= a and lo <= b:
                maybe += 1
        return float(sure), float(maybe)
    raise ValueError("no interval answer for kind %r" % k)


def exact(q, value):
    """The exact aggregate of ``q`` over true values ``value(key)`` (None when a value is missing)."""
    vals = [value(s) for s in q.sources]
    if any(v is None for v in vals):
        return None
    k = q.kind
    if k == "sum":
        return math.fsum(q.weights[s] * v for s, v in zip(q.sources, vals))
    if k == "avg":
        return math.fsum(q.weights[s] * v for s, v in zip(q.sources, vals)) / len(vals)
    if k == "min":
        return min(vals)
    if k == "max":
        return max(vals)
    if k == "count":
        if q.range is None:
            return float(len(vals))
        a, b = q.range
        return float(sum(1 for v in vals if a <= v <= b))
    raise ValueError("no exact answer for kind %r" % k)


def uniform_width(q):
    """Olston §1.2 uniform allocation: the equal width per source that meets q's precision δ."""
    k = q.kind
    if k in ("min", "max"):
        return q.precision
    if k == "avg":
        return q.precision * len(q.sources) / math.fsum(abs(w) for w in q.weights.values())
    if k == "sum":
        return q.precision / math.fsum(abs(w) for w in q.weights.values())
    return math.inf   # count: membership is tracked exactly by a range constraint instead
