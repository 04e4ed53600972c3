"""Linear dual prediction and the online choice of filter model per source: our extension of Olston et al. 2003 §1.2.

Olston's bound is a constant interval of width W around the last report. Here device and backend may
instead extrapolate the same line from the last report, pred(t) = v0 + slope·(t − t0), and the device
reports when a reading leaves pred(t) ± h (or changes constraint membership, as before). The slope
and ``gap``, a bound on the time between two of the device's samples, travel in the report (codec kind
``line``), so the backend mirrors the line from the report alone. The backend states, at its time t,
the hull of the line over [t − gap, t + H] ± h, H = gap/4: the latest sample lies in [t − gap, t] (a
device that has no sample for ``gap`` reports its last reading as a constant), and the statement is
restated every H. With h = W/2 − |slope|·(gap + H)/2 that hull is never wider than W, so the precision
the backend allocated holds; a line for which h would be negative is not used (constant instead).

A third model, the *lead*, is a constant bound whose centre is moved ``LEAD``·W past the reported
reading towards the side the reading left the previous bound by (momentum: a signal that just crossed
a bound tends to go on): its report is a plain one whose ``why`` carries ``LEAD_UP`` or ``LEAD_DOWN``,
and the backend moves its mirror's centre by the same rounded amount (``LineFilter.lead``). The bound
still has width W and contains the reading (else the centre stays: both sides test it alike). The centre is
placed from the reading at the width in force, again at every width change (an assignment, Olston's shrink),
so the order in which a report and a width reach device and mirror does not matter (issue #29).

The model is chosen per source online by measured cost: the device runs the models in shadow over
its readings, counts the reports each would have sent over a recent window, and picks the cheaper at
each real report (linear only when it saves ``MARGIN``; the lead, which saves ~10 % where it pays
and loses up to 80 % where it does not, over a longer window ``LEAD_WINDOW`` and only when it saves
a sixteenth plus ``LEAD_MARGIN``), so no downlink is needed.

Times are device units (integer ms on a board, float seconds otherwise); ``t − t0`` is then exact and
every float operation is rounded by ``rnd`` as in ``edge.core.interval``, so a float32 board and its
padded float32 mirror compute the same line. Portable: MicroPython and CPython.
"""
from edge.core.codec import WHY_GAP
from edge.core.interval import IntervalFilter, INF

CONSTANT = 1        # model bits of the ``allow`` mask (codec kind ``setup``)
LINEAR = 2
MOMENTUM = 4        # the lead (with LINEAR: a device chooses among models only where lines are allowed)
GAP = 1.5           # gap bound = GAP × the latest sampling interval (jitter up to 50 % costs nothing)
MARGIN = 4          # linear is chosen when its shadow reports, plus a quarter, plus MARGIN, are at most constant's
WINDOW = 32         # shadow costs are halved when they sum to this: a window of recent reports
LEAD = 0.4375       # a lead's centre moves LEAD·W past its report (7/16: exact in float32)
LEAD_WINDOW = 256   # the lead's and the constant's shadow reports are halved when they sum to this
LEAD_UP = 0x40      # flags on a report's ``why`` (beside codec.GUARDED): its bound's centre moved up / down past
LEAD_DOWN = 0x20    # the value (``LineFilter.lead``; the backend strips them)
LEAD_MARGIN = 2     # the lead is chosen when its shadow reports, plus a sixteenth, plus LEAD_MARGIN, are at most constant's
GAPS = (0.001, 4.0e8)   # s: the gap bounds a backend accepts (coordinator admission); a source sampled
                        # more sparsely (gap > ~12.7 years) keeps the constant model


class LineFilter(IntervalFilter):
    """An ``IntervalFilter`` whose centre follows a line; slope 0 is the constant filter exactly."""

    def __init__(self, width=INF, cons=(), epoch=0, rnd=None, pad=False):
        IntervalFilter.__init__(self, width, cons, epoch, rnd, pad)
        self.t0 = 0
        self.v0 = 0.0
        self.slope = 0.0
        self.gap = 0
        self.led = 0        # a lead's side (±1; 0: none): its centre is placed from v0 at the width in force

    def pred(self, t):
        """The line at device time ``t``."""
        r = self._r
        return r(self.v0 + r(self.slope * r(float(t - self.t0))))

    def half(self):
        """h: half the band about the line (W/2 for a constant); negative: the line is not usable."""
        return band(self, self.slope, self.gap)

    def _place(self):
        c = self.center
        if c is not None and self.led:      # (any width change re-places a lead: device and mirror alike
            c = self.center = self._lead()  # whichever of a report and a width reaches them first)
        if c is None or self.width == INF:
            self.lo, self.hi = -INF, INF
        else:
            h = self.half() if self.slope else self.width / 2     # (``band`` of a constant)
            if h < 0:
                h = 0.0
            self.lo, self.hi = self._r(c - h), self._r(c + h)

    def check(self, v):
        """As ``IntervalFilter.check``; a line that a narrower width left without a band (h < 0) must
        be reported at once (the re-check after a shrink or an assignment)."""
        if self.slope and self.center is not None and self.half() < 0:
            return True
        return IntervalFilter.check(self, v)

    def at(self, t):
        """Place the band at device time ``t`` (a reading's time) before ``check``."""
        if self.slope and self.center is not None:
            self.center = self.pred(t)
            self._place()

    def recenter(self, v):
        """A constant report of ``v`` (births, probe replies, plain reports)."""
        self.slope = 0.0
        self.led = 0
        self.v0 = self._r(v)
        IntervalFilter.recenter(self, v)

    def line(self, t, v, slope, gap):
        """A report of ``v`` at ``t`` that starts the line of ``slope`` with sampling gap bound ``gap``."""
        self.led = 0
        IntervalFilter.recenter(self, v)
        self.t0 = t
        self.v0 = self.center
        self.slope = self._r(slope) if horizon(gap) > 0 else 0.0
        self.gap = gap
        self._place()

    def lead(self, sign):
        """Make the constant just reported a lead towards ``sign`` (±1; 0: none); returns the side set."""
        if self.slope or self.center is None:
            sign = 0
        self.led = sign
        self._place()
        return sign

    def _lead(self):
        """A lead's centre at the width in force: LEAD·W past its report v0 towards ``led``; v0 itself under
        constraints (their membership is the report's) or where the moved bound would leave v0 out (rounding
        at a tiny width). A function of the report, the side and the width only, so a width assigned or shrunk
        before or after the report on either side gives the same bound (issue #29)."""
        v, w, r = self.v0, self.width, self._r
        if self.cons or w == INF:
            return v
        c = r(v + self.led * r(w * LEAD))
        h = w / 2
        return c if r(c - h) <= v <= r(c + h) else v

    def set_bound(self, lo, hi, epoch):
        """An explicit bound is constant."""
        self.slope = 0.0
        self.led = 0
        IntervalFilter.set_bound(self, lo, hi, epoch)
        if self.center is not None:
            self.v0 = self.center

    def known_over(self, a, b):
        """Backend: the interval stated for any reading taken in device time [a, b] (a clamped to t0)."""
        if self.center is None or not self.slope or self.width == INF:
            return self.known()
        if a < self.t0:
            a = self.t0
        p, q = self.pred(a), self.pred(b)
        if q < p:
            p, q = q, p
        h = self.half()
        if h < 0:
            h = 0.0
        return self.clip(self._r(p - h), self._r(q + h))

    def copy(self):
        c = LineFilter(self.width, self.cons, self.epoch, self.rnd, self.pad)
        c.center, c.mask, c.lo, c.hi = self.center, self.mask, self.lo, self.hi
        c.t0, c.v0, c.slope, c.gap, c.led = self.t0, self.v0, self.slope, self.gap, self.led
        return c


def slope(f, t, v):
    """The slope from ``f``'s last report to the reading ``v`` at ``t`` (0 without a usable pair)."""
    if f.center is None or not t > f.t0:
        return 0.0
    r = f._r
    return r(r(v - f.v0) / r(float(t - f.t0)))


def horizon(gap):
    """H, how long a statement about a line holds (device units; integer ms stay integers)."""
    return gap // 4 if isinstance(gap, int) else gap / 4


def band(f, s, gap):
    """h for a line of slope ``s`` and gap bound ``gap`` at ``f``'s width: W/2 − |s|·(gap + H)/2."""
    h = f.width / 2
    if s:
        r = f._r
        h = r(h - r(abs(s) * r(float(gap + horizon(gap)))) / 2)
    return h


def feasible(f, s, gap):
    """Whether a line of slope ``s`` and gap ``gap`` leaves a non-negative band at ``f``'s width."""
    return horizon(gap) > 0 and f.width != INF and band(f, s, gap) >= 0


def side(f, v):
    """The side (±1, 0) of ``v`` from ``f``'s centre: where a reading left the bound (a lead's direction)."""
    c = f.center
    return 0 if c is None else (v > c) - (v < c)


class Chooser:
    """Device side, one source: its sampling times and the shadow costs of the three models."""

    def __init__(self, rnd=None, unit=1):
        self.unit = unit        # device time units per second (1000: integer ms)
        self.last = None        # time of the latest reading, and of the one before
        self.prev = None
        self.value = None       # the latest reading
        self.shadows = (LineFilter(INF, (), 0, rnd), LineFilter(INF, (), 0, rnd), LineFilter(INF, (), 0, rnd))
        self.cost = [0, 0, 0, 0]    # shadow reports of the constant, the linear model in the window; of the
        #                             lead, the constant in the lead's window

    def gap(self):
        """The gap bound a line started now would carry (0: no interval observed yet, or a gap outside
        ``GAPS``, which the backend would drop, so the source's reports are constants)."""
        if self.prev is None or not self.last > self.prev:
            return 0
        d = self.last - self.prev
        g = d + d // 2 if isinstance(d, int) else d * GAP
        return g if GAPS[0] * self.unit <= g <= GAPS[1] * self.unit else 0

    def sample(self, t, v, width):
        """A reading: advance the shadows at the filter's current ``width`` and count their reports
        (the linear shadow's gap reports included)."""
        last, value = self.last, self.value
        self.prev, self.last, self.value = last, t, v
        gap = self.gap()
        cost = self.cost
        for m in (0, 1, 2):
            g = self.shadows[m]
            if g.width != width:
                g.width = width
                g._place()
            if g.slope and g.center is not None and (last if last > g.t0 else g.t0) + g.gap <= t:
                cost[1] += 1
                g.line((last if last > g.t0 else g.t0) + g.gap, value, 0.0, g.gap)
            g.at(t)
            if g.center is None or g.check(v):
                sign = side(g, v)
                if g.center is not None:
                    cost[m] += 1
                    if not m:
                        cost[3] += 1
                s = slope(g, t, v) if m == 1 else 0.0
                g.line(t, v, s if feasible(g, s, gap) else 0.0, gap)
                if m == 2:
                    g.lead(sign)
        if cost[0] + cost[1] >= WINDOW:
            cost[0] >>= 1
            cost[1] >>= 1
        if cost[2] + cost[3] >= LEAD_WINDOW:
            cost[2] >>= 1
            cost[3] >>= 1

    def report(self, f, t, v, allow, constant=False):
        """A real report of ``v`` at ``t`` on filter ``f``: start the cheapest model there; the ``why`` flag of
        its lead (LEAD_UP, LEAD_DOWN; 0: none; a filter with constraints never leads: its membership is the reading's)."""
        gap = self.gap()
        s = 0.0
        c, l, m, k = self.cost
        if not constant and allow & LINEAR and (not allow & CONSTANT or l + (l >> 2) + MARGIN <= c):
            s = slope(f, t, v)
            if not feasible(f, s, gap):
                s = 0.0
        sign = side(f, v) if not (constant or s or f.cons) and allow & MOMENTUM and m + (m >> 4) + LEAD_MARGIN <= k else 0
        f.line(t, v, s, gap)
        sign = f.lead(sign)
        return LEAD_UP if sign > 0 else LEAD_DOWN if sign else 0


def _due(agent, i, f):
    """When line ``f`` of source ``i`` runs out of readings: ``gap`` after its latest reading or after
    the line's start, whichever is later (a shrink or assignment starts a line after the reading)."""
    last = agent.alt[i].last
    return (last if last > f.t0 else f.t0) + f.gap


def deadline(agent):
    """The earliest time a line's source would pass its gap without a reading (None: no line)."""
    t = None
    for i, f in enumerate(agent.filters):
        if f.slope and f.center is not None:
            d = _due(agent, i, f)
            if t is None or d < t:
                t = d
    return t


def gaps(agent, now):
    """Sources whose line passed its gap without a reading report their last reading as a constant,
    stamped at the instant the gap ran out."""
    out = []
    for i, f in enumerate(agent.filters):
        if f.slope and f.center is not None:
            at = _due(agent, i, f)
            if at <= now:
                out.append(agent._report(at, i, WHY_GAP, True))
    return out
