"""Device clock offsets, estimated robustly per device (DESIGN.md §3 event time, §4 precision under skew;
the bounds of NTP's on-wire offset estimate, RFC 5905 §8, from one-way timings).

A device's clock leads true (backend) time by an unknown ``lead``. Every uplink stamped ``t`` and heard at
``now`` shows ``lead >= t - now`` (it was sent before it arrived): a lower bound. A message the device can
only have sent after it received a downlink sent at ``s`` (a probe's reply, a report carrying the epoch
that downlink assigned) shows ``lead <= t - s``: an upper bound. The estimate is the tightest of the
recent bounds (the last ``LOWS`` and ``HIGHS``), each loosened by ``DRIFT`` per second of its age, so a
clock that drifts is followed and no single message moves the estimate for good; the setting σ is the
prior, ``[-σ, σ]``, that holds while no bound says more. Offsets of tens of ms are normal: they are
covered, never an alarm. A stamp leading by more than the upper bound (``plausible`` is false; the
uplink admission of ``integrity`` and anyone else may ask) is dropped for that message alone; several
in a row mean the clock was stepped: the estimate starts afresh from them (``reset``).

A clock that counts whole ticks (a board's integer ms: ``ticks``) reads ``t`` for a whole tick, so the lead a
stamp shows wobbles by up to a tick between messages: an echo's upper bound holds for another stamp only a tick
looser, and a lower bound a tick looser too. ``bounds`` (the lead of the stamps, what event times and hulls use)
states both when σ > 0 (σ = 0 takes every clock as exact, as the simulator's are); without it a report stamped
in a tick's first fraction was placed up to a tick after it happened (issue #30: a live MAX final answer missed
the truth for 0.12 ms).
"""
import math

LOWS = 16           # recent lower bounds kept per device (one per uplink)
HIGHS = 4           # recent upper bounds kept per device (one per echo)
DRIFT = 2e-5        # s/s a crystal may drift: an old bound loosens by this per second of its age
RESOLUTION = 0.001  # a board's stamps are whole ms: a lead this small beyond a bound is rounding
JUMPED = 3          # implausible stamps in a row that show a stepped clock


class Offsets:
    def __init__(self, sigma):
        self.sigma = sigma          # the prior: clocks within ±σ of ours until their bounds say more
        self.lows = {}              # device -> [(at, t - now)], newest last
        self.highs = {}             # device -> [(at, t - sent)], newest last
        self.odd = {}               # device -> implausible stamps in a row
        self.ticks = {}             # device -> its clock's resolution (s) when it counts whole ticks
        self.stats = {"implausible": 0, "resets": 0, "echoes": 0}
        self.last = None            # (device, now, (lo, hi)): ``measured``'s last answer, until a bound changes

    def heard(self, device, t, now):
        """An uplink stamped ``t`` (device seconds) heard at ``now``: its lower bound. False when the stamp
        is implausible (dropped for this message; counted), True otherwise."""
        if not self.plausible(device, t, now):
            self.stats["implausible"] += 1
            n = self.odd[device] = self.odd.get(device, 0) + 1
            if n < JUMPED:
                return False
            self.reset(device)      # stepped: from the stamps that keep coming
        self.odd.pop(device, None)
        self.last = None
        _keep(self.lows.setdefault(device, []), (now, t - now), LOWS)
        return True

    def echoed(self, device, t, sent):
        """A message stamped ``t`` that the device sent after receiving a downlink sent at ``sent``."""
        self.stats["echoes"] += 1
        self.last = None
        _keep(self.highs.setdefault(device, []), (sent, t - sent), HIGHS)

    def reset(self, device):
        """Forget ``device``'s bounds: its clock was stepped (an upper bound from before may be wrong)."""
        self.stats["resets"] += 1
        self.last = None
        self.lows.pop(device, None)
        self.highs.pop(device, None)

    def measured(self, device, now):
        """The tightest recent bounds (lo, hi) of ``device``'s lead at ``now`` (-inf, inf: none). Computed
        once per device and instant: an uplink asks it some six times (admission, event times, hulls)."""
        last = self.last
        if last is not None and last[0] == device and last[1] == now:
            return last[2]
        lo = max([b - DRIFT * (now - at) for at, b in self.lows.get(device, ())] or [-math.inf])
        hi = min([b + DRIFT * (now - at) for at, b in self.highs.get(device, ())] or [math.inf])
        self.last = (device, now, (lo, hi))
        return lo, hi

    def bounds(self, device, now):
        """(lo, hi): the lead of every stamp of ``device`` lies in [lo, hi] (s): its clock's, a tick looser
        either way for a clock of whole ticks."""
        lo, hi = self._lead(device, now)
        tick = self.ticks.get(device, 0.0) if self.sigma > 0 else 0.0      # (σ = 0: clocks taken as exact)
        return lo - tick, hi + tick

    def _lead(self, device, now):
        """(lo, hi): the lead of ``device``'s clock lies in [lo, hi] (s). The prior [-σ, σ] where the bounds
        say no more; where they contradict it, the bounds; hi = lo + 2σ when nothing bounds it above and
        it leads by more than σ (``uncertain`` says so)."""
        lo, hi = self.measured(device, now)
        s = self.sigma
        a, b = max(lo, -s), min(hi, s)
        if a <= b:
            return a, b
        if lo <= hi < math.inf:
            return lo, hi
        if hi < lo:         # contradictory: the clock was stepped since; trust the newer kind
            newest = max(self.lows[device][-1][0], self.highs[device][-1][0])
            self.last = None
            if newest == self.lows[device][-1][0]:
                self.highs.pop(device, None)
                return lo, lo + 2 * s
            self.lows.pop(device, None)
            return min(hi, max(-s, hi - 2 * s)), hi
        return lo, lo + 2 * s

    def uncertain(self, device, now):
        """Whether ``device``'s lead is known less well than the prior's 2σ (a clock off by more than σ
        with no upper bound yet): its reports may be placed too early, so its answers are degraded."""
        lo, hi = self.measured(device, now)
        return max(lo, -self.sigma) > min(hi, self.sigma) and hi == math.inf

    def plausible(self, device, t, now):
        """Whether an uplink stamped ``t`` heard at ``now`` fits ``device``'s clock: it does not lead by
        more than the upper bound of its lead (by σ + 1 ms with no bound)."""
        lo, hi = self.measured(device, now)
        return t - now <= min(hi, max(self.sigma, lo + 2 * self.sigma)) + RESOLUTION


def _keep(ring, item, n):
    ring.append(item)
    if len(ring) > n:
        del ring[0]
