"""Event-to-event readings for the fleet simulator (DESIGN.md §5): which readings must reach an agent, found in bulk.

Each source's readings are one array. While a source's filter has a fixed bound (``bound``), the index
of its next reading outside it is found with ``outside`` over the array (the vectorised form of
``IntervalFilter.check``'s bound test, kept here so the board's filter stays small; tests/backend/test_screen.py
holds them equal) in chunks; a device that chooses its filter model (``edge.core.predict``) has a
bound too (``models_bound``: its filter and both shadow models, lines evaluated at each reading's
time, and the linear shadow's gap); a source without a bound needs every reading. A heap orders
these indices over all sources, so the readings before the smallest are silent: they change nothing
but their source's latest value and sample count (and a chooser's sampling times and where its lines
stand), which reach the agent lazily (``hand``), and the ground truth, which takes them in bulk. An
index may also be a checkpoint (the end of a searched chunk, still inside): it is looked at and the
search goes on, so a bound that changes often costs one chunk per change, never a scan to the distant exit.
"""
import bisect
import heapq

import numpy as np

INF = float("inf")

SCALAR = 4          # readings looked at one by one before a numpy search
FIRST_CHUNK = 32


def outside(lo, hi, v):
    """``IntervalFilter.check``'s bound test over a numpy array of readings."""
    return (v < lo) | (v > hi)


def bound(f):
    """``(lo, hi)`` of an ``IntervalFilter`` when a reading is reported exactly when ``outside`` them,
    else None (no report yet, or constraints: membership counts too)."""
    if f.center is None or f.cons:
        return None
    return f.lo, f.hi


def metered(b, sh):
    """Bound ``b`` (``bound`` or ``models_bound``) of a source with a deadband shadow ``sh`` (edge.core.meter:
    a constant filter, or None: no shadow), which sees every reading too: narrowed to the shadow's bound;
    None when the shadow needs every reading (no report yet, constraints)."""
    if sh is None or b is None:
        return b
    if sh.center is None or sh.cons:
        return None
    return (max(b[0], sh.lo), min(b[1], sh.hi)) + tuple(b[2:])


def models_bound(f, ch):
    """The bound of a source whose device chooses its filter model (``edge.core.predict``): filter
    ``f`` and ``Chooser`` ``ch``. A reading changes more than the chooser's sampling times and the lines'
    placement exactly when it leaves ``f`` or either shadow (a line's band about the line at the
    reading's time) or the linear shadow's gap runs out before it: ``(lo, hi, lines, gap)`` with
    ``[lo, hi]`` the constant bands' intersection, ``lines`` (t0, v0, slope, h) per line and ``gap``
    (t0, gap) of the shadow's line, or None (no report yet, constraints, a width the shadows have not
    taken yet, a line without a band, a float32 filter)."""
    if f.cons or f.rnd is not None:
        return None
    lo, hi, lines, gap = -INF, INF, [], None
    for k, g in enumerate((f,) + tuple(ch.shadows)):
        if g.center is None or g.width != f.width:
            return None
        if g.slope:
            h = g.half()
            if h < 0:
                return None
            lines.append((g.t0, g.v0, g.slope, h))
            if k:
                if gap is not None:
                    return None
                gap = (g.t0, g.gap)
        else:
            lo, hi = max(lo, g.lo), min(hi, g.hi)
    return lo, hi, tuple(lines), gap


class Screen:
    def __init__(self, ss, vs, n, ts=None):
        order = np.argsort(ss, kind="stable")
        cuts = np.cumsum(np.bincount(ss, minlength=n))[:-1]
        self.val = np.split(vs[order], cuts)       # per source: its readings' values
        self.pos = [p.tolist() for p in np.split(order, cuts)]      # ... and global indices, increasing
        self.vals = [v.tolist() for v in self.val]
        self.time = np.split(ts[order], cuts) if ts is not None else None     # ... and times (model bounds)
        self.times = [t.tolist() for t in self.time] if ts is not None else None
        self.size = len(ss)
        self.bound = [None] * n                    # the bound the search used (bound, models_bound); None: every reading counts
        self.chunk = [FIRST_CHUNK] * n
        self.handed = [0] * n                      # readings of each source already given to its agent
        self.nxt = [self.size] * n                 # global index of each source's next reading to look at
        self.heap = []
        for s in range(n):
            self._look(s, 0)

    def local(self, s, i):
        """How many of source ``s``'s readings come before global index ``i``."""
        return bisect.bisect_left(self.pos[s], i)

    def _look(self, s, p):
        """Set source ``s``'s next index to look at, searching its readings from local index ``p``: the
        next few one by one (a busy source leaves its bound soon), then a chunk in numpy."""
        pos, b = self.pos[s], self.bound[s]
        n = len(pos)
        if p < n and b is not None:
            stop = min(p + SCALAR, n)
            if len(b) == 2:
                lo, hi = b
                vals = self.vals[s]
                while p < stop and not outside(lo, hi, vals[p]):
                    p += 1
            else:
                while p < stop and not self._out(s, b, p):
                    p += 1
            if p == stop and p < n:
                c = self.chunk[s]
                hit = np.flatnonzero(self._outs(s, b, p, c))
                if len(hit):
                    p += int(hit[0])
                else:               # a checkpoint: the first reading not searched
                    p += c
                    self.chunk[s] = 4 * c
        g = pos[p] if p < n else self.size
        self.nxt[s] = g
        if g < self.size:
            heapq.heappush(self.heap, (g, s))

    def _out(self, s, b, p):
        """Whether reading ``p`` (local index) of ``s`` leaves bound ``b`` (``bound`` or ``models_bound``)."""
        v = self.vals[s][p]
        if v < b[0] or v > b[1]:
            return True
        if len(b) == 2:
            return False
        t = self.times[s][p]
        for t0, v0, slope, h in b[2]:
            c = v0 + slope * (t - t0)       # LineFilter.pred and _place, unrounded (no float32 here)
            if v < c - h or v > c + h:
                return True
        if b[3] is None:
            return False
        if p == 0:
            return True
        last, (t0, gap) = self.times[s][p - 1], b[3]
        return (last if last > t0 else t0) + gap <= t       # Chooser.sample's gap test

    def _outs(self, s, b, p, c):
        """``_out`` over readings ``p`` .. ``p + c - 1`` of ``s`` as a numpy boolean array."""
        v = self.val[s][p:p + c]
        out = outside(b[0], b[1], v)
        if len(b) == 2:
            return out
        t = self.time[s][p:p + c]
        for t0, v0, slope, h in b[2]:
            line = v0 + slope * (t - t0)
            out |= (v < line - h) | (v > line + h)
        if b[3] is not None:
            t0, gap = b[3]
            last = self.time[s][max(p - 1, 0):p - 1 + len(v)]
            if p == 0:
                last = np.concatenate((t[:1], last))
            out |= np.maximum(last, t0) + gap <= t
            out[0] |= p == 0
        return out

    def set_bound(self, s, bound, i):
        """Source ``s``'s filter now has ``bound`` (or None); readings before global index ``i`` are consumed.
        A caller that has just given the reading at ``i - 1`` to the agent of ``s`` (``handed[s]`` counts it)
        sets ``bound[s] = False`` first, so it is looked again from there."""
        if bound is None or bound != self.bound[s]:
            used = self.bound[s] is False       # then its agent has every reading before i
            self.bound[s] = bound
            self.chunk[s] = FIRST_CHUNK
            self._look(s, self.handed[s] if used else self.local(s, i))

    def next(self):
        """The smallest global index some source needs looked at (``size`` when none)."""
        heap, nxt = self.heap, self.nxt
        while heap and nxt[heap[0][1]] != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else self.size

    def silent(self, s, k, v):
        """Whether reading ``k`` (value ``v``) of ``s`` is a checkpoint inside the bound; then search on past it."""
        b = self.bound[s]
        if b is None or outside(b[0], b[1], v):
            return False
        p = self.local(s, k)
        if len(b) > 2 and self._out(s, b, p):
            return False
        self._look(s, p + 1)
        return True

    def hand(self, s, i):
        """(value, count, local index past the last) of the readings of ``s`` before global index ``i``
        not yet given to its agent, or None."""
        c = self.local(s, i)
        d = c - self.handed[s]
        if d <= 0:
            return None
        self.handed[s] = c
        return self.vals[s][c - 1], d, c
