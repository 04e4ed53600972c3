"""Self-tuning adaptive precision (Olston et al. 2003 §3.3, App. E–F, estimated online): the static optimum of measured rates.

The default ``adaptive`` rule. Olston's §3.2 rule (``rule="shrink"``, ``precision.adaptive``) pays a
growth message every period for the slack its shrink frees, and needs T and S tuned to the data
(a period must span a few reports). Here nothing shrinks (S = 0: devices keep no timers) and widths move
only when a measured saving pays for the messages:

- **Rates.** Each source's report rate is modelled as r_i = v_i·W_i^(−α) (App. E: α = 2 for a random
  walk; α = 1 for a steady drift). Per source the coordinator keeps, over about ``memory`` of its own
  reports (exponential decay per report, so a busy and a quiet source both keep a window of reports
  whatever the time scale), the exits N_i, the exposure E_i(α) = ∫ W_i(t)^(−α) dt and Σ log W at the
  exits; v_i = (N_i + p)/(E_i + p/v̄), p pseudo-reports at the group's mean rate v̄: by default the
  empirical-Bayes (gamma–Poisson) shape v̄²/τ², τ² the spread of the measured rates beyond their sampling
  noise, so rates that differ by no more than noise are pooled and move no width (``prior`` fixes p).
  α ∈ {2, 1.5, 1} is the group's maximum-likelihood exponent (Poisson exits), 2 until the data say otherwise.
- **Forced exits.** An exit at the next reading after a report (the value jumped past the bound between
  two readings) does not follow W^−α: a wider bound saves such exits only as far as their recorded jumps
  fit within its half-width, and a widening that saves nothing is not sent.
- **Lattices.** Real readings are quantised (0.1 °C): a width admits only whole steps, so 0.91 and 0.99
  behave alike. Once a source's reported changes show a common step q (and not only one multiple of it),
  its width counts as the midpoint 2q(k + ½) of the k whole steps it admits, and targets are placed there,
  the leftover slack buying one more step where that saves the most.
- **Reallocation** every ``every`` reports of the group (default: as many as queried sources, so the
  adjustment interval follows the report rate whether readings come every millisecond or every day):
  the widths minimising Σ C_i·v_i·W_i^(−α) under the query rows (App. F, solved by dual multiplicative
  updates in plain floats, bit-reproducible in every process) are the targets. Sources more than
  ``hysteresis`` away from their target (and with about 8 reports' worth of evidence, counted again
  from a source's last move, so a width is seen at work before it is judged) move if the
  reports saved over a horizon pay for the messages: a widening costs one downlink, a narrowing a
  downlink and its acknowledging report. The saving counted is one standard error below its estimate
  (a rate measured from n exits is known to about r/√n, the prior's pseudo-exits included), so a move
  whose saving is within the noise of the measured rates is not made. The horizon is the estimate's
  span (``memory`` reports per source), at most the time the run has lasted so far (ski-rental: short
  runs move little). Narrowings go first; the slack they free is granted once the devices have
  confirmed them.
- **No regret.** Every report of the group is counted against an online estimate of what uniform
  deadband would have sent: an exit at width W is worth (W/U_i)^α exits at the uniform width U_i, but
  never more than the readings since the source's last report (deadband reports at most once per
  reading), any other report one. The rule borrows a loan of ``guard`` messages (default: the number of
  queried sources, at least 8): the messages of a reallocation are charged up front (it happens only if
  the estimated saving less its messages stays above the floor) and the messages it really sends (a
  widening the confirmed widths leave no room for is not sent) are written off over the horizon they
  were priced to pay back in. The floor starts at −loan and rises with the saving, never above 0:
  once the saving has repaid the loan, the rule never falls behind its deadband estimate. When the
  saving (plus the moves still paying back) falls below the floor, every source goes back to U_i for a
  back-off that doubles each time, and each later try may lose half as much as the one before (at most
  twice the loan in all).

Idle coordinator ticks change nothing here (``quiet``), so the coordinator skips them.
"""
import math

from edge.core import codec
from backend.coordinator.core.protocol import range_constraints
from backend.coordinator.precision.adaptive import Adaptive
from backend.coordinator.precision.rows import INF, _MARGIN
from backend.coordinator.precision.extremes import REACH, Cuts
from backend.coordinator.precision.rates import ALPHAS, Source, shrinkage

_SWITCH = 2.0                   # log-likelihood gain needed to leave the prior α
_EVIDENCE = 8                  # exits of a source plus those the mean source would have made in its exposure


def allocate(rows, weight, alpha, lam=None, iters=20, tol=1e-4):
    """Widths minimising Σ weight_i·W_i^(−α) under ``rows`` (App. F), and the row multipliers λ.

    KKT: W_i = (α·weight_i / Σ_j λ_j·|K_ij|)^(1/(α+1)); λ_j is scaled by (used_j/b_j)^((α+1)/2) per pass
    (exact in one pass for a single row) until no width moves by more than ``tol`` (the caller warm-starts
    λ, so successive calls keep converging). Rows with no budget pin their sources at width 0. Plain
    Python floats in a fixed order: the same widths in every process.
    """
    keys = sorted(rows.of)
    m = len(rows.coef)
    lam = list(lam) if lam is not None and len(lam) == m else [1.0] * m
    zero = {s for j, c in enumerate(rows.coef) if rows.budget[j] <= 0 for s in c}
    p = 1.0 / (alpha + 1.0)
    step = (alpha + 1.0) / 2.0
    widths, last = {}, {}
    for it in range(iters):
        moved = 0.0
        for key in keys:
            if key in zero:
                widths[key] = 0.0
                continue
            d = math.fsum(lam[j] * k for j, k in rows.of[key])
            w = widths[key] = (alpha * weight[key] / d) ** p if d > 0 else INF
            w0 = last.get(key, 0.0)
            moved = max(moved, abs(w - w0) / w if 0 < w < INF else (0.0 if w == w0 else 1.0))
        if it == iters - 1 or moved < tol:
            break
        last = dict(widths)
        for j, used in enumerate(rows.used(widths)):
            b = rows.budget[j]
            if b > 0:
                r = used / b if used < INF else 1e6
                lam[j] = min(max(lam[j] * max(r, 1e-6) ** step, 1e-300), 1e300)
    for key in keys:
        if widths[key] == INF:
            widths[key] = rows.uniform(key)
    return rows.fit(widths), lam


class Estimated(Adaptive):
    """Adaptive precision tuned online: measured rates, the static optimum, priced moves and a guard."""
    name = "adaptive"
    shrinks = False

    def __new__(cls, rule="estimate", **params):
        if rule == "shrink":
            code = Adaptive.__init__.__code__
            extra = sorted(set(params) - set(code.co_varnames[1:code.co_argcount]))
            if extra:
                raise ValueError("%s: only the default rule=estimate takes %s, not rule=shrink (Olston §3.2)"
                                 % (", ".join(extra), "them" if len(extra) > 1 else "it"))
            return Adaptive(**params)       # Olston §3.2: periodic shrink, burden-driven growth
        if rule != "estimate":
            raise ValueError("rule must be estimate or shrink, got %r" % (rule,))
        return super().__new__(cls)

    def __init__(self, rule="estimate", cost=1.0, seed=0, immediate=True, rate=None, eps=1e-8, memory=32,
                 every=None, hysteresis=0.1, guard=None, prior=None, reach=REACH, **shrink_only):
        if shrink_only:
            raise ValueError("%s: only rule=shrink (Olston §3.2) takes %s, not the default rule=estimate"
                             % (", ".join(sorted(shrink_only)), "them" if len(shrink_only) > 1 else "it"))
        Adaptive.__init__(self, cost=cost, seed=seed, immediate=immediate, rate=rate, eps=eps)
        for name, v in (("memory", memory), ("every", every), ("guard", guard)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1):
                raise ValueError("%s must be a number >= 1%s, got %r" % (name, "" if name == "memory" else " or null", v))
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, (int, float)) or not 0 <= hysteresis < 1:
            raise ValueError("hysteresis must be a number in [0, 1), got %r" % (hysteresis,))
        if prior is not None and (isinstance(prior, bool) or not isinstance(prior, (int, float)) or not prior > 0):
            raise ValueError("prior must be a number > 0 or null, got %r" % (prior,))
        self.prior = None if prior is None else float(prior)
        self.cuts = Cuts(reach, self.stats)     # MIN/MAX: sources far from the extreme are silent below a cut
        self.decay = 1.0 - 1.0 / memory
        self.memory, self.every, self.hysteresis, self.guard = memory, every, hysteresis, guard
        self.src = {}                   # key -> Source
        self.alpha = ALPHAS[0]
        self.mult = None                # row multipliers of the last allocation (warm start)
        self.target = {}                # key -> width granted once the narrowings are confirmed
        self.narrowing = set()          # keys whose narrowing from a reallocation is not confirmed yet
        self.count = 0                  # reports since the last reallocation
        self.seen = 0                   # reports of the group so far, and since when
        self.since = None
        self.spent = 0.0                # measured: reports and this rule's downlinks
        self.static = 0.0               # estimate of uniform deadband's messages
        self.loan = None                # messages the current try may lose (``guard``), halved at each back-off
        self.floor = None               # the guard fires when the estimated saving falls below this
        self.credit = []                # [time, messages sent, horizon] of moves still paying back
        self.until = -INF               # backing off to uniform widths until then
        self.backoff = 0.0
        self.stats.update({"reallocations": 0, "moves": 0, "backoffs": 0})

    def quiet(self, coord):
        return True

    def period(self, coord, t):
        pass

    # -- measurements -----------------------------------------------------------------
    def _source(self, coord, key):
        st = self.src.get(key)
        if st is None:
            st = self.src[key] = Source(coord.clock, self._width(coord.cache.sources[key]))
        return st

    def queries_changed(self, coord, now):
        self.cuts.reset(coord)
        self.target, self.narrowing = {}, set()     # the settle re-plans every width
        Adaptive.queries_changed(self, coord, now)

    def _constraints(self, coord, key):
        return range_constraints(coord, key) + self.cuts.constraints(coord, key)

    def _silent(self, coord, key):
        return self.cuts.silent(coord, key)

    def _install(self, coord, key, width):
        if self._silent(coord, key):
            width = INF
        if key in self.rows.of:
            st = self._source(coord, key)
            st.accrue(coord.clock)
            Adaptive._install(self, coord, key, width)
            st.w = self._width(coord.cache.sources[key])
        else:
            Adaptive._install(self, coord, key, width)

    def reported(self, coord, key, m):
        if key not in self.rows.of:
            return
        s = coord.cache.sources[key]
        st = self._source(coord, key)
        t = coord.clock
        st.accrue(t)
        c = self.cost(key)
        self.spent += c
        silent = self._silent(coord, key)
        gap = m["t"] - st.rt if st.rt is not None and m["t"] > st.rt else INF
        if m["v"] != codec.NO_VALUE:
            st.rt, st.gap = m["t"], min(st.gap, gap)
        if m["why"] == codec.WHY_EXIT and not silent:
            u, w = st.eff(self.rows.uniform(key)), st.eff(st.w)
            worth = (w / u) ** self.alpha if 0 < u < INF and w < INF else 1.0
            # deadband reports at most once per reading: no more than gap / (shortest gap seen) here
            self.static += c * min(worth, max(1.0, gap / st.gap))
            st.exited(m["v"] if m["v"] != codec.NO_VALUE else None, w, gap, self.decay, self.memory)
        elif m["why"] == codec.WHY_ASSIGN and key in self.narrowing:
            if not s.old:
                self.narrowing.discard(key)
                if not self.narrowing:
                    self._widen(coord)
        else:
            self.static += c
        st.w = self._width(s)
        if m["v"] != codec.NO_VALUE:
            if not silent:
                st.observe(m["v"])
            for k in self.cuts.reported(coord, key, m["v"], m["why"] == codec.WHY_EXIT):
                self._recut(coord, k)
        if self.since is None:
            self.since = t
        self.seen += 1
        self.count += 1
        if self.count >= (self.every or max(8, len(self.rows.of))):
            self.count = 0
            self._reallocate(coord, t)

    def _recut(self, coord, key):
        """Install ``key``'s new cuts (a promoted source gets its uniform width back)."""
        w = self._width(coord.cache.sources[key])
        self._install(coord, key, self.rows.uniform(key) if w == INF else w)

    def _send(self, coord, key, width):
        self.spent += self.cost(key)
        if key in self.src:            # judged again once the new width has been seen at work
            self.src[key].fresh, self.src[key].mt = 0, coord.clock
        self.stats["moves"] += 1
        self._install(coord, key, width)

    # -- reallocation -----------------------------------------------------------------
    def _fit_alpha(self):
        """The group's maximum-likelihood α (Poisson exits at rate v·W^−α), the prior unless clearly worse."""
        ll = []
        for a, alpha in enumerate(ALPHAS):
            total = 0.0
            for key in sorted(self.src):
                st = self.src[key]
                if st.n > 0 and st.e[a] > 0:
                    total += st.n * math.log(st.n / st.e[a]) - alpha * st.lw
            ll.append(total)
        best = max(range(len(ALPHAS)), key=lambda a: (ll[a] - (0 if a == 0 else _SWITCH), -a))
        return ALPHAS[best]

    def _guard(self, coord, t):
        """Back off to uniform widths when the estimated saving falls below the floor; True while backing off."""
        if t < self.until:
            return True
        saved = self.static - self.spent
        # moves paid up front are written off over the horizon they were priced to pay back in
        self.credit = [c for c in self.credit if t < c[0] + c[2] and c[1] > 0]
        if saved + math.fsum(m * (1.0 - (t - t0) / h) for t0, m, h in self.credit) >= self.floor:
            # the loan is repaid from the saving: once it exceeds the loan, never fall behind deadband
            self.floor = max(self.floor, min(0.0, saved - self.loan))
            return False
        self.stats["backoffs"] += 1
        self.backoff = max(2 * self.backoff, t - self.since)
        self.until = t + self.backoff
        self.target, self.narrowing, self.credit = {}, set(), []
        for key in sorted(self.rows.of):
            s = coord.cache.sources.get(key)
            if s is not None and s.filt.width != s.filt._r(self.rows.uniform(key)) and not self._silent(coord, key):
                self._send(coord, key, self.rows.uniform(key))
        self.loan /= 2.0                # each later try may lose half as much as the one before
        self.floor = self.static - self.spent - self.loan
        return True

    def _reallocate(self, coord, t):
        if self.floor is None:
            self.loan = self.guard if self.guard is not None else max(8.0, float(len(self.rows.of)))
            self.floor = -self.loan
        if self._confirming(coord) or self._guard(coord, t):
            return
        src = coord.cache.sources
        keys = [k for k in sorted(self.rows.of) if k in src and not self._silent(coord, k)]
        for k in keys:
            self._source(coord, k).accrue(t)
        self.alpha = alpha = self._fit_alpha()
        a = ALPHAS.index(alpha)
        n = math.fsum(self.src[k].n for k in keys)
        e = math.fsum(self.src[k].e[a] for k in keys)
        if not n or not e:
            return
        mean = n / e
        prior = self.prior if self.prior is not None else shrinkage([self.src[k] for k in keys], a, mean)
        rate = {}
        for k in sorted(self.rows.of):
            st = self.src.get(k)
            rate[k] = (st.n + prior) / (st.e[a] + prior / mean) if st and prior < INF else mean
        weight = {k: self.cost(k) * r for k, r in rate.items()}
        want, self.mult = allocate(self.rows, weight, alpha, self.mult)
        want = self._snap(want, weight, alpha)
        self.stats["reallocations"] += 1
        band = 1.0 + self.hysteresis
        gain = var = msgs = 0.0
        narrow, widen = [], []
        for k in keys:
            s, st = src[k], self.src[k]
            w, w1 = self._width(s), want[k]
            e, e1 = st.eff(w), st.eff(w1)
            if (not s.online or st.n + st.e[a] * mean < _EVIDENCE or e1 == e
                    or (st.mt is not None and st.fresh + (t - st.mt) * mean * (e ** -alpha if e > 0 else INF) < _EVIDENCE)
                    or (e1 < e * band and e < e1 * band)):
                continue
            saving = st.saving(weight[k], alpha, e, e1, w1 > w and w1 / 2)
            if w1 > w and saving <= 0:
                continue                # a widening that saves nothing is not worth its message
            gain += saving
            # the rate behind it is measured from n²/n2 decayed exits (plus the prior's pseudo-exits)
            exits = (st.n * st.n / st.n2 if st.n > 0 else 0.0) + prior
            var += saving * saving / exits if exits > 0 else INF
            msgs += self.cost(k) * (2.0 if w1 < w else 1.0)
            (narrow if w1 < w else widen).append(k)
        # the estimate's span (memory reports per source), but no longer than the run so far: a run
        # is expected to last about as long again as it has lasted (short runs move little)
        horizon = min(self.memory * len(keys) / self.seen, 1.0) * (t - self.since)
        if (not (narrow or widen) or (gain - math.sqrt(var)) * horizon < msgs
                or self.static - self.spent - msgs < self.floor):
            return                      # the messages are charged up front: within the loan or not at all
        self.credit.append([t, 0.0, horizon])   # credited with the messages this move really sends
        self.target = {k: want[k] for k in widen}
        for k in narrow:
            self._send(coord, k, want[k])
            self.credit[-1][1] += 2.0 * self.cost(k)       # the downlink and its acknowledging report
            self.narrowing.add(k)
            self.target[k] = want[k]
        if not self.narrowing:
            self._widen(coord)

    def _confirming(self, coord):
        """Whether a move's narrowings still wait for their acknowledgements. An offline source sends
        none: it is waited for no more (its unconfirmed mirror still counts in ``_width``), and once none
        is left the move's widenings are granted."""
        if not self.narrowing:
            return False
        src = coord.cache.sources
        self.narrowing = {k for k in self.narrowing if k in src and src[k].online}
        if not self.narrowing:
            self._widen(coord)
        return True

    def _snap(self, want, weight, alpha):
        """On lattice sources, widths at the midpoint of the whole quanta they admit, the leftover
        slack spent on one more quantum where it saves the most reports per unit of slack."""
        rows = self.rows
        snapped, bump = dict(want), []
        for k, w in want.items():
            st = self.src.get(k)
            q = st.quantum() if st is not None else 0.0
            if not q or not w < INF or w < q:
                continue
            lo = 2.0 * q * (math.floor(w / (2.0 * q) - 0.5 + 1e-9) + 0.5)
            hi = lo + 2.0 * q
            snapped[k] = lo
            bump.append((weight[k] * (lo ** -alpha - hi ** -alpha) / (2.0 * q * math.fsum(c for _, c in rows.of[k])), k, hi))
        slack = [b - u for b, u in zip(rows.budget, rows.used(snapped))]
        for _, k, hi in sorted(bump, key=lambda x: (-x[0], x[1])):
            dw = hi - snapped[k]
            if all(slack[j] >= c * dw * (1 + _MARGIN) for j, c in rows.of[k]):
                for j, c in rows.of[k]:
                    slack[j] -= c * dw
                snapped[k] = hi
        return snapped

    def _widen(self, coord):
        """Grant the pending widenings as far as the confirmed widths leave room (largest gain first)."""
        src = coord.cache.sources
        rows = self.rows
        widths = {k: self._width(s) for k, s in src.items() if k in rows.of}
        slack = [b - u for b, u in zip(rows.budget, rows.used(widths))]
        order = sorted((k for k in self.target if k in src and self.target[k] > widths[k]),
                       key=lambda k: (-self.target[k] / max(widths[k], 1e-300), k))
        for k in order:
            w = widths[k]
            dw = min([self.target[k] - w] + [slack[j] / c for j, c in rows.of[k]]) * (1 - _MARGIN)
            if dw <= 0 or (w > 0 and (w + dw) < w * (1.0 + self.hysteresis / 2)):
                continue
            for j, c in rows.of[k]:
                slack[j] -= c * dw
            self._send(coord, k, w + dw)
            self.credit[-1][1] += self.cost(k)
        self.target = {}


PROTOCOLS = {"adaptive": Estimated}
