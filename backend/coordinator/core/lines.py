"""Aggregates of per-source bounds linear in time, kept incrementally: our extension of Olston et al. 2003 App. A
(SUM, AVG, MIN, MAX of bounds) and Cheng et al. 2005 §3 (COUNT-in-range membership) to bounds
``[lo + dlo·(τ−a), hi + dhi·(τ−a)]`` (segments, Elmeleegy et al. 2009; constant bounds have slopes 0).

``Lines(q)`` follows one query as time moves forward: ``set(key, piece)`` puts a source on a new piece at the
current time, ``next_event()`` is the next instant its answer changes by itself (two MIN/MAX lines cross, a
line crosses a COUNT range's end), ``advance(t)`` moves to ``t``, ``line()`` states the answer there as one
line ``(lo, hi, dlo, dhi)`` valid until the next change. Costs: O(1) per change for SUM/AVG/COUNT, O(log n)
for MIN/MAX (a kinetic tournament, Basch et al. 1997). SUM/AVG are exact (Shewchuk partials and Dekker
products, as ``math.fsum`` is), rounded once outwards; MIN/MAX lines switch at crossings computed from the two
lines alone and are padded by the rounding of that instant. A piece is ``[a, lo, hi, dlo, dhi, why, mem]``:
``why`` a reason when the source's value is unknown there (lo = −inf, hi = inf), ``mem`` None or
{range: (sure, maybe)} when the membership is known better than from the bound (a range constraint).
"""
import heapq
import math

from backend.coordinator.core.aggregate import add_exact
from backend.coordinator.core.envelope import Extreme
from backend.coordinator.core.vouch import WIDER

INF = math.inf
SPLIT = 134217729.0         # 2**27 + 1, Veltkamp's splitter
SLACK = 2.0 ** -18          # a width this far (relative) over δ is the devices' rounding (a float32 board pads 2**-20)
TIGHT = 1e-9                # the same without a float32 device (a float64 piece pads 1e-12; as vouch.WIDTH_TOL)
A, LO, HI, DLO, DHI, WHY, MEM = range(7)


def two_product(a, b):
    """(p, e) with p + e = a·b exactly (Dekker 1971), p the rounded product; finite a, b below 1e290."""
    p = a * b
    c = SPLIT * a
    ah = c - (c - a)
    al = a - ah
    c = SPLIT * b
    bh = c - (c - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _exact(*pairs):
    """The floats whose sum is exactly Σ x·y over ``pairs`` (a pair with y 1.0 adds x itself)."""
    out = []
    for x, y in pairs:
        if y == 1.0:
            out.append(x)
        else:
            out.extend(two_product(x, y))
    return out


def value(p, side, t):
    """Piece ``p``'s lower (``side`` LO) or upper (HI) bound at ``t``."""
    v = p[side]
    return v if v == INF or v == -INF else v + p[side + 2] * (t - p[A])


class Sum:
    """Σ_k w_k·bound_k(τ) exactly: per side, partials of the intercepts at each piece's start (C), of the slopes
    (D) and of slope·start (E), so the sum at τ is C + D·τ − E, rounded once."""

    def __init__(self, q):
        self.w = q.weights
        self.terms = {}         # key -> its exact contribution per side: ((C, D, E) or None: infinite) ×2
        self.parts = [[[], [], []], [[], [], []]]
        self.inf = [0, 0]
        self.ver = 0

    def _terms(self, key, p):
        w = self.w[key]
        if w == 1.0 and not (p[DLO] or p[DHI]):     # (the common case: constant, unit weight)
            lo, hi = p[LO], p[HI]
            return ((lo,), (), ()) if -INF < lo < INF else None, ((hi,), (), ()) if -INF < hi < INF else None
        out = []
        for side in (LO, HI):
            s = side if w > 0 else LO + HI - side       # a negative weight swaps the ends
            v, dv, a = p[s], p[s + 2], p[A]
            if v == INF or v == -INF:
                out.append(None)
                continue
            c = _exact((w, v))
            d = _exact((w, dv)) if dv else []
            e = [x for y in d for x in _exact((y, a))] if d and a else []
            out.append((c, d, e))
        return out

    def ident(self):
        return self.ver

    def set(self, key, p):
        self.ver += 1
        old = self.terms.get(key)
        new = self.terms[key] = self._terms(key, p)
        for side in (0, 1):
            a, b = old[side] if old is not None else (), new[side]
            if a is None:
                self.inf[side] -= 1
                a = ()
            if b is None:
                self.inf[side] += 1
                b = ()
            for j in (0, 1, 2):
                xs = [-x for x in a[j]] if a else []
                if b:
                    xs += b[j]
                if xs:
                    add_exact(self.parts[side][j], *xs)

    def next_event(self):
        return INF

    def advance(self, t):
        pass

    def line(self, t, n):
        """(lo, hi, dlo, dhi) at ``t``, divided by ``n``, each rounded outwards."""
        out = []
        for side, way in ((0, -INF), (1, INF)):
            if self.inf[side]:
                out.append((way, 0.0))
                continue
            c, d, e = self.parts[side]
            if d or e:
                xs = list(c)
                for y in d:
                    xs.extend(two_product(y, t) if t else ())
                xs.extend(-x for x in e)
                v, s = math.fsum(xs), math.fsum(d)
            else:
                v, s = math.fsum(c), 0.0
            if n != 1:
                v, s = v / n, s / n
            out.append((math.nextafter(v, way), math.nextafter(s, way) if s else 0.0))
        (lo, dlo), (hi, dhi) = out
        return lo, hi, dlo, dhi


def _member(p, rng, t):
    """(sure, maybe) of piece ``p`` in closed range ``rng`` at ``t``."""
    if p[MEM] is not None and rng in p[MEM]:
        return p[MEM][rng]
    lo, hi = value(p, LO, t), value(p, HI, t)
    e = 4 * (math.ulp(lo) if abs(lo) < INF else 0.0) + 4 * (math.ulp(hi) if abs(hi) < INF else 0.0)
    return int(rng[0] <= lo - e and hi + e <= rng[1]), int(hi + e >= rng[0] and lo - e <= rng[1])


def membership(p, rng, t):
    """[(from, sure, maybe)] of piece ``p`` (entered at ``t``) in ``rng``: constant between the instants its
    lines cross the range's ends, each stretch's value conservative over the whole stretch (membership is
    convex in τ for linear bounds: sure over [u, v] iff at u and at v)."""
    first = _member(p, rng, t)
    if p[MEM] is not None and rng in p[MEM] or not (p[DLO] or p[DHI]) or p[WHY] is not None:
        return [(t, first[0], first[1])]
    cuts = set()
    for side in (LO, HI):
        if p[side + 2] and abs(p[side]) < INF:
            for end in rng:
                c = p[A] + (end - p[side]) / p[side + 2]
                if c > t:
                    cuts.add(c)
    cuts = sorted(cuts) + [INF]
    out, u = [], t
    for v in cuts:
        end = v if v < INF else max(u, 1e300)      # the last stretch: its limit, where slopes decide
        a, b = _member(p, rng, u), _member(p, rng, end)
        maybe = int(max(value(p, HI, u), value(p, HI, end)) >= rng[0] and min(value(p, LO, u), value(p, LO, end)) <= rng[1])
        out.append((u, a[0] & b[0], maybe | a[1] | b[1]))
        u = v
    return out


class Count:
    """COUNT-in-range: sure and maybe members, each source's membership changing on its own timetable."""

    def __init__(self, q):
        self.rng = q.range
        self.cur = {}           # key -> (sure, maybe)
        self.ver = {}
        self.heap = []          # (time, n, key, version, sure, maybe)
        self.n = 0
        self.sure = self.maybe = 0
        self.t = -INF

    def ident(self):
        return self.sure, self.maybe

    def _to(self, key, m):
        old = self.cur.get(key, (0, 0))
        self.sure += m[0] - old[0]
        self.maybe += m[1] - old[1]
        self.cur[key] = m

    def set(self, key, p):
        plan = membership(p, self.rng, self.t)
        v = self.ver[key] = self.ver.get(key, 0) + 1
        self._to(key, plan[0][1:])
        for u, s, m in plan[1:]:
            self.n += 1
            heapq.heappush(self.heap, (u, self.n, key, v, s, m))

    def next_event(self):
        h = self.heap
        while h and h[0][3] != self.ver[h[0][2]]:
            heapq.heappop(h)
        return h[0][0] if h else INF

    def advance(self, t):
        self.t = t
        while self.next_event() <= t:
            _, _, key, _, s, m = heapq.heappop(self.heap)
            self._to(key, (s, m))

    def line(self, t, n):
        return float(self.sure), float(self.maybe), 0.0, 0.0


class Constant:
    """COUNT without a range: the number of sources, whatever their values."""

    def __init__(self, q):
        self.n = float(len(q.sources))

    def ident(self):
        return self.n

    def set(self, key, p):
        pass

    def next_event(self):
        return INF

    def advance(self, t):
        pass

    def line(self, t, n):
        return self.n, self.n, 0.0, 0.0


class Lines:
    """One query's final answer as its sources' pieces change, as lines (see the module docstring)."""

    def __init__(self, q, slack=SLACK):
        self.q = q
        self.slack = slack      # relative width over δ that is rounding (SLACK with a float32 device, else TIGHT)
        k = q.kind
        self.agg = (Sum(q) if k in ("sum", "avg") else Extreme(q) if k in ("min", "max")
                    else Count(q) if q.range is not None else Constant(q))
        self.n = len(q.sources) if k == "avg" else 1
        self.why = {}           # key -> reason, for the sources whose value is unknown now
        self.said = None        # the reason text of ``why`` (None: to be made again)
        self.t = -INF
        self.wide_at = INF      # when the line stated last grows wider than δ (its bounds' slopes differ)

    def set(self, key, p):
        if p[WHY] is None:
            if self.why.pop(key, None) is not None:
                self.said = None
        elif self.why.get(key) != p[WHY]:
            self.why[key] = p[WHY]
            self.said = None
        self.agg.set(key, p)

    def next_event(self):
        return min(self.agg.next_event(), self.wide_at if self.wide_at >= self.t else INF)

    def advance(self, t):
        self.t = t
        self.agg.advance(t)

    def ident(self):
        """What the current line is made of: the same, the same line (a crossing that changed no winner), and
        whether it has grown wider than δ since it was stated."""
        return self.agg.ident(), tuple(self.why.items()), self.wide_at if self.t >= self.wide_at else None

    def line(self, precision):
        """The final answer's fields at the current time: lo, hi, dlo, dhi, degraded and its reason."""
        lo, hi, dlo, dhi = self.agg.line(self.t, self.n)
        rec = {"lo": lo, "hi": hi, "dlo": dlo, "dhi": dhi, "degraded": False}
        w, pad = hi - lo, self.slack * (abs(lo) + abs(hi))
        wide = w == INF or w > precision + (0.0 if self.t >= self.wide_at else pad)    # (the line grew to δ: wide)
        grown = precision + (pad / 4 if w < precision + pad / 4 else pad)    # (a float64 sum's rounding is less)
        at = self.t + (grown - w) / (dhi - dlo) if dhi > dlo and not wide else INF
        wide = wide or at <= self.t     # (bounds of different sources, or a hull: a MIN/MAX widens as it goes)
        self.wide_at = INF if wide else at
        said = WIDER % (w, precision) if wide else None
        if self.why:        # (a source unknown: a COUNT's bound can still be finite, and says its width)
            if self.said is None:
                self.said = reasons(self.why)
            rec["degraded"] = True
            rec["reason"] = self.said if said is None or w == INF else "%s; %s" % (self.said, said)
        elif wide:
            rec["degraded"] = True
            rec["reason"] = said
        return rec


def reasons(why, most=8):
    """``"lost uplink: d3, d5; offline: d7"``: the sources' reasons in order of first appearance."""
    by = {}
    for r in why.values():
        by.setdefault(r[0], {})[r[1]] = None
    parts = []
    for r, who in by.items():
        who = list(who)
        extra = " and %d more" % (len(who) - most) if len(who) > most else ""
        parts.append("%s: %s%s" % (r, ", ".join(who[:most]), extra))
    return "; ".join(parts)
