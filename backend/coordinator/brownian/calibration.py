"""Online calibration of the deferral to the measured fidelity (Zhu & Ravishankar 2004 §6.1 fidelity, Eq. 7).

Eq. 7 defers a refresh while the DBM model says P(|A(t+Δt) - A(t)| <= ε) >= p. Real streams are not
DBM paths (daily cycles, seasons, sampled steps), so each completed refresh is checked the way §6.1
measures fidelity: did the answer it replaces still hold at that instant, |A(t_k+1) - A(t_k)| <= its
half-width? ``Calibration`` tracks the miss rate by adaptive quantile tracking (Gibbs & Candès 2021,
adaptive conformal inference): log D += rate·(miss - (1 - p)), D >= 1 (never bolder than the model).
The model then runs D times faster: μ·D and σ²·D, so Eq. 7's Δt shrinks and the answer widened
for one tick grows. Whatever the stream, while D stays below its cap the share of missed checks after
n of them is at most 1 - p + log(D)/(rate·n) (the updates telescope; the floor at 1 only adds).
Deterministic: integer counts and one float updated in check order.
"""
import math

RATE = 0.5              # log D step per unit of (miss - (1 - p)): a miss at p = 0.95 multiplies D by e^0.475
MAX_LOG = math.log(1e9)


class Calibration:
    __slots__ = ("log_d", "checks", "misses")

    def __init__(self):
        self.log_d = 0.0
        self.checks = 0
        self.misses = 0

    def check(self, miss, p):
        """One refresh's outcome at confidence ``p``: ``miss`` if the answer it replaced no longer held."""
        self.checks += 1
        self.misses += 1 if miss else 0
        self.log_d = min(MAX_LOG, max(0.0, self.log_d + RATE * ((1.0 if miss else 0.0) - (1.0 - p))))

    @property
    def dilation(self):
        """D >= 1: how many times faster than the fitted model the stream has been moving."""
        return math.exp(self.log_d)
