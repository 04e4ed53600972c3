"""Interruption model (Zhu & Ravishankar 2004 §4.5-§4.6): per-source DBM estimators widen offline sources.

``Models`` is the coordinator's per-source model store: every value it learns (reports, probe
replies, births) feeds an ``edge.core.brownian.Estimator``; while a source is offline it widens that
source's known interval to ``[lo, hi] + μτ ± z σ sqrt(τ)`` (§4.5), which the coordinator applies to
every protocol's answers (marked degraded, with the reason).
"""
import math

from edge.core import brownian as bm
from backend.coordinator.core.aggregate import add_exact, weighted

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
            raise ValueError("k and min_obs (the DBM window and its fewest observations) must be integers >= 3, "
                             "got k=%r, min_obs=%r" % (k, min_obs))
        self.k = k
        self.min_obs = min_obs
        self.est = {}
        self.off_since = {}        # key -> event time the source went offline
        self.gone = 0              # how many times a source went offline (a widening built before is stale)
        self.back = []             # sources back online since the last tick, in order
        self.wide = {}             # query id -> its Widening for this tick

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
            if self.off_since.pop(key, None) is not None:
                self.back.append(key)
        elif key not in self.off_since:
            self.off_since[key] = t
            self.gone += 1

    def new_tick(self):
        """A new adjustment period: every query's widening is computed afresh when next asked for."""
        self.back.clear()
        self.wide.clear()

    def widening(self, coord, q):
        """``q``'s ``Widening`` until the next adjustment tick: built once per tick (and again when a source
        goes offline), then updated per source coming back, so an answer costs O(sources back), not O(n)."""
        w = self.wide.get(q.id)
        if w is None or w.q is not q or w.gone != self.gone:
            w = self.wide[q.id] = Widening(self, coord, q)
        for key in self.back[w.seen:]:
            w.back(key)
        w.seen = len(self.back)
        return w

    def reason(self, q, coord):
        w = self.widening(coord, q)
        off = w.names(8)
        text = "offline: %s" % ", ".join(off) + (" (+%d)" % (w.m - len(off)) if w.m > len(off) else "")
        bare = [s for s in off if s in w.bare]
        if bare:
            return text + "; no model yet for %s: last bound kept, not guaranteed" % ", ".join(bare)
        return text + "; widened by the Brownian interruption model (Zhu §4.5) at confidence %g" % confidence(q)


class Widening:
    """The offline sources of a query and how far each moves until the next tick (§4.5).

    τ runs from the time a source went offline to the next adjustment tick (the answer is refreshed
    there); each of the m offline sources gets confidence 1 - (1 - p)/m so the whole answer holds with
    probability >= p (union bound), for any monotone aggregate. m is counted when the widening is built
    (at a tick, or when a source goes offline): sources coming back before the next tick leave the
    others' widths as they were, wider than needed, never narrower. For SUM/AVG the weighted shifts are
    kept as exact sums (``lo``, ``hi``) that the running aggregate adds to its own. A source is still
    offline while it has a shift or is ``bare`` (no model yet)."""

    def __init__(self, models, coord, q):
        self.q, self.gone, self.seen = q, models.gone, len(models.back)
        off_since = models.off_since
        self.off, self.first = list(q.among(off_since)), 0
        z = z_two(1.0 - (1.0 - confidence(q)) / max(1, len(self.off)))
        until = coord.tick_time(coord.tick)
        self.shift, self.bare, self.lo, self.hi, self.scale = {}, set(), [], [], 0.0
        for key in self.off:
            pred = models.predict(key, max(0.0, until - off_since[key]))
            if pred is None:
                self.bare.add(key)
                continue
            half = z * math.sqrt(pred[1])
            a, b = pred[0] - half, pred[0] + half
            self.shift[key] = (a, b)
            dlo, dhi = weighted(q.weights[key], a, b)
            add_exact(self.lo, dlo)
            add_exact(self.hi, dhi)
            self.scale += abs(dlo) + abs(dhi)

    @property
    def m(self):
        """How many of its sources are still offline."""
        return len(self.shift) + len(self.bare)

    def _offline(self, key):
        return key in self.shift or key in self.bare

    def back(self, key):
        """Source ``key`` is online again: its shift leaves the sums."""
        self.bare.discard(key)
        ab = self.shift.pop(key, None)
        if ab is not None:
            dlo, dhi = weighted(self.q.weights[key], *ab)
            add_exact(self.lo, -dlo)
            add_exact(self.hi, -dhi)

    def widened(self, known):
        """``known`` with each offline source moved and widened."""
        shift = self.shift

        def fn(key):
            lo, hi = known(key)
            ab = shift.get(key)
            return (lo, hi) if ab is None else (lo + ab[0], hi + ab[1])
        return fn

    def names(self, most):
        """The first ``most`` sources still offline."""
        while self.first < len(self.off) and not self._offline(self.off[self.first]):
            self.first += 1
        out = []
        for key in self.off[self.first:]:
            if len(out) == most:
                break
            if self._offline(key):
                out.append(key)
        return out
