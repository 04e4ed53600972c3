"""Sampled sources hold each reading until their next sample: no change is due before then (Zhu & Ravishankar 2004 §4.4, Eq. 7's Δt on sampled streams).

Eq. 7 models a source as a continuous DBM path, but a device reports its latest sample, which stays
put until the next one: probed every day, a monthly series changes once in thirty probes, and Eq. 7
(which cannot know when) keeps probing. ``Holds`` learns from probe replies when each source's value
changed: the k-th change happened in (lo_k, hi_k] (the probes before and at it), so consecutive changes
were between L = lo_k+1 - hi_k and U = hi_k+1 - lo_k apart. ``top``, the smallest U of any pair, bounds
the shortest gap from above. The source's ``hold`` H (its sampling interval, learnt) is the largest L of
the pairs that pin their gap within a factor 2 (U < 2L) and could be its shortest gap (L <= top: a sample
that repeats its value makes a gap of two intervals, which must not count), and falls to L whenever a pair
shows a gap shorter than it (U < H). A sample may repeat its value (no change seen), so after the last change in
(lo, hi] the source's samples fall in the windows (lo + m·H, hi + m·top], m = 1, 2, ...: probed
through t without a change since hi, its next change is not due before lo + m·H, the first window
start after t, unless t lies inside a window (a sample may be about to come: due now). The more
repeats, the wider the windows, until they overlap and nothing is claimed. A source probed about as
often as it changes pins no gap and keeps no hold: nothing changes for it.

Each claim is checked: a probe made by the time a claim said the source would not yet have changed
hits if its value did not change and misses if it did (the hold was too long, or the sampling moved).
Each source's own ``Calibration`` tracks those misses at confidence ``p`` and shrinks its claims by its
dilation D (a claim from the last probe t runs to t + (due - t) / D), so the share of wrong claims is
what calibration measures, not what the learnt hold says.
"""
import math

from backend.coordinator.brownian.calibration import Calibration
from backend.coordinator.brownian.interruption import DEFAULT_CONFIDENCE


class Holds:
    def __init__(self, p=DEFAULT_CONFIDENCE, calibrate=True):
        self.p = p
        self.calibrate = calibrate      # False: every claim trusted as learnt
        self.state = {}        # key -> [last value, its probe time, lo, hi of the last change, hold H, top, Calibration]

    def observe(self, key, t, v):
        """A probe reply: ``key`` read ``v`` at ``t``."""
        s = self.state.get(key)
        if s is None:
            self.state[key] = [v, t, None, None, math.inf, math.inf, Calibration()]
            return
        if not (t > s[1]):
            return
        claim = self._claim(s)
        if self.calibrate and s[1] < claim and t <= claim:
            s[6].check(v != s[0], self.p)
        if v != s[0]:
            if s[3] is not None:
                low, high = s[1] - s[3], t - s[2]
                s[5] = min(s[5], high)
                if high < s[4] < math.inf:
                    s[4] = max(0.0, low)
                elif high < 2 * low and low <= s[5]:
                    s[4] = low if s[4] == math.inf else max(s[4], low)
            s[2], s[3] = s[1], t
        s[0], s[1] = v, t

    @staticmethod
    def _claim(s):
        """The learnt claim of state ``s``: its next change not before this time (its last probe time or
        -inf when it claims nothing)."""
        if s[2] is None or not (0 < s[4] < math.inf):
            return -math.inf
        seen, lo, hi, hold, top = s[1], s[2], s[3], s[4], s[5]
        m = math.floor((seen - lo) / hold) + 1
        if m >= 2 and seen < hi + (m - 1) * top:
            return seen                 # inside a window: a sample may come any time now
        return lo + m * hold

    def due(self, keys):
        """The earliest time any of ``keys`` may change next, as far as its calibration trusts its claim
        (-inf when one has no hold learnt)."""
        out = math.inf
        for key in keys:
            s = self.state.get(key)
            claim = -math.inf if s is None else self._claim(s)
            if claim == -math.inf:
                return claim
            out = min(out, s[1] + (claim - s[1]) / s[6].dilation if claim > s[1] else claim)
        return out
