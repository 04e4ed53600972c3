"""Drifted Brownian motion model of a stream (Zhu & Ravishankar 2004 §4.2, §4.3, §4.6).

Portable (MicroPython and CPython): ``Estimator`` keeps the k latest (time, value) items of a stream
and gives the ML drift (Eq. 15) and the unbiased diffusion (Eq. 16) for irregular sampling
intervals; ``defer`` solves Eq. 7 for the longest deferral Δt with P(|ΔA| <= ε) >= p;
``phi1``/``phi2`` are the two limits of Theorem 1 for windowed max; ``z_two`` is the two-sided
Normal quantile used for the interruption bound of §4.5 (``S(t_i) + μ(t - t_i) ± z σ sqrt(t - t_i)``).
"""
import math

INF = float("inf")
_SQRT2 = math.sqrt(2.0)
_ITER = 64           # bisection steps: 2^-64 of the bracket


def within(eps, mu, s2, dt):
    """P(|X| <= eps) for X ~ N(mu·dt, s2·dt): Eq. 7's left-hand side F(t, dt)."""
    if dt <= 0:
        return 1.0
    if s2 <= 0:
        return 1.0 if abs(mu * dt) <= eps else 0.0
    s = math.sqrt(2.0 * s2 * dt)
    m = mu * dt
    return 0.5 * (math.erf((eps - m) / s) + math.erf((eps + m) / s))


def below(c, mu, s2, dt):
    """P(X <= c) for X ~ N(mu·dt, s2·dt) (φ2 of Theorem 1)."""
    if dt <= 0:
        return 1.0 if c >= 0 else 0.0
    if s2 <= 0:
        return 1.0 if mu * dt <= c else 0.0
    return 0.5 * (1.0 + math.erf((c - mu * dt) / math.sqrt(2.0 * s2 * dt)))


def _first_below(fn, p, hi):
    """Smallest t in (0, hi] with fn(t) <= p for a non-increasing fn on (0, hi], else hi."""
    if fn(hi) > p:
        return hi
    lo = 0.0
    for _ in range(_ITER):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if fn(mid) > p:
            lo = mid
        else:
            hi = mid
    return hi


def _check(eps, p, tmax):
    if not (eps >= 0) or not (0 < p < 1) or not (tmax > 0):
        raise ValueError("need eps >= 0, 0 < p < 1, tmax > 0")


def defer(eps, p, mu, s2, tmax):
    """Eq. 7: the deferral Δt at which P(|A(t+Δt) - A(t)| <= eps) falls to p, at most ``tmax``."""
    _check(eps, p, tmax)
    if s2 <= 0:
        if mu == 0:
            return tmax
        return min(tmax, eps / abs(mu))
    return _first_below(lambda dt: within(eps, mu, s2, dt), p, tmax)


def phi2(c, p, mu, s2, tmax):
    """Theorem 1 φ2: first τ with P(A(t_k+τ) - A(t_k) <= c) <= p, c = A_m + ε - A(t_k); at most tmax."""
    _check(max(c, 0.0), p, tmax)
    if c < 0:
        return 0.0
    if s2 <= 0:
        return tmax if mu <= 0 else min(tmax, c / mu)
    hi = tmax
    if mu < 0:
        hi = min(tmax, c / -mu)       # beyond its minimum at c/|μ| the probability rises again
        if hi <= 0:
            return tmax
        if below(c, mu, s2, hi) > p:
            return tmax
    return _first_below(lambda dt: below(c, mu, s2, dt), p, hi)


def phi1(items, tk, w, am, eps):
    """Theorem 1 φ1 over the window items [(t, v), ...] of [tk - w, tk] in time order.

    Values hold until the next item (step function). φ1 is how far the window may slide before
    everything left in it is <= am - eps: the next item time after the last item above am - eps,
    relative to the trailing edge tk - w; ``w`` when the newest item is still above."""
    last = None
    for j in range(len(items) - 1, -1, -1):
        if items[j][1] > am - eps:
            last = j
            break
    if last is None:
        return 0.0
    if last == len(items) - 1:
        return w
    return max(0.0, min(w, items[last + 1][0] - (tk - w)))


def z_two(p):
    """The two-sided Normal quantile z with P(|Z| <= z) = p (erf inverse by bisection)."""
    if not (0 < p < 1):
        raise ValueError("need 0 < p < 1")
    lo, hi = 0.0, 40.0
    for _ in range(_ITER):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if math.erf(mid / _SQRT2) < p:
            lo = mid
        else:
            hi = mid
    return hi


class Estimator:
    """The k latest items of one stream and its DBM parameters (Eq. 15, 16), O(1) per item.

    ``add(t, v)`` ignores items that do not advance time. ``estimate()`` returns (μ, σ²) once three
    items are buffered (Eq. 16 divides by k - 2), else None."""

    def __init__(self, k=100):
        if not isinstance(k, int) or k < 3:
            raise ValueError("the buffer needs k >= 3 items")
        self.k = k
        self.ts = []
        self.vs = []
        self.qs = []         # y_j^2 / δ_j of the increment ending at each item (0 for the oldest)
        self.q = 0.0         # Σ y_j^2 / δ_j over the buffered increments
        self.n = 0           # items added since the last exact re-sum

    def add(self, t, v):
        ts = self.ts
        if ts and not (t > ts[-1]):
            return False
        if v != v or v == INF or v == -INF:
            return False
        term = 0.0
        if ts:
            y = v - self.vs[-1]
            term = y * y / (t - ts[-1])
        ts.append(t)
        self.vs.append(v)
        self.qs.append(term)
        self.q += term
        if len(ts) > self.k:
            ts.pop(0)
            self.vs.pop(0)
            self.q -= self.qs[1]
            self.qs.pop(0)
            self.qs[0] = 0.0
        self.n += 1
        if self.n >= self.k:
            self.n = 0
            self.q = math.fsum(self.qs) if hasattr(math, "fsum") else sum(self.qs)
        return True

    def __len__(self):
        return len(self.ts)

    def last(self):
        """(t, v) of the newest item, or None."""
        if not self.ts:
            return None
        return self.ts[-1], self.vs[-1]

    def estimate(self):
        """(μ̂, σ̂²) by Eq. 15 and 16, or None with fewer than 3 items."""
        k = len(self.ts)
        if k < 3:
            return None
        span = self.ts[-1] - self.ts[0]
        rise = self.vs[-1] - self.vs[0]
        mu = rise / span
        # Σ (y - δμ)²/δ = Σ y²/δ - 2μ Σ y + μ² Σ δ = Q - rise²/span
        s2 = (self.q - rise * mu) / (k - 2)
        if s2 < 0:
            s2 = 0.0
        return mu, s2
