"""Interruption model (Zhu & Ravishankar 2004 §4.5-§4.6): per-source DBM estimators widen offline sources.

``Models`` is the coordinator's per-source model store: every value it learns (reports, probe
replies, births) feeds an ``edge.core.brownian.Estimator``; while a source is offline it widens that
source's known interval to ``[lo, hi] + μτ ± z σ sqrt(τ)`` (§4.5), which the coordinator applies to
every protocol's answers (marked degraded, with the reason).
"""
import math

from edge.core import brownian as bm

DEFAULT_CONFIDENCE = 0.95
_Z = {}


def z_two(p):
    z = _Z.get(p)
    if z is None:
        z = _Z[p] = bm.z_two(p)
    return z


def confidence(q, default=DEFAULT_CONFIDENCE):
    return q.extra.get("confidence", default)


class Models:
    """Per-source DBM estimators (§4.6) and the interruption model (§4.5)."""

    def __init__(self, k=100, min_obs=10):
        if not isinstance(k, int) or k < 3 or not isinstance(min_obs, int) or min_obs < 3:
            raise ValueError("models need integers k >= 3 and min_obs >= 3")
        self.k = k
        self.min_obs = min_obs
        self.est = {}
        self.off_since = {}        # key -> event time the source went offline

    def observe(self, key, t, v):
        e = self.est.get(key)
        if e is None:
            e = self.est[key] = bm.Estimator(self.k)
        e.add(t, v)

    def params(self, key):
        """(μ, σ²) of ``key`` once ``min_obs`` values were seen, else None."""
        e = self.est.get(key)
        if e is None or len(e) < self.min_obs:
            return None
        return e.estimate()

    def predict(self, key, tau):
        """(μτ, variance) of an offline source's change over τ seconds, or None without a model.

        The variance is σ²τ plus the uncertainty of the drift estimate, Var(μ̂)τ² = σ²τ²/span (Eq. 15
        over the buffer's time span), which dominates long interruptions."""
        est = self.params(key)
        if est is None:
            return None
        e = self.est[key]
        span = e.ts[-1] - e.ts[0]
        return est[0] * tau, est[1] * tau * (1.0 + tau / span)

    def last(self, key):
        e = self.est.get(key)
        return None if e is None else e.last()

    def set_online(self, key, online, t):
        if online:
            self.off_since.pop(key, None)
        elif key not in self.off_since:
            self.off_since[key] = t

    def widened(self, coord, q, known):
        """``known`` with each offline source of ``q`` moved by μτ and widened by z σ sqrt(τ).

        τ runs from the time the source went offline to the next adjustment tick (the answer must
        hold until it is refreshed); each of the m offline sources gets confidence 1 - (1 - p)/m so
        the whole answer holds with probability >= p (union bound), for any monotone aggregate."""
        off = [s for s in q.sources if s in self.off_since]
        p = 1.0 - (1.0 - confidence(q)) / max(1, len(off))
        until = coord.clock + coord.period

        def fn(key):
            lo, hi = known(key)
            since = self.off_since.get(key)
            pred = None if since is None else self.predict(key, max(0.0, until - since))
            if pred is None:
                return lo, hi
            half = z_two(p) * math.sqrt(pred[1])
            return lo + pred[0] - half, hi + pred[0] + half
        return fn

    def reason(self, q):
        off = [s for s in q.sources if s in self.off_since]
        bare = [s for s in off if self.params(s) is None]
        text = "offline: %s" % ", ".join(off[:8]) + (" (+%d)" % (len(off) - 8) if len(off) > 8 else "")
        if bare:
            return text + "; no model yet for %s: last bound kept, not guaranteed" % ", ".join(bare[:8])
        return text + "; widened by the Brownian interruption model (Zhu §4.5) at confidence %g" % confidence(q)
