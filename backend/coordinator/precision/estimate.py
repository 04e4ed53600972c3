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
- **Forced exits.** An exit at the reading right after a report (the value jumped past the bound between
  two readings) does not follow W^−α: a wider bound saves such exits only as far as their recorded jumps
  fit within its half-width, and a widening that saves nothing is not sent. The device's reading count says
  which exits they are (it was guessed from the shortest time between two reports, which irregular
  sampling shrinks until no exit looks forced: on car-park counts read about every 30 min with a few
  minutes of jitter, the guess credited widenings of sources that report at every reading).
- **Lattices.** Real readings are quantised (0.1 °C): a width admits only whole steps, so 0.91 and 0.99
  behave alike. Once a source's reported changes show a common step q (and not only one multiple of it),
  its width counts as the midpoint 2q(k + ½) of the k whole steps it admits, and targets are placed there,
  the leftover slack buying one more step where that saves the most.
- **Leads.** While a lead's bound is in force (edge.core.predict: its edges lie W/16 and 15W/16 from the
  report) the source is not measured: no exposure, no exits, no change for the lattice, for neither the
  rate model, the forced exits' half-width nor the lattice's cells describe it (on a binary walk its exits
  lie 1 and 4 steps away, which proved a lattice the centred widths do not have: issue #29).
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
  runs move little). Moves are chosen widening by widening, by saving, each with the narrowings that free
  its room at the least cost per unit of width, as far as the loan affords them (below). Narrowings go
  first; the slack they free is granted once the devices have confirmed them.
- **No regret, exactly** (``regret.py``). Every metered device counts the reports plain deadband would
  have sent at the same readings (edge.core.meter), so the rule knows real − deadband exactly at every
  report. It borrows a loan of ``guard`` messages (default: the number of queried sources, at least 8)
  and never goes past it: whenever the next message could make real − deadband, plus what syncing every
  moved source back costs (a downlink and its acknowledgement each) and what may be in flight within a
  round trip, exceed the loan, every source becomes its shadow's twin (a SYNC control: deadband's filter
  with the shadow's centre), after which it reports exactly as deadband does. A MIN/MAX cut is made only
  if it leaves that sum within the loan, a move of widths only within half of it (the other half takes
  the ups and downs of real − deadband, so a move is not synced away at its first unlucky report), but
  always room for one narrowing with its widening. Within that, a trailing stop backs off earlier: the
  ceiling on real − deadband starts at the loan and follows the saving down to 0 (once the saving has
  repaid the loan, the rule never falls behind deadband); past it every source is synced for a back-off
  that doubles each time, and each later try may lose half as much as the one before. A query change
  syncs the moved sources whose deadband filter changed. Sources whose devices do not meter (a micro:bit
  behind its gateway, older firmware) keep deadband's filter and constant models (``Guard.may_choose``); so
  does a source in segment mode, outside the ledger (``regret.Guard._metered``), but for MIN/MAX cuts where
  they pay (``extremes.Ledger``).

Idle coordinator ticks change nothing here (``quiet``), so the coordinator skips them.
"""
import math

from edge.core import codec
from backend.coordinator.core.protocol import range_constraints
from backend.coordinator.precision.adaptive import Adaptive
from backend.coordinator.precision.rows import INF, _MARGIN, allocate
from backend.coordinator.precision.extremes import REACH, Cuts
from backend.coordinator.precision.rates import ALPHAS, Source, shrinkage
from backend.coordinator.precision.regret import Guard, Ledger

_SWITCH = 2.0                   # log-likelihood gain needed to leave the prior α
_EVIDENCE = 8                  # exits of a source plus those the mean source would have made in its exposure


class Estimated(Guard, Adaptive):
    """Adaptive precision tuned online: measured rates, the static optimum, priced moves, an exact guard."""
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
        self.cmax = max([self.cost.default] + list(self.cost.table.values()))     # the dearest message
        self.src = {}                   # key -> Source (metered sources only: the others never move)
        self.alpha = ALPHAS[0]
        self.mult = None                # row multipliers of the last allocation (warm start)
        self.target = {}                # key -> width granted once the narrowings are confirmed
        self.narrowing = set()          # keys whose narrowing from a reallocation is not confirmed yet
        self.count = 0                  # reports since the last reallocation
        self.seen = 0                   # reports of the group so far, and since when
        self.since = None
        self.ledger = Ledger()          # real against metered deadband (regret.py)
        self.loan = None                # what the current try may lose, halved at each back-off
        self.ceiling = None             # the current try's trailing stop on real − deadband (None: backing off)
        self.until = -INF               # backing off (every source its shadow's twin) until then
        self.backoff = 0.0
        self.later = []                 # sources whose SYNC waits for the wider ones' (a revert's second step)
        self.stats.update({"reallocations": 0, "moves": 0, "backoffs": 0, "syncs": 0})

    def quiet(self, coord):
        return True

    def period(self, coord, t):
        pass

    # -- controls ---------------------------------------------------------------------------
    def _source(self, coord, key):
        st = self.src.get(key)
        if st is None:
            st = self.src[key] = Source(coord.clock, self._width(coord.cache.sources[key]))
        return st

    def queries_changed(self, coord, now):
        self.cuts.reset(coord)
        self.target, self.narrowing = {}, set()     # the settle re-plans every width
        Adaptive.queries_changed(self, coord, now)

    def _acknowledged(self, coord, key, why):
        """``key``'s device took the controls sent to it, as it acknowledged ``why`` (None: a report under its
        newest control came first; its acknowledgement, of either kind, is late or lost): a narrowing is confirmed
        (the wider ones follow once all are), or a SYNC (a revert's second step may follow). Unheard, one
        acknowledgement waited for ever: reordered behind its source's next report (FINAL seed 3002 with the
        faults, 165.9 s), it left the revert's narrower sources narrow and no new try began (real − deadband
        +2,200 by 1,200 s)."""
        if why != codec.WHY_SYNC and key in self.narrowing and not coord.cache.sources[key].old:
            self.narrowing.discard(key)
            if not self.narrowing:
                self._widen(coord)
        if why != codec.WHY_ASSIGN:
            self._second(coord)

    def _constraints(self, coord, key):
        return range_constraints(coord, key) + self.cuts.constraints(coord, key)

    def _silent(self, coord, key):
        return self.cuts.silent(coord, key)

    def reported(self, coord, key, m):
        s = coord.cache.sources[key]
        t = coord.clock
        led = self.ledger
        out = key in coord.segments.mode and self._meters(coord, key)
        if out:
            self._leave(coord, key)     # outside the ledger (regret.py)
        elif key in led.rebase:
            self._back(coord, key)
        meter = "n" in m and self._metered(coord, key)
        if meter:
            led.settle(s.device)
        dk = led.report(key, m, coord.devices[s.device]["boot"], self.cost(key), self.decay) if meter else None
        late = meter and key in led.acks and m["epoch"] == s.filt.epoch
        if late:        # a report under the newest control overtook its acknowledgement, or that was lost
            led.acked(key)
        if key not in self.rows.of:
            return
        if self.since is None:
            self.since = t
        if self.loan is None:
            self.loan = self.ceiling = self._hard()
        silent = self._silent(coord, key)
        v = m["v"] if m["v"] != codec.NO_VALUE else None
        if meter:
            st = self._source(coord, key)
            st.accrue(t)
            if m["why"] == codec.WHY_EXIT and not silent and not st.led:
                st.exited(v, st.eff(st.w), dk == 1, self.decay, self.memory)
            st.w = self._width(s)
            if v is not None and not silent:
                st.observe(v)
            st.led = bool(s.filt.led)
        if late or m["why"] == codec.WHY_ASSIGN or m["why"] == codec.WHY_SYNC:
            self._acknowledged(coord, key, None if late else m["why"])
        if v is not None and self.ceiling is not None:
            was = self._silent(coord, key)
            for k in self.cuts.reported(coord, key, v, m["why"], meter or out):
                if self._metered(coord, k) and not self._affords(coord, 2.0 * self.cost(k), k not in led.off, True):
                    sync = k != key or was  # a cut that does not fit the loan is not made; a cut source
                    self.cuts.uncut(coord, k, sync)     # whose re-cut or promotion does not becomes its
                    if sync:                            # shadow's twin
                        self._sync(coord, k)
                    continue
                w = self._width(coord.cache.sources[k])
                self._install(coord, k, self._home(coord, k)[0] if w == INF else w)
        self.seen += 1
        self.count += 1
        self._guard(coord, t)
        if self.count >= (self.every or max(8, len(self.rows.of))):
            self.count = 0
            self._reallocate(coord, t)

    def _send(self, coord, key, width):
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

    def _reallocate(self, coord, t):
        if self._confirming(coord) or not self._begin(coord, t):
            return
        src = coord.cache.sources
        keys = [k for k in sorted(self.src) if k in self.rows.of and not self._silent(coord, k) and self._metered(coord, k)]
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
        cands = []
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
            # the rate behind it is measured from n²/n2 decayed exits (plus the prior's pseudo-exits)
            exits = (st.n * st.n / st.n2 if st.n > 0 else 0.0) + prior
            cands.append((k, w, w1, saving, saving * saving / exits if exits > 0 else INF,
                          self.cost(k) * (2.0 if w1 < w else 1.0)))
        # the estimate's span (memory reports per source), but no longer than the run so far: a run
        # is expected to last about as long again as it has lasted (short runs move little)
        horizon = min(self.memory * len(keys) / self.seen, 1.0) * (t - self.since)
        narrow, widen = self._choose(coord, cands, horizon)
        if not widen:
            return
        self.target = {k: want[k] for k in widen}
        for k in narrow:
            self._send(coord, k, want[k])
            self.narrowing.add(k)
            self.target[k] = want[k]
        if not self.narrowing:
            self._widen(coord)

    def _choose(self, coord, cands, horizon):
        """The moves to make (narrowings, widenings) of the candidates (key, W, W', saving, its variance,
        messages): widenings by their saving, each with the narrowings that free its room at the least
        cost per unit of width, as far as the set's saving, one standard error below its estimate, pays
        for its messages over ``horizon`` and the loan affords them with their sync."""
        rows = self.rows
        widths = {k: self._width(s) for k, s in coord.cache.sources.items() if k in rows.of}
        slack = [b - u for b, u in zip(rows.budget, rows.used(widths))]
        by_row = {}
        for c in sorted((c for c in cands if c[2] < c[1]), key=lambda c: (-c[3] / (c[1] - c[2]), c[0])):
            for j, _ in rows.of[c[0]]:
                by_row.setdefault(j, []).append(c)
        at = dict.fromkeys(by_row, 0)
        chosen, taken = [], set()
        for c in sorted((c for c in cands if c[2] > c[1]), key=lambda c: (-c[3], c[0])):
            free, add, pos = list(slack), [], dict(at)
            for j, kj in rows.of[c[0]]:
                need = kj * (c[2] - c[1]) * (1 + _MARGIN)
                line = by_row.get(j, ())
                while free[j] < need and pos.get(j, 0) < len(line):
                    n = line[pos[j]]
                    pos[j] += 1
                    if n[0] not in taken and n not in add:
                        add.append(n)
                        for i, ki in rows.of[n[0]]:
                            free[i] += ki * (n[1] - n[2])
                if free[j] < need:
                    break
            else:
                trial = chosen + add + [c]
                gain = math.fsum(x[3] for x in trial)
                msgs = math.fsum(x[5] for x in trial)
                new = sum(1 for x in trial if x[0] not in self.ledger.off)
                if (gain - math.sqrt(math.fsum(x[4] for x in trial))) * horizon >= msgs and self._affords(coord, msgs, new):
                    chosen, at = trial, pos
                    taken.update(x[0] for x in add)
                    for j, kj in rows.of[c[0]]:
                        free[j] -= kj * (c[2] - c[1])
                    slack = free
        return [x[0] for x in chosen if x[2] < x[1]], [x[0] for x in chosen if x[2] > x[1]]

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
            if (dw <= 0 or (w > 0 and (w + dw) < w * (1.0 + self.hysteresis / 2))
                    or not self._affords(coord, self.cost(k), k not in self.ledger.off)):
                continue
            for j, c in rows.of[k]:
                slack[j] -= c * dw
            self._send(coord, k, w + dw)
        self.target = {}


PROTOCOLS = {"adaptive": Estimated}
