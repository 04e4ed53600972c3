"""SWAT sliding-window Haar approximation tree (Bulut & Singh 2003 §2.2-2.6), portable to MicroPython.

The last N values (N = 2^n) are summarised by 3n-2 nodes: per level l < n-1 a Right, Shift and Left
node, and one Right node at the top. A level-l node summarises 2^(l+1) consecutive readings by the
first k Haar coefficients of that segment (k = 1: the average), kept as k sub-block averages, plus
the segment's exact minimum and maximum so that every answer carries a guaranteed error bound.
Level l is refreshed every 2^l arrivals (Fig. 3a): L := S, S := R, R := DWT(R_{l-1}, L_{l-1});
between refreshes a node's segment drifts back by the arrivals since. Memory is O(k log N).

Positions are relative: 0 is the newest reading. Queries (§2.4) pick, for every position, the first
node in the order (level, R -> S -> L) that covers it and reconstruct with zero detail coefficients.
The device's side of replicating the window to the backend (SWAT-ASR, §3) is ``swat_asr.py``.
"""

R, S, L = 0, 1, 2
_END, _LO, _HI = 0, 1, 2          # node = [end, lo, hi, a_0 .. a_{m-1}] (a_0 = newest sub-block)


def _log2(n):
    b = 0
    while (1 << b) < n:
        b += 1
    return b if (1 << b) == n else -1


def haar(xs):
    """Unnormalised Haar transform of a power-of-two list: [average, d_1, d_2a, d_2b, ...].

    Details are half-differences (first minus second half), coarsest first; inverting with zero
    details gives the piecewise-constant approximation SWAT answers with.
    """
    if _log2(len(xs)) < 0:
        raise ValueError("haar needs a power-of-two length")
    cur = list(xs)
    details = []
    while len(cur) > 1:
        avg = []
        det = []
        for j in range(0, len(cur), 2):
            avg.append((cur[j] + cur[j + 1]) / 2)
            det.append((cur[j] - cur[j + 1]) / 2)
        details = det + details
        cur = avg
    return cur + details


def weighted(weights, points):
    """(estimate, lo, hi) of sum w_j*x_j from per-term (estimate, lo, hi) bounds on each x_j."""
    est = lo = hi = 0.0
    for w, p in zip(weights, points):
        est += w * p[0]
        if w >= 0:
            lo += w * p[1]
            hi += w * p[2]
        else:
            lo += w * p[2]
            hi += w * p[1]
    return est, lo, hi


class Swat:
    def __init__(self, window, k=1):
        n = _log2(window) if isinstance(window, int) else -1
        if n < 2:
            raise ValueError("window must be a power of two >= 4, got %r" % (window,))
        if not isinstance(k, int) or k < 1 or _log2(k) < 0:
            raise ValueError("k (coefficients per node) must be a power of two >= 1, got %r" % (k,))
        self.window = window
        self.n = n
        self.k = k
        self.count = 0              # readings seen
        self.prev = None            # d_1, the raw reading before the newest (R_{-1}, L_{-1} of Fig. 3a)
        self.nodes = [[None, None, None] for _ in range(n)]

    # -- maintenance (Fig. 3a) --------------------------------------------------------
    def update(self, v):
        """Take the next reading; O(1) amortised (level l works once every 2^l readings)."""
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v - v == 0):
            raise ValueError("reading must be a finite number, got %r" % (v,))
        self.count += 1
        c = self.count
        prev = self.prev
        self.prev = v
        if prev is None:
            return
        if self.k > 1:
            node = [c, min(v, prev), max(v, prev), v, prev]
        else:
            node = [c, min(v, prev), max(v, prev), (v + prev) / 2]
        self._shift(0, node)
        l = 1
        top = self.n - 1
        while l <= top and c % (1 << l) == 0:
            below = self.nodes[l - 1]
            if below[L] is None:
                break
            self._shift(l, self._combine(below[R], below[L]))
            l += 1

    def _shift(self, l, node):
        lv = self.nodes[l]
        if l < self.n - 1:
            lv[L] = lv[S]
            lv[S] = lv[R]
        lv[R] = node

    def _combine(self, newer, older):
        a = newer[3:] + older[3:]
        if len(a) > self.k:
            a = [(a[j] + a[j + 1]) / 2 for j in range(0, len(a), 2)]
        return [newer[_END], min(newer[_LO], older[_LO]), max(newer[_HI], older[_HI])] + a

    # -- structure ----------------------------------------------------------------------
    def span(self, l, node):
        """Relative positions [first, last] that ``node`` (at level l) covers now."""
        first = self.count - node[_END]
        return first, first + (2 << l) - 1

    def each(self):
        """Yield (level, slot, node) in query order: level ascending, R -> S -> L."""
        for l in range(self.n):
            lv = self.nodes[l]
            for p in (R, S, L):
                if lv[p] is not None:
                    yield l, p, lv[p]

    def stored(self):
        """How many numbers the tree holds (the O(k log N) space of §2.6)."""
        total = 2
        for _, _, node in self.each():
            total += len(node)
        return total

    def coefficients(self, node):
        """The node's Haar coefficients (its segment's first m coefficients, newest reading first)."""
        return haar(node[3:])

    # -- queries (§2.4) ---------------------------------------------------------------
    def cover(self, i, min_level=0):
        """(level, node) approximating position i: the first node at level >= min_level in query
        order that covers it, else the first covering node at any level; None if none does."""
        if not isinstance(i, int) or i < 0 or i >= self.window:
            raise ValueError("position must be an integer in 0..%d, got %r" % (self.window - 1, i))
        start = 0
        while start < self.n - 1 and (4 << start) + (1 << start) <= i:
            start += 1
        for lo_level in (max(start, min_level), start):
            for l in range(lo_level, self.n):
                lv = self.nodes[l]
                for p in (R, S, L):
                    node = lv[p]
                    if node is not None:
                        first = self.count - node[_END]
                        if first <= i <= first + (2 << l) - 1:
                            return l, node
        return None

    def _approx(self, l, node, i):
        m = len(node) - 3
        off = i - (self.count - node[_END])
        return node[3 + off * m // (2 << l)]

    def point(self, i, min_level=0):
        """(estimate, lo, hi) for the reading at position i; lo <= exact <= hi always."""
        c = self.cover(i, min_level)
        if c is None:
            return None
        l, node = c
        return self._approx(l, node, i), node[_LO], node[_HI]

    def inner(self, positions, weights, min_level=0):
        """Inner product query (I, W): (estimate, lo, hi) with lo <= sum W[j]*d[I[j]] <= hi."""
        if len(positions) != len(weights) or not positions:
            raise ValueError("an inner product query needs equally long, non-empty positions and weights")
        points = []
        for i in positions:
            p = self.point(i, min_level)
            if p is None:
                return None
            points.append(p)
        return weighted(weights, points)

    def range_query(self, value, radius, first, last, min_level=0):
        """Positions in [first, last] whose reading lies in [value-radius, value+radius] (§2.4):
        (approximate set, positions surely inside, positions possibly inside), with
        sure <= exact <= possible by the nodes' bounds."""
        if last < first:
            raise ValueError("range query needs first <= last")
        a, b = value - radius, value + radius
        approx, sure, maybe = [], [], []
        for i in range(first, last + 1):
            p = self.point(i, min_level)
            if p is None:
                return None
            if a <= p[0] <= b:
                approx.append(i)
            if a <= p[1] and p[2] <= b:
                sure.append(i)
            if p[1] <= b and p[2] >= a:
                maybe.append(i)
        return approx, sure, maybe

    def window_values(self, min_level=0):
        """Reconstruct the whole window: lists (estimate, lo, hi) by position, None where uncovered.

        Paints nodes in reverse query order, first all of them then those at level >= min_level,
        so each position ends with the node ``cover`` picks (O(N), the paper's O(M + log^2 N))."""
        n = self.window
        est, lo, hi = [None] * n, [None] * n, [None] * n
        order = list(self.each())
        passes = (0, min_level) if min_level > 0 else (0,)
        for floor in passes:
            for idx in range(len(order) - 1, -1, -1):
                l, _, node = order[idx]
                if l < floor:
                    continue
                first = self.count - node[_END]
                size = 2 << l
                m = len(node) - 3
                for i in range(first, min(first + size, n)):
                    est[i] = node[3 + (i - first) * m // size]
                    lo[i] = node[_LO]
                    hi[i] = node[_HI]
        return est, lo, hi

    # -- replication segments (§3, Table 1) ------------------------------------------------
    def segments(self):
        """The window partition [0,1], [2,3], [4,7], ..., [N/2, N-1] with, per segment, a bound
        (lo, hi) valid for every reading at those positions now and the mean approximation;
        None for a segment not yet covered."""
        return [self.segment(j) for j in range(self.n)]

    def segment(self, j):
        """(lo, hi, mean) of replication segment j ([0,1], [2,3], [4,7], ...); None until covered."""
        return self._segment(0, 1) if j == 0 else self._segment(1 << j, (2 << j) - 1)

    def _segment(self, a, b):
        i = a
        lo = hi = None
        total = 0.0
        while i <= b:
            c = self.cover(i)
            if c is None:
                return None
            l, node = c
            first = self.count - node[_END]
            size = 2 << l
            end = min(first + size - 1, b)
            m = len(node) - 3
            blk = size // m
            for s in range(m):
                s0 = max(first + s * blk, i)
                s1 = min(first + (s + 1) * blk - 1, end)
                if s1 >= s0:
                    total += node[3 + s] * (s1 - s0 + 1)
            lo = node[_LO] if lo is None or node[_LO] < lo else lo
            hi = node[_HI] if hi is None or node[_HI] > hi else hi
            i = end + 1
        return lo, hi, total / (b - a + 1)
