"""Segment mode with a bounded lag: our extension of Olston et al. 2003 §1.2 bounds after the swing and slide
filters of Elmeleegy et al. 2009 (VLDB, "Online piece-wise linear approximation of numerical streams with
precision guarantees"; not one of the five papers).

Per source the device fits segments instead of reporting on exit: a ``LINE`` segment is the line through
its first reading (anchor ``t``, ``v``) whose slope ``p`` lies in a feasible interval [lo, hi] (a swing
filter), a ``CONST`` segment the constant ``p`` in [lo, hi] (piecewise constant at the midrange). Every
reading's value holds until the next reading, and it must lie within ±W/2 of the segment's line over that
whole hold (checked at both ends: the line is monotone), so the backend's bound line(τ) ± W/2 contains
the true value at every instant of the segment, not only at sample instants. A reading no line fits
closes the segment (its line: the middle of [lo, hi]) and opens the next one.

Lag: data of time τ must be sent by τ + ``lag`` (the query's L minus the network's λ, sent by the
backend). Closed segments wait and travel together; when the oldest unsent data is due, they go in one
message with the open segment ended there and the next *committed*: the constant of the last reading,
which goes on as long as readings keep within ±W/2 of it, so silence means "still on the committed
line". Its end travels with the next due message. Portable (MicroPython and CPython), float32-safe: times are the agent's clock
(integer ms on a board); the backend pads what it states for a float32 board.

Lagged and real-time queries on one source: the segments' width W and lag come from the lag queries (the
``segment`` control); the source's interval filter keeps the real-time queries' width and constraints
(infinite and none when only lag queries read it: it never reports). A reading that leaves that filter is
reported at once (codec kind ``rsegs``), and the report carries every pending segment record of the
device: the open segment ends at the report and the next, starting with the reported reading, is
committed as the constant it reports (``restart``). So while the filter's bound is no wider than W, the
committed constant holds for as long as the filter stays silent, the segments never need a message of
their own, and the source costs exactly its real-time reports; segments go on their own only when due
and no report carried them.
"""
from edge.core import codec
from edge.core.codec import WHY_EXIT, WHY_FIRST

INF = float("inf")
LINE = 1
CONST = 2
COMMITTED = 1           # record flag: the segment goes on past ``e`` (its line is fixed)
MAX_RECORDS = 90        # records in one message (44 bytes each, under codec.MAX_PAYLOAD)


def _mid(lo, hi):
    p = (lo + hi) / 2
    return p if p == p and p != INF and p != -INF else (lo if lo == hi else 0.0)


class Segmenter:
    """The segments of one source; ``lag`` in clock units."""

    def __init__(self, model, width, lag, rnd=None):
        if model != LINE and model != CONST:
            raise ValueError("segment model is 1 (line) or 2 (constant)")
        self.model = model
        self.lag = lag
        self.rnd = rnd          # None (native floats) or float32.f32: round every result as a float32 board does
        self.w = width
        self.h = self._r(width / 2)
        self.t = None           # anchor time of the open segment (None: no reading yet)
        self.v = None           # anchor value
        self.lo = -INF
        self.hi = INF           # feasible parameter (slope per clock unit, or the constant)
        self.pt = None          # previous reading
        self.pv = None
        self.committed = False
        self.done = []          # records not sent yet
        self.since = None       # earliest time whose data is not sent yet

    def _r(self, x):
        return x if self.rnd is None else self.rnd(x)

    def _fit(self, v, t):
        """The parameter interval putting ``v`` within ±h of the segment's line at time ``t``."""
        h, r = self.h, self._r
        if self.model == CONST:
            return r(v - h), r(v + h)
        d = t - self.t
        if d <= 0:
            return (-INF, INF) if -h <= r(v - self.v) <= h else (INF, -INF)
        d = r(d)
        return r(r(r(v - h) - self.v) / d), r(r(r(v + h) - self.v) / d)

    def _open(self, t, v):
        self.t, self.v, self.committed = t, v, False
        self.lo, self.hi = self._fit(v, t) if self.model == CONST else (-INF, INF)
        if self.since is None:
            self.since = t

    def _close(self, e):
        """Close the open segment at ``e`` (it covers [t, e)) and queue its record."""
        p = self.lo if self.committed else self._r(_mid(self.lo, self.hi))
        self.done.append((self.t, e, self.v if self.model == LINE else p, p if self.model == LINE else 0.0, self.w, 0))
        if self.since is None:
            self.since = e      # a committed segment's end is news

    def _hold(self, t):
        """The last reading held until ``t``: a line segment must still be within ±h of it there."""
        if self.model == LINE and t > self.pt:
            lo, hi = self._fit(self.pv, t)
            lo, hi = max(lo, self.lo), min(hi, self.hi)
            if lo > hi:
                self._close(self.pt)
                self._open(self.pt, self.pv)
                lo, hi = self._fit(self.pv, t)
            self.lo, self.hi = lo, hi

    def sample(self, t, v):
        """Take reading ``v`` at time ``t`` (times never decrease)."""
        if self.t is None:
            self._open(t, v)
        else:
            self._hold(t)
            lo, hi = self._fit(v, t)
            lo, hi = max(lo, self.lo), min(hi, self.hi)
            if lo > hi:
                self._close(t)
                self._open(t, v)
            else:
                self.lo, self.hi = lo, hi
        self.pt, self.pv = t, v

    def restart(self, t, v):
        """Reading ``v`` at ``t`` was reported (or is the last one, held until ``t``): the open segment ends at
        ``t`` and a new one starts there with it (committed at once by ``take``, as the constant ``v``)."""
        if self.t is not None:
            self._hold(t)
            if t > self.t:
                self._close(t)
        self._open(t, v)
        self.pt, self.pv = t, v

    def rewidth(self, width, model=None, lag=None, now=None):
        """A new width (or model, lag): the open segment ends at the last reading, the next starts there with it.
        A committed line ends at ``now`` instead (it held the last reading until then): it was sent as going
        on, so its end is news the backend must hear, never a line silently replaced from its start."""
        if width == self.w and model in (None, self.model) and lag in (None, self.lag):
            return
        at = self.pt
        if self.t is not None and self.committed and now is not None:
            self._hold(now)             # (it may end where it stopped holding the last reading)
            if self.committed:
                at = now
        if self.t is not None and at > self.t:
            self._close(at)             # under the old width and model
        self.w, self.h = width, self._r(width / 2)
        self.model = model or self.model
        self.lag = lag or self.lag
        if self.t is not None:
            self._open(at if at > self.t else self.t, self.pv)

    def due(self):
        """Clock time by which this source's unsent data must go out; None when nothing is owed."""
        return None if self.since is None else self.since + self.lag

    def take(self, now):
        """The records to send now; the open segment ends now and the next, starting with the last reading, is
        committed as that constant (centred on where the readings go on from, it holds longest: 3-8 % fewer
        messages on the trace suite than fixing the open segment's own flattest line)."""
        if self.t is not None and not self.committed and now > self.t:
            self.restart(now, self.pv)
        out = self.done
        self.done = []
        self.since = None
        if self.t is not None and not self.committed:
            self.lo = self.hi = 0.0 if self.model == LINE else self._r(_mid(self.lo, self.hi))
            self.committed = True
            p = self.lo
            out.append((self.t, now, self.v if self.model == LINE else p, p if self.model == LINE else 0.0,
                        self.w, COMMITTED))
        return out


# -- the agent's side (edge/agent.py calls these; ``agent.segs`` maps source index -> Segmenter) --------

def configure(agent, now, i, m):
    """A ``segment`` control: lag (ms), model and width for source ``i``; model 0 ends segment mode."""
    lag = agent._ms(m["lag"])
    if m["model"] and (lag <= 0 or m["model"] not in (LINE, CONST) or not m["width"] >= 0):
        raise ValueError("bad segment control")
    if agent.segs is None:
        agent.segs = {}
    s = agent.segs.get(i)
    width = m["width"] if agent.rnd is None else agent.rnd(m["width"])
    if s is not None and m["model"]:
        s.rewidth(width, m["model"], lag, now)
    elif m["model"]:
        s = agent.segs[i] = Segmenter(m["model"], width, lag, agent.rnd)
        if getattr(agent.filters[i], "slope", 0.0) and agent.values[i] is not None:     # a line: constant from here on
            return ride(agent, now, i, codec.WHY_ASSIGN, 1)
    if m["model"] and agent.values[i] is not None:
        s.restart(now, agent.values[i])     # its segments start now: what is sent next answers the control
    out = flush(agent, now, True)
    if not m["model"] and s is not None:
        del agent.segs[i]
        if agent.values[i] is not None:
            out.append(agent._report(now, i, codec.WHY_ASSIGN))    # back to reports: resynchronise
    return out


def sample(agent, now, i, v):
    """Reading ``v`` of source ``i``: reported at once if it leaves the source's filter, else segmented."""
    f = agent.filters[i]
    if not f.silent() and f.check(v):
        return ride(agent, now, i, WHY_FIRST if f.center is None else WHY_EXIT)
    agent.segs[i].sample(now, v)
    return flush(agent, now)


def ride(agent, now, i, why, ack=0):
    """Report source ``i`` (kind ``rsegs``) with every pending segment record of the device; a silent filter
    reports only when a control asks for an acknowledgement."""
    v = agent.values[i]
    if v is None or not ack and agent.filters[i].silent():
        return []
    agent.segs[i].restart(now, v)
    recs = _records(agent, now)
    return [agent._report(now, i, why, True, recs[:MAX_RECORDS])] + _send(agent, now, recs, MAX_RECORDS)


def deadline(agent):
    """The earliest due time of any source's unsent data, or None."""
    t = None
    if agent.segs:
        for s in agent.segs.values():
            d = s.due()
            if d is not None and (t is None or d < t):
                t = d
    return t


def _records(agent, now):
    """Every source's unsent records, its open segment committed (fixed from here on: silence then means "still
    on it", so nothing more is owed until a reading leaves it; left open, its data would fall due within the
    lag and cost a message of its own: on the trace suite committing at every message sends 15-30 % fewer)."""
    recs = []
    for i in sorted(agent.segs):
        epoch = agent.filters[i].epoch
        for a, e, v, p, w, flag in agent.segs[i].take(now):
            recs.append((i, epoch, a, e, v, p, w, flag))    # the codec's record (src epoch a e v s w f): a tuple,
    return recs                                             # not a dict each, on a board's heap


def _send(agent, now, recs, first=0):
    out = []
    for k in range(first, len(recs), MAX_RECORDS):
        agent.stats["reports"] += 1
        out.append(agent._up(now, "segs", {"t": now, "segs": recs[k:k + MAX_RECORDS]}))
    return out


def flush(agent, now, everything=False):
    """When some source's data is due (or ``everything``): one message (more if large) with every source's
    unsent segments."""
    t = deadline(agent)
    if t is None or (t > now and not everything):
        return []
    return _send(agent, now, _records(agent, now))


def complete(agent, now):
    """The time through which every source's segment data has been sent (``now`` when nothing is owed):
    what a heartbeat ``mark`` may claim (edge.core.delivery)."""
    t = now
    for s in agent.segs.values():
        if s.since is not None and s.since < t:
            t = s.since
    return t
