"""Event times from device clocks (DESIGN.md §3 event time, §4 precision under skew): a mixin of ``Integrity``.

What ``offsets`` bounds a device's clock lead by, read as the event time of a stamp, the end of a report's
uncertain window, whether a device's clock is known well enough, and whether its sources may be answered from at
an event time (not suspect, its latest birth surely happened by then).
"""
import math


class Clocks:
    @property
    def sigma(self):
        """The clock offset σ covered (the prior of ``offsets``)."""
        return self.offsets.sigma

    def event(self, device, t):
        """The earliest true time of something ``device`` stamped ``t`` (its event time)."""
        return t - self.offsets.bounds(device, self.now)[1]

    def cover(self, device, t):
        """Until when (event time) the bound from before a report stamped ``t`` stays in the hull."""
        return t - self.offsets.bounds(device, self.now)[0]

    def clocked(self, device, now):
        """Whether ``device``'s clock is known as well as the prior's ±σ (else its answers are degraded)."""
        return not self.offsets.uncertain(device, now)

    def trusted(self, device, clock):
        """Whether ``device``'s sources may be answered from (not suspect, not settling)."""
        return device not in self.suspect and clock >= self.settle.get(device, -math.inf)
