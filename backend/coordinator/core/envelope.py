"""The upper envelope of lines as time moves forward, kinetically (Basch, Guibas and Hershberger 1997, a kinetic
tournament): MIN and MAX of per-source bounds linear in time (our extension of Olston et al. 2003 App. A),
for ``lines.Lines``.

Each node of a tournament tree holds the winner of its two children now and the instant the loser overtakes
it (its certificate); advancing time processes the certificates that fail, in order, each re-fighting its node
and those above: O(log n) per change of a leaf, O(log² n) amortised per crossing. A crossing instant is computed
from the two lines alone, so every caller gets the same bits; at a failing certificate the steeper line wins
whatever the rounding of its value says, and the line stated is padded by what rounding that instant can cost.
"""
import heapq
import math

INF = math.inf
A, LO, HI = 0, 1, 2        # a piece: [a, lo, hi, dlo, dhi, ...] (lines.py)


def crossing(v1, s1, a1, v2, s2, a2):
    """When line 2 reaches line 1 (s2 > s1), from the two lines alone (the same bits whoever asks)."""
    a0 = a1 if a1 >= a2 else a2
    x1, x2 = v1 + s1 * (a0 - a1), v2 + s2 * (a0 - a2)
    return a0 + (x1 - x2) / (s2 - s1)


class Envelope:
    """The upper envelope (max) of one line per leaf as time moves forward: a kinetic tournament tree whose
    nodes hold the winner of their children and the instant the loser overtakes it."""

    def __init__(self, n):
        size = 1
        while size < n:
            size *= 2
        self.size = size
        self.leaf = [(-INF, 0.0, 0.0)] * size          # (value at a, slope, a)
        self.win = [-1] * (2 * size)
        for i in range(size):
            self.win[size + i] = i
        self.ver = [0] * size
        self.heap = []          # (time, node, version)
        self.t = -INF
        self.smax = 0.0         # largest |slope| seen: how much a rounded switching instant can cost

    def _val(self, i, t):
        v, s, a = self.leaf[i]
        return v if v == INF or v == -INF else v + s * (t - a)

    def _fight(self, node, forced=False):
        """Winner of ``node``'s children at ``self.t`` (``forced``: their certificate failed, the steeper
        wins) and its certificate."""
        i, j = self.win[2 * node], self.win[2 * node + 1]
        t = self.t
        si, sj = self.leaf[i][1], self.leaf[j][1]
        if forced:
            w = i if (si, -i) > (sj, -j) else j
        else:
            vi, vj = self._val(i, t), self._val(j, t)
            w = i if (vi, si, -i) > (vj, sj, -j) else j
        self.win[node] = w
        lo = j if w == i else i
        vw, sw, aw = self.leaf[w]
        vl, sl, al = self.leaf[lo]
        self.ver[node] += 1
        if sl > sw and vw not in (INF, -INF) and vl not in (INF, -INF):
            c = crossing(vw, sw, aw, vl, sl, al)
            heapq.heappush(self.heap, (c if c > t else t, node, self.ver[node]))

    def set(self, i, v, s, a):
        self.leaf[i] = (v, s, a)
        if abs(s) > self.smax:
            self.smax = abs(s)
        node = (self.size + i) // 2
        while node:
            self._fight(node)
            node //= 2

    def next_event(self):
        h = self.heap
        while h and h[0][2] != self.ver[h[0][1]]:
            heapq.heappop(h)
        return h[0][0] if h else INF

    def advance(self, t):
        """Move to ``t``: every certificate failing by then, in order, re-fights its node and the ones above."""
        self.t = t
        while self.next_event() <= t:
            when, node, _ = heapq.heappop(self.heap)
            self.t = when
            self._fight(node, forced=True)
            node //= 2
            while node:
                self._fight(node)
                node //= 2
        self.t = t

    def top(self, t):
        """(value at ``t``, slope, pad) of the envelope's line now; pad covers a rounded switching instant."""
        v, s, a = self.leaf[self.win[1]]
        if v == INF or v == -INF:
            return v, 0.0, 0.0
        x = v + s * (t - a)
        return x, s, 4 * (math.ulp(x) + self.smax * math.ulp(t))


class Extreme:
    """MIN/MAX of linear bounds: two envelopes (of the lower and of the upper ends; MIN negates)."""

    def __init__(self, q):
        self.pos = {k: i for i, k in enumerate(q.sources)}
        self.sign = 1.0 if q.kind == "max" else -1.0
        self.env = (Envelope(len(q.sources)), Envelope(len(q.sources)))

    def ident(self):
        return tuple(env.leaf[env.win[1]] for env in self.env)

    def set(self, key, p):
        i, g = self.pos[key], self.sign
        for env, side in zip(self.env, (LO, HI)):
            env.set(i, g * p[side], g * p[side + 2], p[A])

    def next_event(self):
        return min(self.env[0].next_event(), self.env[1].next_event())

    def advance(self, t):
        self.env[0].advance(t)
        self.env[1].advance(t)

    def line(self, t, n):
        (a, da, pa), (b, db, pb) = self.env[0].top(t), self.env[1].top(t)
        if self.sign > 0:
            return a - pa, b + pb, da, db
        return -a - pa, -b + pb, -da, -db
