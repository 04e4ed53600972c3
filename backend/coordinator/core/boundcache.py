"""Bound cache (Olston et al. 2003 §1.2.3, §4): the backend's mirror of every source filter, by epoch.

Each source is mirrored by the same ``IntervalFilter`` the device runs. A change that widens the
device's filter is applied at once (the device stays narrower until it hears of it, which is safe).
A change that may narrow it keeps the previous mirror alive as well until an uplink carrying the new
epoch confirms that the device applied it; meanwhile ``known`` is the hull of both. Only the exact
current epoch confirms: an epoch the backend has not assigned yet is stale, not a confirmation.
The mirror of a float32 device (birth capability CAP_F32) computes in float32 as the device does
and pads what it states by one float32 step (edge.core.interval).
"""
import math

from edge.core.float32 import f32
from edge.core.interval import IntervalFilter


class Source:
    __slots__ = ("key", "device", "index", "filt", "old", "online", "_n", "_period", "clock", "last_t", "value")

    def __init__(self, key, device, index, width, epoch, single=False, clock=None):
        self.key = key
        self.device = device
        self.index = index
        self.filt = IntervalFilter(width, (), epoch, f32 if single else None, single)
        self.old = []          # mirrors of states the device may still be in
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


class BoundCache:
    def __init__(self):
        self.sources = {}
        self.clock = [0]        # adjustment periods begun; a source's ``reports`` count the current one
        self.up = 0             # sources online

    def new_period(self):
        """Start an adjustment period: every source's ``reports`` reads 0 (O(1), whatever the fleet)."""
        self.clock[0] += 1

    def set_online(self, key, online):
        s = self.sources[key]
        self.up += bool(online) - s.online
        s.online = bool(online)

    def add(self, key, device, index, width, epoch, value=None, single=False):
        """Mirror a new source; ``single``: the device computes in float32."""
        s = Source(key, device, index, width, epoch, single, self.clock)
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
        lo, hi = s.filt.known()
        for f in s.old:
            a, b = f.known()
            if a < lo:
                lo = a
            if b > hi:
                hi = b
        return lo, hi

    def report(self, key, epoch, t, v):
        """Apply a report (or probe reply) of value ``v`` stamped ``t`` under ``epoch``."""
        s = self.sources[key]
        if s.old and epoch == s.filt.epoch:
            s.old = []                      # the device has confirmed the newest assignment
        s.filt.recenter(v)
        for f in s.old:
            f.recenter(v)
        s.reports += 1
        s.last_t = t
        s.value = v

    def shrink(self, s_frac):
        for s in self.sources.values():
            s.filt.shrink(s_frac)
            for f in s.old:
                f.shrink(s_frac)

    def _keep_old(self, s):
        s.old.append(s.filt.copy())

    def set_width(self, key, width):
        """Assign a width under a new epoch; returns (epoch, narrowing)."""
        s = self.sources[key]
        narrowing = width < s.filt.width
        if narrowing:
            self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF
        s.filt.set_width(width, epoch)
        return epoch, narrowing

    def set_filter(self, key, width, cons, keep_old=True):
        """Install constraints and a width under a new epoch (confirmed by the device unless ``keep_old`` is off)."""
        s = self.sources[key]
        if keep_old:
            self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF
        s.filt.set_filter(width, cons, epoch)
        return epoch

    def set_bound(self, key, lo, hi):
        s = self.sources[key]
        self._keep_old(s)
        epoch = (s.filt.epoch + 1) & 0xFFFF
        s.filt.set_bound(lo, hi, epoch)
        return epoch
