"""Bound cache (Olston et al. 2003 §1.2.3, §4): the backend's mirror of every source filter, by epoch.

Each source is mirrored by the same ``IntervalFilter`` the device runs. A change that widens the
device's filter is applied at once (the device stays narrower until it hears of it, which is safe).
A change that may narrow it keeps the previous mirror alive as well until an uplink carrying the new
epoch confirms that the device applied it; meanwhile ``known`` is the hull of both. Only the exact
current epoch confirms: an epoch the backend has not assigned yet is stale, not a confirmation.
Constraints are confirmed by their own epoch only: a device can drop a filter control (one sent before its
config arrived is stale to it) and take the next width, whose epoch then confirms no constraints; until a
report under the filter's epoch they are ``unsure``, and once a later epoch is reported (``skipped``) every
mirror states its bound without them.
A report whose true time is uncertain (a device clock within ±σ, ``integrity``) keeps the mirrors from
before it in ``prior`` until the latest instant it can have happened (``hold``/``release``); a guarded
report (the device reports any reading within its guard time that leaves the hull of its bound before and
the value: edge.agent) states meanwhile the hull of every mirror before it and the value (``tight``).
The mirror of a float32 device (birth capability CAP_F32) computes in float32 as the device does
and pads what it states by one float32 step (edge.core.interval).

Time-aware for linear sources (edge.core.predict, our extension of §1.2): ``known`` states the bound at
the cache's clock ``now`` (seconds; the coordinator sets it), the hull of the line over the window in
which the latest reading lies, valid until ``now + H``; ``due`` holds each line's next refresh.
"""
import heapq
import math

from edge.core.codec import newer
from edge.core.float32 import f32
from edge.core.predict import LineFilter, horizon


class Source:
    __slots__ = ("key", "device", "index", "filt", "old", "prior", "online", "_n", "_period", "clock", "last_t",
                 "value", "unit", "due", "tight", "unsure", "skipped")

    def __init__(self, key, device, index, width, epoch, single=False, unit=1, clock=None):
        self.key = key
        self.device = device
        self.index = index
        self.unit = unit       # device time units per second (1000: integer ms)
        self.due = None        # time (s) of the next refresh of a line's statement
        self.filt = LineFilter(width, (), epoch, f32 if single else None, single)
        self.old = []          # mirrors of states the device may still be in
        self.prior = []        # (until, mirror): states the device may have been in until then
        self.tight = None      # (until, lo, hi): a guarded report's hull, stated until then
        self.unsure = None     # epoch of a constraint change no report under it has acknowledged yet
        self.skipped = False   # a later epoch was reported meanwhile: the device may never have taken them
        self.online = True
        self.clock = clock or [0]      # the cache's period counter (shared by every source)
        self._n, self._period = 0, self.clock[0]
        self.last_t = None     # event time of the last report
        self.value = None      # last reported value

    @property
    def reports(self):
        """Reports received in the current adjustment period (a new period zeroes it in O(1))."""
        return self._n if self._period == self.clock[0] else 0

    @reports.setter
    def reports(self, n):
        self._n, self._period = n, self.clock[0]


def shrink_source(s, s_frac, until=None):
    """Olston §3.1's periodic shrink of the mirrors of source ``s`` the device may be in; ``until``: a device whose
    clock may be behind shrinks as late as this, so they stay in force unshrunk until then too (the final mirror
    shrank the copies it had just held: a final answer at a tick missed a reading the device was made to report
    only by its own later shrink; issue #30). The states held from before a report (``prior``) are not shrunk:
    the device leaves them by that report, which it sent before its clock reached the tick (else it shrinks
    within them, and a shrunk mirror lies inside the unshrunk one)."""
    kept = [(until, f.copy()) for f in [s.filt] + s.old] if until is not None else ()
    s.filt.shrink(s_frac)
    for f in s.old:
        f.shrink(s_frac)
    s.prior += kept


def _raw(f):
    """``f`` without its constraints: what the device states whichever constraints it holds."""
    g = f.copy()
    g.cons, g.mask = [], 0
    return g


def _member(f, rng):
    """(sure, maybe) for one mirror ``f``."""
    if f.center is not None:
        exact = f._cons([rng])[0]
        for i, c in enumerate(f.cons):
            if c == exact and exact == tuple(rng):
                inside = (f.mask >> i) & 1
                return inside, inside
    lo, hi = f.known()
    a, b = rng
    return int(a <= lo and hi <= b), int(hi >= a and lo <= b)


class BoundCache:
    def __init__(self):
        self.sources = {}
        self.now = -math.inf    # the time (s) ``known`` answers for
        self.due = []           # heap of (time, key): refreshes of linear sources' statements
        self.clock = [0]        # adjustment periods begun; a source's ``reports`` count the current one
        self.up = 0             # sources online

    def new_period(self):
        """Start an adjustment period: every source's ``reports`` reads 0 (O(1), whatever the fleet)."""
        self.clock[0] += 1

    def set_online(self, key, online):
        s = self.sources[key]
        self.up += bool(online) - s.online
        s.online = bool(online)

    def add(self, key, device, index, width, epoch, value=None, single=False, unit=1):
        """Mirror a new source; ``single``: the device computes in float32; ``unit``: its time units per s."""
        s = Source(key, device, index, width, epoch, single, unit, self.clock)
        self.up += 1
        if value is not None:
            s.filt.recenter(value)
            s.value = value
        self.sources[key] = s
        return s

    def known(self, key):
        s = self.sources.get(key)
        if s is None:
            return -math.inf, math.inf
        if s.tight is not None and s.tight[0] > self.now:
            return s.tight[1], s.tight[2]
        fs = [s.filt] + s.old + [f for _, f in s.prior] if s.old or s.prior else (s.filt,)
        if s.skipped:
            fs = [_raw(f) for f in fs]
        lo, hi = self._known(s, fs[0])
        for f in fs[1:]:
            a, b = self._known(s, f)
            if a < lo:
                lo = a
            if b > hi:
                hi = b
        return lo, hi

    def member(self, key, rng):
        """(sure, maybe) that ``key``'s value lies in the closed range ``rng`` (COUNT-in-range, Cheng §3):
        from the membership bit when every mirror in force tracks ``rng`` as a constraint (a source
        outside it, with no width, is known to be outside though ``known`` is unbounded), else from
        ``known``."""
        s = self.sources.get(key)
        if s is None:
            return 0, 1
        sure, maybe = 1, 0
        if s.tight is not None and s.tight[0] > self.now:         # (as ``known``)
            a, b = rng
            return int(a <= s.tight[1] and s.tight[2] <= b), int(s.tight[2] >= a and s.tight[1] <= b)
        for f in [s.filt] + s.old + [f for _, f in s.prior]:       # (as ``known``: held states too)
            a, b = _member(_raw(f) if s.skipped else f, rng)
            sure &= a
            maybe |= b
        return sure, maybe

    def _known(self, s, f):
        """``f``'s statement at ``now``: a line's hull over [now − gap, now + H] in device units
        (integer ms outwards to whole ms; a float clock two steps outwards for the rounding of ±)."""
        if not f.slope:
            return f.known()
        now, g, h = self.now * s.unit, f.gap, horizon(f.gap)
        if s.unit == 1:
            return f.known_over(math.nextafter(math.nextafter(now - g, -math.inf), -math.inf),
                                math.nextafter(math.nextafter(now + h, math.inf), math.inf))
        return f.known_over(math.floor(now + 1e-6) - g, math.ceil(now - 1e-6) + h)

    def report(self, key, epoch, t, v, line=None, lead=0):
        """Apply a report (or probe reply) of value ``v`` stamped ``t`` under ``epoch``; ``line``:
        (device time, slope, gap) of a line report; ``lead``: the side (±1) a constant's centre moved to
        (edge.core.predict ``LineFilter.lead``, each mirror at its own width, as its device would)."""
        s = self.sources[key]
        if epoch == s.unsure:               # the device holds the constraints of that epoch (a later one may
            s.unsure, s.skipped = None, False   # have reached it without them: issue #30)
        elif s.unsure is not None and newer(epoch, s.unsure):
            s.skipped = True
        if s.old and epoch == s.filt.epoch:
            s.old = []                      # the device has confirmed the newest assignment
        for f in [s.filt] + s.old if s.old else (s.filt,):
            if line is None:
                f.recenter(v)
                if lead:
                    f.lead(lead)
            else:
                f.line(line[0], v, line[1], line[2])
        s.due = None
        if s.filt.slope:
            self.refresh(s, t)
        s.reports += 1
        s.last_t = t
        s.value = v

    def refresh(self, s, t):
        """Schedule the next restatement of line source ``s`` after time ``t``."""
        s.due = max(t + horizon(s.filt.gap) / s.unit, math.nextafter(t, math.inf))   # (a gap below t's ulp)
        heapq.heappush(self.due, (s.due, s.key))

    def next_due(self):
        """Time of the earliest pending refresh (inf: none); stale entries are dropped."""
        due = self.due
        while due and self.sources[due[0][1]].due != due[0][0]:
            heapq.heappop(due)
        return due[0][0] if due else math.inf

    def refreshes(self, t):
        """Keys of the line sources due for restatement at ``t``, each rescheduled."""
        keys = []
        while self.next_due() == t:
            _, key = heapq.heappop(self.due)
            s = self.sources[key]
            keys.append(key)
            self.refresh(s, t)
        return keys

    def shrink(self, s_frac, hold=None):
        """A periodic shrink; ``hold``: {key: until} whose mirrors from before it stay in force until then."""
        hold = hold or {}
        for key, s in self.sources.items():
            shrink_source(s, s_frac, hold.get(key))

    def hold(self, key, until, tight=None):
        """Before a report that may have happened as late as ``until``: keep the current mirrors; ``tight``
        (a guarded report's value): state until then the hull of it and of every mirror before it (a tight
        hull in force and the band it stands for included: the device guards from its bound)."""
        s = self.sources[key]
        t = s.tight if s.tight is not None and s.tight[0] > self.now else None
        s.tight = None
        lo, hi = self.known(key)
        if t is not None:
            lo, hi = min(lo, t[1]), max(hi, t[2])
        if tight is None:
            if t is not None:       # the tight hull in force stays among the states: the hull itself, not the
                f = s.filt.copy()   # constraint membership the filter tracks now (a COUNT-in-range's source that
                f.set_bound(lo, hi, f.epoch)    # left and came back within its hull was counted in throughout)
                f.cons, f.mask = [], 0
                s.prior.append((t[0], f))
            s.prior += [(until, f.copy()) for f in [s.filt] + s.old]
            return
        s.tight = (max(until, t[0]) if t else until, min(lo, tight), max(hi, tight))

    def widen(self, key, v, lead=0):
        """A report of ``v`` that a newer one superseded arrived late: while that newer one's instant is
        uncertain the value may still have been in ``v``'s band (its bound before did not know it); ``lead``:
        that report's (its band lies past ``v``: edge.core.predict ``LineFilter.lead``)."""
        s = self.sources[key]
        f = max([s.filt] + s.old, key=lambda g: g.width).copy()
        f.recenter(v)
        f.lead(lead)
        lo, hi = f.known()
        if s.tight is not None and s.tight[0] > self.now:
            s.tight = (s.tight[0], min(s.tight[1], lo), max(s.tight[2], hi))
        until = max([u for u, _ in s.prior] + [self.now])
        if until > self.now:
            s.prior.append((until, f))

    def release(self, key, now):
        """Drop the held mirrors whose time is over by ``now``."""
        s = self.sources[key]
        s.prior = [(u, f) for u, f in s.prior if u > now]

    def _keep_old(self, s):
        s.old.append(s.filt.copy())

    def set_width(self, key, width, epoch=None):
        """Assign a width under a new epoch (``epoch``: the one the live mirror gave it); returns (epoch, narrowing)."""
        s = self.sources[key]
        narrowing = width < s.filt.width
        if narrowing:
            self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF if epoch is None else epoch
        s.filt.set_width(width, epoch)
        return epoch, narrowing

    def set_filter(self, key, width, cons, keep_old=True, epoch=None, acked=None):
        """Install constraints and a width under a new epoch (confirmed by the device unless ``keep_old`` is off);
        ``acked`` (default ``keep_old``): the device acknowledges it, so its constraints are unsure until then
        (else the protocol counts on them at once: their loss is ``resync``'s)."""
        s = self.sources[key]
        if keep_old:
            self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF if epoch is None else epoch
        if not (keep_old if acked is None else acked):
            s.unsure, s.skipped = None, False
        elif s.unsure is not None or s.filt._cons(cons) != s.filt.cons:
            s.unsure = epoch                # (sent again: this epoch confirms them)
        s.filt.set_filter(width, cons, epoch)
        return epoch

    def rebirth(self, key, width, epoch, t, v, single, unit):
        """A birth of ``key``'s device states its filter (``width`` under ``epoch``) and value ``v`` (None: none)
        at ``t``: trust it, under an epoch newer than both sides' (the device may have rebooted to epoch 0)."""
        s = self.sources[key]
        top = s.filt.epoch if newer(s.filt.epoch, epoch) else epoch
        s.old, s.unsure, s.skipped = [], None, False
        s.filt.rnd = f32 if single else None
        s.filt.pad = single
        s.unit = unit
        s.filt.set_filter(width, [], epoch)
        s.filt.center = None
        if v is not None:
            self.report(key, epoch, t, v)
        s.filt.epoch = top

    def set_bound(self, key, lo, hi):
        s = self.sources[key]
        self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF
        s.filt.set_bound(lo, hi, epoch)
        return epoch
