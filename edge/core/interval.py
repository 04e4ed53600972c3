"""Per-source interval filter: Olston et al. 2003 §1.2/§3.1 bounds and shrinking, Cheng et al. 2005 §3 constraints.

One object serves the device (which sees readings) and the backend's bound cache (which mirrors
the device from reports and control messages), so both sides run the same arithmetic.

State: a bound ``[lo, hi]`` of ``width`` centred on the last reported value, plus optional
constraints ``[(l, u), ...]`` whose membership is tracked as a bitmask. A reading is reported when it
leaves the bound or changes the membership of any constraint. ``width = inf`` with no constraints
never reports. Cheng's false-positive filter is the constraint ``(-inf, inf)`` (always inside),
the false-negative filter / shutdown is ``(inf, inf)`` (never inside).

Float precision: a filter built with ``rnd=float32.f32`` rounds the result of every operation to
float32, which is exactly what a single-precision board computes (double rounding through a double is
innocuous for +, -, *, / of float32 operands), so the backend's mirror of such a device is
bit-identical to it; a mirror (``pad=True``) also widens what it states by one float32 step on each
side, in case a board flushes or rounds differently. On a device, ``rnd`` is None: the hardware rounds.
"""
INF = float("inf")


def membership(cons, v):
    """Bitmask of the constraints in ``cons`` that contain ``v`` (closed intervals)."""
    mask = 0
    bit = 1
    for l, u in cons:
        if l <= v <= u:
            mask |= bit
        bit <<= 1
    return mask


class IntervalFilter:
    """Bound/constraint filter for one numeric source. Sans-IO: no clock, no sockets."""

    def __init__(self, width=INF, cons=(), epoch=0, rnd=None, pad=False):
        self.rnd = rnd       # None (native floats) or f32 (emulate a single-precision device)
        self.pad = pad       # widen known() by one float32 step per side (a mirror of a float32 device)
        self.width = self._r(width)
        self.cons = self._cons(cons)
        self.epoch = epoch
        self.center = None   # last reported value; None until the first report
        self.mask = 0        # constraint membership of the last reported value
        self.lo = -INF
        self.hi = INF

    def _r(self, x):
        return x if self.rnd is None else self.rnd(x)

    def _cons(self, cons):
        if self.rnd is None:
            return list(cons)
        return [(self.rnd(l), self.rnd(u)) for l, u in cons]

    def _place(self):
        c = self.center
        if c is None:
            self.lo, self.hi = -INF, INF
        elif self.width == INF:
            self.lo, self.hi = -INF, INF
        else:
            half = self.width / 2
            self.lo, self.hi = self._r(c - half), self._r(c + half)

    def check(self, v):
        """True when reading ``v`` must be reported under the current filter."""
        if self.center is None:
            return True
        if v < self.lo or v > self.hi:
            return True
        return bool(self.cons) and membership(self.cons, v) != self.mask

    def recenter(self, v):
        """Apply a report of ``v``: centre the bound on it and record its constraint membership."""
        v = self._r(v)
        self.center = v
        self.mask = membership(self.cons, v) if self.cons else 0
        self._place()

    def shrink(self, s):
        """One periodic shrink W := W·(1−S), symmetric about the centre (Olston §3.1)."""
        if self.width != INF and s:
            r = self._r
            self.width = r(self.width * r(1 - r(s)))
            self._place()

    def set_width(self, width, epoch):
        """Grow or assign the width about the current centre (Olston §3.2)."""
        self.width = self._r(width)
        self.epoch = epoch
        self._place()

    def set_bound(self, lo, hi, epoch):
        """Assign an explicit bound [lo, hi]; later reports recentre with width hi − lo."""
        if hi < lo:
            raise ValueError("bound with hi < lo")
        lo, hi = self._r(lo), self._r(hi)
        self.epoch = epoch
        if lo == -INF or hi == INF:
            self.width = INF
            self._place()
            return
        self.width = self._r(hi - lo)
        self.center = self._r(lo + hi) / 2
        self.lo, self.hi = lo, hi

    def set_filter(self, width, cons, epoch):
        """Install Cheng constraints ``cons`` (list of (l, u)) together with a bound width."""
        self.width = self._r(width)
        self.cons = self._cons(cons)
        self.epoch = epoch
        self._place()           # (before the membership: a placement may move the centre, edge.core.predict)
        if self.center is not None:
            self.mask = membership(self.cons, self.center) if self.cons else 0

    def known(self):
        """The tightest interval the backend can state for the current value, from its mirror."""
        if self.center is None:
            return -INF, INF
        return self.clip(self.lo, self.hi)

    def clip(self, lo, hi):
        """``[lo, hi]`` narrowed by the constraints' membership, padded when a float32 mirror."""
        bit = 1
        for l, u in self.cons:
            if self.mask & bit:
                if l > lo:
                    lo = l
                if u < hi:
                    hi = u
            elif lo >= l:
                if u > lo:
                    lo = u
            elif hi <= u:
                if l < hi:
                    hi = l
            bit <<= 1
        if self.pad:
            from edge.core.float32 import step      # backend only: boards never pad
            lo, hi = step(lo, False), step(hi, True)
        return lo, hi

    def copy(self):
        """An independent copy of this filter's state."""
        c = IntervalFilter(self.width, self.cons, self.epoch, self.rnd, self.pad)
        c.center, c.mask, c.lo, c.hi = self.center, self.mask, self.lo, self.hi
        return c

    def silent(self):
        """True when no reading can ever trigger a report (width inf and only FP/FN constraints)."""
        if self.width != INF:
            return False
        for l, u in self.cons:
            if not ((l == -INF and u == INF) or l == INF or u == -INF):
                return False
        return True
