"""Adaptive precision manager (Olston et al. 2003 §3, §3.4, §4.1, App. A–C): shrink every T, regrow by burden.

Every adjustment period T the coordinator shrinks every mirrored width by S (the devices do the same
on their own clocks), then ``Adaptive.period`` computes, per source, the burden score
B_i = C_i·N_i/(T·W_i) (= C_i/(P_i·W_i) with P_i = T/N_i), solves the sparse linear system of §3.2.1 /
App. B for the burden targets T_j, ranks sources by deviation D_i = max(B_i − Σ_j |K_ij|·T_j, 0)
(ties broken by a seeded RNG) and greedily gives each the largest growth ΔW_i = min_j slack_j/|K_ij|
its constraints allow. Growth is a widening ``coord.assign_width`` (no ack, one downlink message).

Three opt-in refinements (``REFINED``: reports=20, cap=0.2, growth_cost=1); the defaults are §3.2
exactly (the experiment runs both). Why: on a random walk whose sources report about once per period, the paper's
per-period count N_i is 0 or 1, so the burden ranking is mostly noise, and the top object taking the
whole slack swings its width in a sawtooth (the cost ∝ 1/W² is convex); both cost 10–20 % more
reports than the offline optimum at δ = 5–10.
- ``reports`` = K: the burden uses the most recent periods that hold at least K reports (at most
  ``memory`` periods), each period's exposure weighted by the App. E model P ∝ W²:
  B_i = C_i·N/(E·W_i³) with N the reports and E = Σ_k T/W_k² over those periods (W_k the width in
  force). One period with a constant width gives the paper's C_i·N_i/(T·W_i) up to a common factor;
  busy objects keep a one-period window, quiet ones pool enough reports to rank reliably.
- ``cap`` = g: one object grows by at most g·W_i in a period, so the freed slack goes to several
  overburdened objects; what is left after that pass goes, uncapped, to the objects already grown.
- ``growth_cost`` = c: a growth message costs c·C_i. The most deviating object of each row grows
  as in the paper; another object gets a message only if it pays: the reports it saves over the
  shrink horizon T/S, r_i·(T/S)·(1 − (W_i/(W_i+ΔW_i))²) with r_i its estimated report rate, minus
  what the same slack would save at the row's first grower (which gets it otherwise, as far as its
  other rows leave room), must be at least c·C_i. Objects
  that report rarely (most of the §5 network objects) are left to the greedy rule; busy ones spread.
  With c = 0 (growth free, the paper's idealized §3.3 setting) growth always spreads.

Constraints (``Rows``, ``rows.py``): a weighted AVG query gives Σ_i |K_ij|·W_i ≤ δ_j·|S_j|, a SUM query
Σ_i |K_ij|·W_i ≤ δ_j, and a MIN/MAX query one single-object row W_i ≤ δ_j per object (App. A);
COUNT is exact (plain count needs no bounds; count-in-range gets membership constraints).

Padding mode (§4.1, ``rate=R``): the coordinator answers without the serialising delay and widens
every cached bound by φ_i = 2·R_i·λ, allocating with δ' = δ − (padding share). R_i must bound how far
O_i moves within λ; with sampled sources λ must also cover one sample interval (a report is stamped
at the reading that left the bound, up to one interval after the last reading inside it).
"""
import math
import random

from backend.coordinator.core import aggregate
from backend.coordinator.core.protocol import Protocol, lagged, range_constraints, realtime
# _PerKey is not used here: Spark state pickled before the constraint rows had their own module names it here
from backend.coordinator.precision.rows import INF, _MARGIN, Rows, _PerKey, _per_key, burden_targets  # noqa: F401

REFINED = {"reports": 20, "memory": 50, "cap": 0.2, "growth_cost": 1.0}


class Adaptive(Protocol):
    """Olston's adaptive filters: periodic shrink S every T, burden-driven greedy regrowth."""
    name = "adaptive"
    shrinks = True
    replaces = True

    def __init__(self, cost=1.0, seed=0, immediate=True, rate=None, eps=1e-8, reports=0, memory=50, cap=None,
                 growth_cost=0.0):
        self.cost = _per_key(cost, "cost")
        for name, v, least in (("reports", reports, 0), ("memory", memory, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError("%s must be an integer >= %d, got %r" % (name, least, v))
        self.reports, self.memory = reports, memory     # K reports per burden estimate (0: one period, paper)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
            raise ValueError("cap must be a number > 0 or null, got %r" % (cap,))
        self.cap = cap                      # largest growth per period as a fraction of W; None: paper
        if isinstance(growth_cost, bool) or not isinstance(growth_cost, (int, float)) or not growth_cost >= 0:
            raise ValueError("growth_cost must be a number >= 0, got %r" % (growth_cost,))
        self.growth_cost = float(growth_cost)
        self.hist = {}                      # key -> [(reports, T/W²)] per period, newest last
        self.held = {}                      # key -> width in force since the last adjustment
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed must be an integer, got %r" % (seed,))
        self.rng = random.Random(seed)
        if not isinstance(immediate, bool):
            raise ValueError("immediate must be true or false, got %r" % (immediate,))
        self.immediate = immediate          # §3.4: narrow at once when a precision gets tighter
        self.rate = None if rate is None else _per_key(rate, "rate")
        if not (isinstance(eps, (int, float)) and 0 < eps < 1):
            raise ValueError("eps must be in (0, 1), got %r" % (eps,))
        self.eps = eps
        self.lam = 0.0                      # λ, known once the coordinator asks for its queue delay
        self.rows = Rows({})
        self.use = {}                       # row j -> an upper bound on Σ|K_ij|·W_i over its born sources
        self.prec = {}                      # query id -> precision last allocated for
        self.targets = None
        self.pre = {}                       # padding: key -> width before the last shrink
        self.tick_t = -INF
        self.stats = {"growth": 0, "narrow": 0, "solves": 0}

    def segments_needed(self, coord, key, width):
        """Widths move within the lag-free rows; only a single-object row (a MIN/MAX of precision at most
        ``width``) holds ``key``'s filter to no wider than its segments' ``width`` (a cut asks for segments
        first: ``Mirror.ready``)."""
        narrow = False
        for qid in coord.by_source.get(key, ()):
            q = coord.queries[qid]
            if lagged(q) or q.kind == "count" and q.range is None:
                continue
            if q.kind not in ("min", "max") or q.precision > width:
                return True
            narrow = True
        return not narrow

    # -- §4.1 padding ---------------------------------------------------------------
    def queue_latency(self, latency):
        self.lam = latency
        return 0.0 if self.rate is not None else latency

    def phi(self, key):
        return 2.0 * self.rate(key) * self.lam if self.rate is not None else 0.0

    def answer(self, coord, q):
        if self.rate is None:
            return Protocol.answer(self, coord, q)
        recent = coord.clock < self.tick_t + self.lam

        def known(key):
            lo, hi = coord.cache.known(key)
            p = self.phi(key) / 2
            if recent and key in self.pre:
                # the device shrank at the tick; its re-check report may still be on its way
                p += max(0.0, (self.pre[key] - coord.cache.sources[key].filt.width) / 2)
            return lo - p, hi + p
        lo, hi = aggregate.answer(q, known)
        return {"lo": lo, "hi": hi}

    # -- widths -------------------------------------------------------------------------
    def _width(self, s):
        """The widest mirror still in force (pending narrowings count with their old width)."""
        w = s.filt.width
        for f in s.old:
            if f.width > w:
                w = f.width
        return w

    def _constraints(self, coord, key):
        return range_constraints(coord, key)

    def _install(self, coord, key, width):
        s = coord.cache.sources[key]
        cons = self._constraints(coord, key)
        if cons != s.filt.cons:
            self._moved(key)
            coord.assign_filter(key, width, cons)
        elif s.filt._r(width) != s.filt.width:    # as the mirror stores it (float32 boards)
            if width < s.filt.width:
                self.stats["narrow"] += 1
            self._moved(key)
            coord.assign_width(key, width)

    def _moved(self, key):
        """``key``'s width changes: the rows it is in are summed afresh when next needed."""
        for j, _ in self.rows.of.get(key, ()):
            self.use.pop(j, None)

    def _counted(self, s, key):
        """The width source ``s`` (``key``) takes up in its rows: the widest mirror in force (unconfirmed
        older mirrors included), or its uniform share while that is unbounded."""
        w = self._width(s)
        return w if w < INF else self.rows.uniform(key)

    def _settle(self, coord, fresh=(), rows=None):
        """Give new/unqueried sources their widths and make every (selected) row fit."""
        widths = {}
        for key, s in coord.cache.sources.items():
            if key in self.rows.of:
                widths[key] = self.rows.uniform(key) if key in fresh else self._counted(s, key)
        self.rows.fit(widths, rows)
        for key in coord.cache.sources:
            self._install(coord, key, widths.get(key, INF))

    def source_added(self, coord, key):
        """A new source takes its uniform width. Every width settles again only when that might overfill
        one of its rows (or §3.4 lets a precision change wait), so a birth costs its own rows, not the fleet."""
        u = self._uniform(coord, key)
        use = self._room(coord, key, u) if self.immediate else None
        if use is not None:
            self._install(coord, key, u)
            w = self._counted(coord.cache.sources[key], key) if u < INF else u   # a float32 board rounds it
            if w != u:
                use = {j: use[j] + k * (w - u) for j, k in self.rows.of[key]}
                if not all(v <= self.rows.budget[j] * (1 - _MARGIN) for j, v in use.items()):
                    use = None
        if use is None:
            self._settle(coord, fresh=(key,))
        else:
            self.use.update(use)

    def _uniform(self, coord, key):
        """The width a newborn ``key`` takes: its uniform share (§1.2), unbounded in no query."""
        return self.rows.uniform(key) if key in self.rows.of else INF

    def _room(self, coord, key, u):
        """The use of each of ``key``'s rows with ``key`` at width ``u`` ({row: use}), or None when one
        might not fit. A row's use is summed as ``_settle`` counts it (``_counted``) the first time it is
        needed, and kept as an upper bound: births add to it, every other change of a width re-sums it,
        and confirmations and departures only lower the truth."""
        src, rows = coord.cache.sources, self.rows
        out = {}
        for j, k in rows.of.get(key, ()):
            use = self.use.get(j)
            if use is None:
                use = math.fsum(c * self._counted(src[s], s) for s, c in rows.coef[j].items()
                                if s in src and s != key)
            use += k * u
            if not use <= rows.budget[j] * (1 - _MARGIN):
                return None
            out[j] = use
        return out

    def resync(self, coord, key, want):
        width, cons = want
        self._moved(key)
        if cons:
            coord.assign_filter(key, width, cons)
        else:
            coord.assign_width(key, width)

    def queries_changed(self, coord, now):
        self.rows = Rows(realtime(coord), self.phi)
        self.use = {}
        self.targets = None
        rows = None
        if not self.immediate:
            # §3.4: a tighter precision only suppresses growth; shrinking gets there over time
            lax = {qid for qid, q in coord.queries.items() if qid in self.prec and q.precision < self.prec[qid]}
            rows = {j for j, qid in enumerate(self.rows.query) if qid not in lax}
        self.prec = {qid: q.precision for qid, q in coord.queries.items()}
        self._settle(coord, rows=rows)

    # -- §3.2 growth --------------------------------------------------------------------
    def period(self, coord, t):
        rows = self.rows
        T = coord.period
        src = coord.cache.sources
        if self.rate is not None:
            self.tick_t = t
            self.pre = {k: s.filt.width / (1 - coord.shrink) for k, s in src.items() if s.filt.width != INF}
        widths = {k: self._width(s) for k, s in src.items() if k in rows.of}
        if self.rate is not None:
            # padded answers use the pre-shrink width for λ after the tick, so that is what is in use:
            # the width this shrink frees is handed out one period later
            widths = {k: max(w, self.pre.get(k, w)) for k, w in widths.items()}
        if not widths:
            return
        if len(self.hist) > len(rows.of):
            self.hist = {k: h for k, h in self.hist.items() if k in rows.of}
        burden, rate = {}, {}
        for key in rows.of:
            s = src.get(key)
            if s is None:
                burden[key] = 0.0
                continue
            floor = 1e-6 * rows.uniform(key) or 1.0
            w = max(widths[key], floor)
            if self.reports:
                held = self.held.get(key, INF)      # the width in force over the period just ended
                n, e = self._pooled(key, s.reports, max(held if held < INF else w / (1 - coord.shrink), floor), T)
                rate[key] = n / (e * w * w) if n else 0.0
            else:
                rate[key] = s.reports / T
            burden[key] = self.cost(key) * rate[key] / w
        targets = burden_targets(rows, burden, self.targets, self.eps)
        self.targets = targets
        self.stats["solves"] += 1
        order = sorted(widths)
        self.rng.shuffle(order)
        dev = {}
        for key in order:
            d = burden[key] - math.fsum(k * targets[j] for j, k in rows.of[key])
            dev[key] = d if d > 0 else 0.0
        order.sort(key=lambda k: -dev[k])
        slack = [b - u for b, u in zip(rows.budget, rows.used(widths))]
        grown, first = {}, {}
        for spread in (True, False):    # capped pass; then the leftover to the objects already grown
            for key in order:
                s = src[key]
                if not s.online or not (spread or key in grown):
                    continue
                of = rows.of[key]
                if not s.reports and all(len(rows.coef[j]) == 1 for j, _ in of):
                    continue    # single-object rows only: regrow lazily, when the narrower bound cost a report
                w = grown.get(key, s.filt.width)
                dw = min(slack[j] / k for j, k in of) * (1 - _MARGIN)
                if spread and self.cap is not None:
                    dw = min(dw, self.cap * max(w, 1e-6 * rows.uniform(key)))
                if dw <= _MARGIN * max(rows.budget[j] for j, _ in of):
                    continue
                if key not in grown and all(j in first for j, _ in of):
                    # every row of key has a grower already, which gets this slack in the leftover pass
                    g = first[of[0][0]]
                    room = min(dw, max(0.0, min(slack[j] / k for j, k in rows.of[g])))
                    if not self._pays(key, rate[key], w, dw, coord, (rate[g], src[g].filt.width, grown[g], room)):
                        continue
                for j, k in of:
                    slack[j] -= k * dw
                    first.setdefault(j, key)
                grown[key] = w + dw
            if self.cap is None:
                break
        for key, w in grown.items():
            self.stats["growth"] += 1
            self._moved(key)
            coord.assign_width(key, w)
        self.held = {k: s.filt.width for k, s in src.items() if k in rows.of}

    def _pooled(self, key, n, width, T):
        """Reports N and exposure E = Σ T/W² over the newest periods holding >= K reports (<= memory periods)."""
        h = self.hist.setdefault(key, [])
        h.append((n, T / (width * width)))
        total_n = total_e = 0.0
        cut = len(h)
        while cut and total_n < self.reports and len(h) - cut < self.memory:
            cut -= 1
            total_n += h[cut][0]
            total_e += h[cut][1]
        del h[:cut]                 # later windows start later, so they never reach further back
        return total_n, total_e

    def _pays(self, key, rate, width, dw, coord, other=None):
        """Whether growing ``key`` by dw saves a growth message's cost in reports over T/S.

        Saved reports follow the App. E model (rate ∝ 1/W²). ``other`` = (rate, width, grown width, room)
        of the object that would otherwise get ``room`` (<= dw) of this slack; its saving is subtracted.
        """
        if not self.growth_cost or not coord.shrink:
            return True
        saved = rate * (1 - (width / (width + dw)) ** 2)
        if other:
            r, w0, w1, room = other
            saved -= r * w0 * w0 * (1 / (w1 * w1) - 1 / ((w1 + room) * (w1 + room)))
        return saved * coord.period / coord.shrink >= self.growth_cost * self.cost(key)

PROTOCOLS = {}     # registered as "adaptive" with rule="shrink" by precision.estimate
