"""Fraction-based tolerance (Cheng et al. 2005 §5): ZT-NRP / FT-NRP for range queries, ZT-RP / FT-RP for k-NN.

FT-NRP (§5.1, Figure 7): of the |A| streams inside [l, u], E_max+ = ⌊|A|ε+⌋ get the false-positive
filter (−∞, ∞) and stay in the answer silently; of the streams outside, E_max− =
⌊|A|ε−(1−ε+)/(1−ε−)⌋ get the false-negative filter (∞, ∞) and stay out silently; the rest carry
[l, u]. Maintenance keeps ``count`` (insertions not yet offset by removals); a removal at count 0 runs
Fix Error, which probes one FP stream and, unless it is still inside, one FN stream, and gives them
[l, u]. Which streams get FP/FN filters (and which one Fix Error probes) is ``choice``: "boundary"
(nearest the range boundary) or "random". When no FP/FN filter is left, initialisation runs again
(it needs no probes: every membership is then exact). Fix Error runs exactly when the worst case over
the silent streams, |P| > ε+|A| or |N| > ε−(|A| − |P| + |N|) (P, N the FP and FN streams), breaks the
tolerance: after any update (a safety net for the special cases the paper leaves to its technical
report) and, for a removal at count 0, only then rather than always. Figure 7's count rule assumes
n+, n− still equal E_max+(t_c), E_max−(t_c); once Fix Error has used some of them up the bound usually
still holds, and an unconditional Fix Error would spend 3-6 messages to give away a filter for nothing.
ZT-NRP is the same protocol with zero tolerance: every stream carries [l, u].

FT-RP (§5.2) views a k-NN query as the range R that encloses the k nearest values (R halfway between
the k-th and (k+1)-st) and runs FT-NRP on R with ⌊kρ+⌋ FP and ⌊kρ−⌋ FN filters, where
ρ− = −ρ+/(1−ε+) + min((1−ε−)ε+, ε−) (Eq. 16; ``split`` sets ρ+ = split·(1−ε+)·min(...)).
R is recomputed (probes, then R sent to every stream) when the answer no longer provably meets the
tolerance. The paper's test is k(1−ε−) ≤ |A| ≤ k/(1−ε+) (Eqs. 7, 9); its FP bound omits the
surplus |A| − k, so we use the exact worst case over the silent streams instead:
|P| ≤ ε+|A|, |A|(1−ε+) ≤ k − |N|, |N| ≤ ε−k and |A| ≥ k(1−ε−) + |P|, which reduces to the paper's
test when P and N are empty. ZT-RP is FT-RP with zero tolerance: any crossing of R recomputes it.
"""
import math

from backend.coordinator.tolerance.entity import (EntityProtocol, QueryState, FP_FILTER, FN_FILTER, keyfn, region,
                                        inside, tolerances)

_EPS = 1e-9


class _RangeState(QueryState):
    """FT-NRP on the interval ``self.c`` with tolerances ``self.ep``, ``self.en``."""

    def __init__(self, proto, q):
        super().__init__(proto, q)
        self.P = set()       # false-positive filters: silent, in A
        self.N = set()       # false-negative filters: silent, not in A
        self.count = 0
        if q.kind == "range":
            self.c = q.range
            self.ep, self.en = (0.0, 0.0) if proto.zero else tolerances(q)

    # -- initialisation -------------------------------------------------------------
    def init(self, coord):
        self.ready = True
        self.A = {k for k in self.keys if inside(self.c, self.value(coord, k))}
        self.setup(coord)

    def quota(self):
        a = len(self.A)
        return (int(math.floor(a * self.ep + _EPS)),
                int(math.floor(a * self.en * (1 - self.ep) / (1 - self.en) + _EPS)))

    def near(self, coord, key):
        """Distance of a stream's last known value to the boundary of ``self.c``."""
        v = self.value(coord, key)
        l, u = self.c
        return min(v - l, u - v) if l <= v <= u else max(l - v, v - u)

    def setup(self, coord):
        """Initialisation phase (Figure 7 steps 4-5) over the current, exact memberships."""
        n_fp, n_fn = self.quota()
        near = lambda k: self.near(coord, k)
        self.P = set(self.proto.pick(self.A, n_fp, near))
        self.N = set(self.proto.pick([k for k in self.keys if k not in self.A], n_fn, near)) if n_fn else set()
        for k in self.keys:
            self.constrain(coord, k, FP_FILTER if k in self.P else FN_FILTER if k in self.N else self.c)
        self.count = 0

    # -- maintenance ----------------------------------------------------------------
    def update(self, coord, key):
        if key in self.P or key in self.N:
            return                      # silent by contract; a report raced with the install
        now = inside(self.c, self.value(coord, key))
        if now and key not in self.A:
            self.A.add(key)
            self.count += 1
        elif not now and key in self.A:
            self.A.discard(key)
            if self.count > 0:
                self.count -= 1
            elif self.exposed():
                self.fix_error(coord)
                return
        self.check(coord)

    def choose(self, coord, keys):
        return self.proto.pick(keys, 1, lambda k: self.near(coord, k))[0]

    def fix_error(self, coord):
        if self.P:
            y = self.choose(coord, self.P)
            self.probe(coord, [y], lambda c: self._fp_replied(c, y))
        else:
            self._fix_fn(coord)

    def _fp_replied(self, coord, y):
        self.P.discard(y)
        self.constrain(coord, y, self.c)
        if inside(self.c, self.value(coord, y)):
            self.check(coord)          # a true positive now: quit (Figure 7, Fix Error 1(II)(iii))
            return
        self.A.discard(y)
        self._fix_fn(coord)

    def _fix_fn(self, coord):
        if self.N:
            z = self.choose(coord, self.N)
            self.probe(coord, [z], lambda c: self._fn_replied(c, z))
        else:
            self.check(coord)

    def _fn_replied(self, coord, z):
        self.N.discard(z)
        if inside(self.c, self.value(coord, z)):
            self.A.add(z)
        self.constrain(coord, z, self.c)
        self.check(coord)

    def exposed(self):
        """Whether a removal at count 0 needs Fix Error: only if the worst case no longer meets the tolerance."""
        return not self.holds()

    def holds(self):
        """The worst case over the silent streams meets the tolerance (Eqs. 3, 4)."""
        a, p, n = len(self.A), len(self.P), len(self.N)
        return p <= self.ep * a + _EPS and n <= self.en * (a - p + n) + _EPS

    def check(self, coord):
        if not self.P and not self.N:
            if any(self.quota()):
                self.setup(coord)       # all memberships exact: run initialisation again
        elif not self.holds():
            self.fix_error(coord)


class _KnnState(_RangeState):
    """FT-RP: FT-NRP on the k-NN bound R, recomputed when the tolerance is no longer provable."""

    def __init__(self, proto, q):
        super().__init__(proto, q)
        self.k = q.extra["k"]
        self.score = keyfn(q.extra["point"])
        self.eps = (0.0, 0.0) if proto.zero else tolerances(q)
        ep, en = self.eps
        m = min((1 - en) * ep, en)
        rho_p = proto.split * (1 - ep) * m
        self.ep, self.en = rho_p, m - rho_p / (1 - ep)          # ρ+, ρ− (Eq. 16)
        self.c = None

    def init(self, coord):
        self.ready = True
        self.place(coord, self.keys)

    def quota(self):
        return (int(math.floor(self.k * self.ep + _EPS)), int(math.floor(self.k * self.en + _EPS)))

    def place(self, coord, exact):
        """Compute R from the exact values of ``exact`` (which hold the k+1 nearest) and deploy it."""
        scored = sorted((self.score(self.value(coord, key)), key) for key in exact)
        d = (scored[self.k - 1][0] + scored[self.k][0]) / 2
        self.c = region(self.q.extra["point"], d)
        self.A = {key for s, key in scored if s <= d}
        self.proto.stats["resolutions"] += 1
        self.setup(coord)

    def provable(self):
        a, p, n, k = len(self.A), len(self.P), len(self.N), self.k
        ep, en = self.eps
        return (p <= ep * a + _EPS and a * (1 - ep) <= k - n + _EPS and n <= en * k + _EPS
                and a + _EPS >= k * (1 - en) + p)

    def exposed(self):
        return True                     # Figure 7: every removal at count 0 runs Fix Error on R

    def check(self, coord):
        if not self.provable():
            self.recompute(coord)

    def recompute(self, coord):
        """Probe every stream that may be inside R; if fewer than k+1 are, probe the rest too."""
        maybe = sorted(self.A | self.N)
        self.probe(coord, maybe, lambda c: self._phase2(c, maybe))

    def _phase2(self, coord, maybe):
        if sum(1 for key in maybe if inside(self.c, self.value(coord, key))) > self.k:
            self.place(coord, maybe)
            return
        rest = [key for key in self.keys if key not in self.A and key not in self.N]
        self.probe(coord, rest, lambda c: self.place(c, self.keys))


class FTNRP(EntityProtocol):
    """Fraction tolerance, non-rank queries (range); ``zero`` gives ZT-NRP."""
    name = "ft-nrp"
    kinds = ("range",)
    State = _RangeState
    zero = False


class ZTNRP(FTNRP):
    name = "zt-nrp"
    zero = True


class FTRP(EntityProtocol):
    """Fraction tolerance, rank queries (k-NN via the bound R); ``zero`` gives ZT-RP."""
    name = "ft-rp"
    kinds = ("knn",)
    State = _KnnState
    zero = False

    def __init__(self, split=0.5, **kw):
        if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 <= split <= 1:
            raise ValueError("split (the share of the tolerance given to FP filters) must be in [0, 1]")
        super().__init__(**kw)
        self.split = float(split)


class ZTRP(FTRP):
    name = "zt-rp"
    zero = True


PROTOCOLS = {"zt-nrp": ZTNRP, "ft-nrp": FTNRP, "zt-rp": ZTRP, "ft-rp": FTRP}
