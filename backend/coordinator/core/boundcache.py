"""Bound cache (Olston et al. 2003 §1.2.3, §4): the backend's mirror of every source filter, by epoch.

Each source is mirrored by the same ``IntervalFilter`` the device runs. A change that widens the
device's filter is applied at once (the device stays narrower until it hears of it, which is safe).
A change that may narrow it keeps the previous mirror alive as well until an uplink carrying the new
epoch confirms that the device applied it; meanwhile ``known`` is the hull of both. Only the exact
current epoch confirms: an epoch the backend has not assigned yet is stale, not a confirmation.
A report whose true time is uncertain (a device clock within ±σ, ``integrity``) keeps the mirrors from
before it in ``prior`` until the latest instant it can have happened (``hold``/``release``).
The mirror of a float32 device (birth capability CAP_F32) computes in float32 as the device does
and pads what it states by one float32 step (edge.core.interval).
"""
import math

from edge.core.float32 import f32
from edge.core.interval import IntervalFilter


class Source:
    __slots__ = ("key", "device", "index", "filt", "old", "prior", "online", "reports", "last_t", "value")

    def __init__(self, key, device, index, width, epoch, single=False):
        self.key = key
        self.device = device
        self.index = index
        self.filt = IntervalFilter(width, (), epoch, f32 if single else None, single)
        self.old = []          # mirrors of states the device may still be in
        self.prior = []        # (until, mirror): states the device may have been in until then
        self.online = True
        self.reports = 0       # reports received in the current adjustment period
        self.last_t = None     # event time of the last report
        self.value = None      # last reported value


class BoundCache:
    def __init__(self):
        self.sources = {}

    def add(self, key, device, index, width, epoch, value=None, single=False):
        """Mirror a new source; ``single``: the device computes in float32."""
        s = Source(key, device, index, width, epoch, single)
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
        for f in s.old + [f for _, f in s.prior] if s.prior else s.old:
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
            for _, f in s.prior:
                f.shrink(s_frac)

    def hold(self, key, until):
        """Before a report that may have happened as late as ``until``: keep the current mirrors."""
        s = self.sources[key]
        s.prior += [(until, f.copy()) for f in [s.filt] + s.old]

    def release(self, key, now):
        """Drop the held mirrors whose time is over by ``now``."""
        s = self.sources[key]
        s.prior = [(u, f) for u, f in s.prior if u > now]

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
