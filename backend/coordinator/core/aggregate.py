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


def weighted(w, lo, hi):
    """The (low, high) terms that a bound [lo, hi] (or a move of its ends) adds to a sum under weight ``w``."""
    return (w * lo, w * hi) if w >= 0 else (w * hi, w * lo)


def answer(q, known, member=None):
    """Interval [lo, hi] for query ``q`` given per-source bounds ``known(key)``; a COUNT-in-range
    takes ``member(key, range) -> (sure, maybe)`` when given (constraint membership), else the bounds."""
    k = q.kind
    if k in ("sum", "avg"):
        los, his = [], []
        for s in q.sources:
            a, b = weighted(q.weights[s], *known(s))
            los.append(a)
            his.append(b)
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
            if member is not None:
                x, y = member(s, q.range)
                sure += x
                maybe += y
                continue
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
    k, d = q.kind, q.budget()     # (δ less what clock skew needs, coordinator.core.reserve)
    if k in ("min", "max"):
        return d
    if k == "avg":
        return d * (len(q.sources) / q.norm())   # exactly δ for unit weights, whatever n
    if k == "sum":
        return d / q.norm()
    return math.inf   # count: membership is tracked exactly by a range constraint instead


def add_exact(partials, *xs):
    """Shewchuk's exact summation (as inside ``math.fsum``): ``partials``, non-overlapping floats in
    increasing magnitude whose sum is exact, now sum to their old sum plus each of ``xs``."""
    for x in xs:
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]


class Running:
    """Incremental form of ``answer`` for one query: O(1) (SUM/AVG/COUNT) or O(log n) (MIN/MAX)
    per changed source bound, whatever the query's size; ``answer`` is its oracle. SUM/AVG keep their
    sums exact (Shewchuk partials, as ``math.fsum`` does), so no update ever re-sums the query."""

    def __init__(self, q, known, member=None):
        self.q = q
        self.member = member if q.kind == "count" and q.range is not None else None
        self.bounds = {s: self._bound(s, known(s)) for s in q.sources}
        self._rebuild()

    def _rebuild(self):
        q = self.q
        if q.kind in ("sum", "avg"):
            self.lo, self.hi = [], []
            self.inf = 0
            sizes = []
            for s in q.sources:
                a, b = self._terms(s, self.bounds[s])
                if math.isinf(a) or math.isinf(b):
                    self.inf += 1
                else:
                    add_exact(self.lo, a)
                    add_exact(self.hi, b)
                    sizes += (abs(a), abs(b))
            self.scale = self.peak = math.fsum(sizes)
        elif q.kind in ("min", "max"):
            import heapq
            sign = 1.0 if q.kind == "min" else -1.0
            self.version = {s: 0 for s in q.sources}
            self.heaps = ([(sign * self.bounds[s][0], s, 0) for s in q.sources],
                          [(sign * self.bounds[s][1], s, 0) for s in q.sources])
            for h in self.heaps:
                heapq.heapify(h)
        elif q.kind == "count" and q.range is not None:
            self.sure = self.maybe = 0
            for s in q.sources:
                a, b = self._member(self.bounds[s])
                self.sure += a
                self.maybe += b

    def _terms(self, s, b):
        return weighted(self.q.weights[s], b[0], b[1])

    def _bound(self, s, b):
        """What is kept per source: its bound, or for a COUNT-in-range with ``member`` its membership."""
        return self.member(s, self.q.range) if self.member is not None else b

    def _member(self, b):
        if self.member is not None:
            return b
        a, c = self.q.range
        return (1 if a <= b[0] and b[1] <= c else 0), (1 if b[1] >= a and b[0] <= c else 0)

    def update(self, s, new):
        """Source ``s`` now has bound ``new`` (a (lo, hi) pair)."""
        old = self.bounds[s]
        if self.member is not None:
            new = self._bound(s, new)
        if old == new:
            return
        self.bounds[s] = new
        k = self.q.kind
        if k == "sum" or k == "avg":
            w = self.q.weights[s]
            a0, c0 = weighted(w, old[0], old[1])
            a1, c1 = weighted(w, new[0], new[1])
            isinf = math.isinf
            if isinf(a0) or isinf(c0):
                self.inf -= 1
                a0 = c0 = 0.0
            if isinf(a1) or isinf(c1):
                self.inf += 1
                a1 = c1 = 0.0
            add_exact(self.lo, -a0, a1)
            add_exact(self.hi, -c0, c1)
            self.scale += abs(a1) + abs(c1) - abs(a0) - abs(c0)
            if self.scale > self.peak:
                self.peak = self.scale
        elif k in ("min", "max"):
            import heapq
            sign = 1.0 if k == "min" else -1.0
            v = self.version[s] = self.version[s] + 1
            heapq.heappush(self.heaps[0], (sign * new[0], s, v))
            heapq.heappush(self.heaps[1], (sign * new[1], s, v))
            if len(self.heaps[0]) > 4 * len(self.version) + 16:
                self._rebuild()
        elif k == "count" and self.q.range is not None:
            a, b = self._member(old)
            c, d = self._member(new)
            self.sure += c - a
            self.maybe += d - b

    def _top(self, h):
        import heapq
        while h[0][2] != self.version[h[0][1]]:
            heapq.heappop(h)
        return h[0][0]

    def interval(self, shift=None):
        """The answer interval; for SUM/AVG ``shift`` (a ``brownian.interruption.Widening``) adds its exact
        sums of the offline sources' weighted moves."""
        q = self.q
        k = q.kind
        if k in ("sum", "avg"):
            if self.inf:
                return -math.inf, math.inf
            # exact sums rounded once; the pad (relative to the largest scale seen: the running
            # ``scale`` may drift by rounding) covers that rounding and the division of an AVG
            if shift is None:
                lo, hi, scale = math.fsum(self.lo), math.fsum(self.hi), max(self.peak, self.scale)
            else:
                lo, hi = math.fsum(self.lo + shift.lo), math.fsum(self.hi + shift.hi)
                scale = max(self.peak, self.scale) + shift.scale
            if k == "avg":
                n = len(q.sources)
                lo, hi, scale = lo / n, hi / n, scale / n
            return _pad(lo, hi, scale)
        if k in ("min", "max"):
            a, b = self._top(self.heaps[0]), self._top(self.heaps[1])
            return (a, b) if k == "min" else (-a, -b)
        if q.range is None:
            n = float(len(q.sources))
            return n, n
        return float(self.sure), float(self.maybe)
