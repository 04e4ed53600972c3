"""Per-source exit measurements of the default adaptive rule (Olston et al. 2003 App. E, estimated online).

Exits of a source at width W are modelled as Poisson in the exposure ∫ W^(−α) dt; ``Source`` keeps the
decayed exit count and exposures, the value lattice, and the exits forced at the next reading after a
report (the value jumped past the bound between two readings, where W^(−α) does not hold).
``shrinkage`` pools rates that differ by no more than noise (empirical Bayes).
"""
import math

from backend.coordinator.precision.rows import INF

ALPHAS = (2.0, 1.5, 1.0)        # candidate exponents of r ∝ W^−α; the first is the prior
QUANTUM_AFTER = 8               # value changes seen before a common quantum is trusted

def _fgcd(a, b, tol):
    """Greatest common quantum of two positive floats, up to ``tol`` (0 when there is none above it)."""
    while b > tol:
        a, b = b, math.fmod(a, b)
        if a - b <= tol:
            b = 0.0
    return a if a > tol else 0.0


class Source:
    """Decayed exit count, exposures per α and Σ log W of one source (exposure accrued up to ``t``),
    and the quantum of its values: readings on a lattice of step q only ever exit whole quanta away."""
    __slots__ = ("n", "n2", "e", "lw", "t", "w", "q", "changes", "last", "dmin", "dmax", "sat", "jumps", "fresh", "mt",
                 "led")

    def __init__(self, t, w):
        self.n, self.n2, self.lw, self.t, self.w = 0.0, 0.0, 0.0, t, w
        self.sat = 0.0                  # decayed count of exits at the next reading after a report
        self.jumps = []                 # the changes those exits reported (newest last, at most ``memory``)
        self.fresh, self.mt = 0, None   # exits since this rule last moved the width, and when it did
        self.led = False                # the bound in force is a lead's (not measured: ``accrue``)
        self.e = [0.0] * len(ALPHAS)
        self.q, self.changes, self.last, self.dmin, self.dmax = 0.0, 0, None, INF, 0.0

    def observe(self, v):
        """Refine the quantum from one reported value (0 once the values have no common step; a change out of
        a lead's bound is not counted, ``accrue``)."""
        if self.last is not None and v != self.last and not self.led and (self.changes == 0 or self.q > 0):
            d = abs(v - self.last)
            self.dmin, self.dmax = min(self.dmin, d), max(self.dmax, d)
            tol = 1e-9 * max(abs(v), abs(self.last), d)
            self.q = d if self.changes == 0 else _fgcd(max(self.q, d), min(self.q, d), tol)
            if self.q < 1e-4 * d:
                self.q = 0.0            # no step worth the name: continuous values
            self.changes += 1
        self.last = v

    def quantum(self):
        """The step, once seen in enough changes that are not all the same multiple of it (exits from a
        bound always lie the same whole number of steps away, so a lone multiple proves nothing)."""
        return self.q if self.changes >= QUANTUM_AFTER and self.dmax > self.dmin * (1 + 1e-6) else 0.0

    def eff(self, w):
        """The width that governs exits: on a lattice, the midpoint between the whole quanta it admits."""
        q = self.quantum()
        if q <= 0 or not w < INF:
            return w
        return 2.0 * q * (math.floor(w / (2.0 * q) + 1e-6) + 0.5)

    def exited(self, v, w, forced, decay, memory):
        """Count one exit at width ``w`` (value ``v`` or None); ``forced``: at the reading right after the
        previous report."""
        self.n = self.n * decay + 1.0
        self.n2 = self.n2 * decay * decay + 1.0
        self.fresh += 1
        self.sat = self.sat * decay + (1.0 if forced else 0.0)
        if forced and self.last is not None and v is not None:
            self.jumps = self.jumps[1 - memory:] + [abs(v - self.last)]
        self.lw = self.lw * decay + (math.log(w) if 0 < w < INF else 0.0)
        self.e = [e * decay for e in self.e]

    def saving(self, weight, alpha, e, e1, half):
        """Reports per unit time saved by moving from effective width e to e1 (negative: a narrowing costs);
        ``half``: half the new width when it is wider. Forced exits are saved only as far as their recorded
        jumps fit within ``half``; the others follow the model."""
        if e1 <= 0:
            return -INF
        if not 0 < e < INF:
            return 0.0
        forced = self.sat / self.n if self.n > 0 else 0.0
        kept = 1.0
        if half and self.jumps:
            kept = sum(1 for j in self.jumps if j > half) / len(self.jumps)
        return weight * e ** -alpha * ((1.0 - forced) * (1.0 - (e / e1) ** alpha) + forced * (1.0 - kept))

    def accrue(self, t):
        """Exposure up to ``t``. None while a lead's bound is in force (edge.core.predict): its edges lie W/16
        and 15W/16 from the report, so its exits follow neither the centred rate model, nor the forced
        exits' half-width, nor the lattice's centred cells; its exits are not counted either (``led``)."""
        w = self.eff(self.w)
        if self.t > -INF and t > self.t and 0 < w < INF and not self.led:
            dt = t - self.t
            for a, alpha in enumerate(ALPHAS):
                self.e[a] += dt * w ** -alpha
        self.t = t


def shrinkage(sts, a, mean):
    """Empirical-Bayes prior (pseudo-reports at the mean rate) for the sources ``sts`` under exponent ``a``:
    the shape k of a gamma prior on the rates, mean²/τ², with τ² the spread of the measured rates
    n/e beyond their sampling noise (method of moments). Exits are taken as Poisson in the exposure,
    the decayed count n carrying n²/Σw² reports' worth of evidence. Rates that differ no more than noise
    would make them give k = ∞: every source at the mean, so noise moves no width."""
    spread = noise = 0.0
    for st in sts:
        e = st.e[a]
        if e > 0:
            spread += (st.n / e - mean) ** 2
            noise += mean * (st.n2 / st.n if st.n > 0 else 1.0) / e
    tau2 = (spread - noise) / max(1, len(sts))
    return mean * mean / tau2 if tau2 > 0 else INF
