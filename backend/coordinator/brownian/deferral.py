"""Probabilistic deferral with DBM models (Zhu & Ravishankar 2004 §4.4, §4.6, §5, Algorithm 1).

``Brownian`` is the pull protocol of Algorithm 1: devices stay silent (width ∞); each query is a
task that probes its sources, answers ``A(t_k) ± ε`` with ``"guarantee": "probabilistic"`` and
defers its next refresh by the Δt of Eq. 7 (ε = precision / 2, p = the query's ``confidence``), never
beyond the time span its model was fitted over, with the model sped up by the query's measured misses
(calibration.py) so the stated confidence holds on streams that are not DBM paths, and never before
a sampled source's next change is due (holds.py: each source's claims checked and calibrated); a
refresh probes only the sources that may have changed since (the others are held), not every source;
refreshes beyond ``capacity`` probes/s are scheduled by EDF / Eq. 18 penalty order (scheduling.py).
While sources are offline the answer is Eq. 13's ``A_approx`` with ε + ε_intr.
"""
import math

from backend.coordinator.brownian import scheduling
from backend.coordinator.brownian.calibration import Calibration
from backend.coordinator.brownian.holds import Holds
from backend.coordinator.brownian.interruption import DEFAULT_CONFIDENCE, Models, confidence, z_two
from backend.coordinator.core.protocol import Protocol
from edge.core import brownian as bm


class _Refresh:
    __slots__ = ("id", "deadline", "inflight", "sent", "mu", "sigma", "cal", "center")

    def __init__(self, qid):
        self.id = qid
        self.deadline = -math.inf
        self.inflight = None       # set of keys whose probe replies are outstanding
        self.sent = 0.0
        self.mu = 0.0
        self.sigma = 0.0
        self.cal = Calibration()
        self.center = None         # (A(t_k), its answer's half-width) at the last refresh, all sources online


class Brownian(Protocol):
    """Algorithm 1 over probes: defer each query's refresh while P(error <= ε) >= p."""
    name = "brownian"
    kinds = ("sum", "avg", "min", "max")
    guarantee = "probabilistic"         # answers hold with the query's confidence, measured as fidelity
    finals = False                      # no bound to finalise: the guarantee is a probability (README: finals)
    marks = False                       # it asks for every value (a lost reply is its probe's timeout): no heartbeat

    def __init__(self, capacity=math.inf, order="penalty", defer=True, tmax=600.0, k=100, min_obs=10,
                 timeout=10.0, lead=0.0, confidence=DEFAULT_CONFIDENCE, calibrate=True):
        def num(v, what):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError("brownian: %s must be a number, got %r" % (what, v))
            return float(v)
        self.capacity = num(capacity, "capacity")
        self.tmax = num(tmax, "tmax")
        self.timeout = num(timeout, "timeout")
        self.lead = num(lead, "lead")
        self.default_p = num(confidence, "confidence")
        if self.capacity <= 0 or not (0 < self.tmax < math.inf) or self.timeout <= 0 or self.lead < 0:
            raise ValueError("brownian: need capacity > 0, 0 < tmax < inf, timeout > 0, lead >= 0")
        if not (0 < self.default_p < 1):
            raise ValueError("brownian: confidence must be in (0, 1)")
        if order not in scheduling.ORDERS:
            raise ValueError("brownian: order must be one of %s" % ", ".join(scheduling.ORDERS))
        if not isinstance(defer, bool) or not isinstance(calibrate, bool):
            raise ValueError("brownian: defer and calibrate must be true or false")
        self.calibrate = calibrate
        self.order = order
        self.defer = defer
        self.models = Models(k, min_obs)        # the coordinator adopts this store
        self.holds = Holds(self.default_p, calibrate)
        self.tasks = {}
        self.awaiting = {}                      # key -> query ids waiting for its probe reply
        self.carry = 0.0
        self.pid = 0
        self.stats = {"evaluations": 0, "late": 0, "lateness": 0.0, "penalty": 0.0, "probes": 0,
                      "dispatched": 0, "missed": 0, "checks": 0, "misses": 0}

    def target(self, coord, key):
        return math.inf, []

    def queries_changed(self, coord, now):
        Protocol.queries_changed(self, coord, now)
        for qid in coord.queries:
            if qid not in self.tasks:
                self.tasks[qid] = _Refresh(qid)
        for qid in [x for x in self.tasks if x not in coord.queries]:
            del self.tasks[qid]

    def p(self, q):
        return confidence(q, self.default_p)

    @staticmethod
    def coefficients(q):
        """a_i of Eq. 2 (single-source min/max is the value itself); None if the query is not linear."""
        if q.kind == "sum":
            return dict(q.weights)
        if q.kind == "avg":
            n = len(q.sources)
            return {s: w / n for s, w in q.weights.items()}
        if len(q.sources) == 1:
            return {q.sources[0]: 1.0}
        return None

    # -- answers -----------------------------------------------------------------------
    def answer(self, coord, q):
        a = self.coefficients(q)
        if a is None:
            return {"lo": -math.inf, "hi": math.inf, "guarantee": "none",
                    "note": "the Brownian model covers sum, avg and single-source queries"}
        p = self.p(q)
        out = {"lo": -math.inf, "hi": math.inf, "guarantee": "probabilistic", "confidence": p}
        until = coord.clock + coord.period
        center = var = 0.0
        for key, c in a.items():
            s = coord.cache.sources.get(key)
            if s is None or s.value is None:
                return out
            if s.online:
                center += c * s.value
                continue
            last = self.models.last(key)
            pred = None if last is None else self.models.predict(key, max(0.0, until - last[0]))
            if pred is None:
                return out
            center += c * (last[1] + pred[0])              # Eq. 13: S_i(t_i) + μ_i (t - t_i)
            var += c * c * pred[1]
        half = self._eps(coord, q, p) + (z_two(p) * math.sqrt(var) if var > 0 else 0.0)
        out["lo"], out["hi"] = center - half, center + half
        return out

    def _eps(self, coord, q, p):
        """ε, or what one refresh quantum T allows when the (calibrated) model wants refreshes faster than ticks."""
        st = self.tasks.get(q.id)
        eps = q.precision / 2
        if st is not None:
            T = coord.period
            eps = max(eps, abs(st.mu) * T + z_two(p) * st.sigma * math.sqrt(T))
        return eps

    # -- refreshes ----------------------------------------------------------------------
    def _model(self, coord, q):
        """(μ_A, σ_A², ready, span) of Eq. 6 over the online sources of ``q``; span: the shortest time
        span a source's model was fitted over (Eq. 7's Δt must not extrapolate beyond it)."""
        mu = s2 = 0.0
        span = math.inf
        ready = True
        for key, c in (self.coefficients(q) or {}).items():
            s = coord.cache.sources.get(key)
            if s is None or not s.online:
                continue
            est = self.models.params(key)
            if est is None:
                ready = False
                continue
            mu += c * est[0]
            s2 += c * c * est[1]
            ts = self.models.est[key].ts
            span = min(span, ts[-1] - ts[0])
        return mu, s2, ready, span

    def _check(self, coord, q, st):
        """§6.1's check of the answer this refresh replaces (fed to the query's calibration); A(t) now,
        or None unless every source is online with a value."""
        center = 0.0
        for key, c in (self.coefficients(q) or {}).items():
            s = coord.cache.sources.get(key)
            if s is None or not s.online or s.value is None:
                return None
            center += c * s.value
        if st.center is not None and self.calibrate:
            miss = abs(center - st.center[0]) > st.center[1] * (1 + 1e-9)
            st.cal.check(miss, self.p(q))
            self.stats["checks"] += 1
            self.stats["misses"] += 1 if miss else 0
        return center

    def reported(self, coord, key, m):
        if "probe" not in m:
            return
        if -math.inf < m["v"] < math.inf:
            self.holds.observe(key, m["t"], m["v"])
        for qid in sorted(self.awaiting.pop(key, ())):
            st = self.tasks.get(qid)
            if st is not None and st.inflight is not None:
                st.inflight.discard(key)
                if not st.inflight:
                    self._complete(coord, st, m["t"])

    def _complete(self, coord, st, t):
        st.inflight = None
        q = coord.queries.get(st.id)
        if q is None:
            return
        self.stats["evaluations"] += 1
        late = t - st.deadline
        if st.deadline > -math.inf and late > 1e-9:
            self.stats["late"] += 1
            self.stats["lateness"] += late
            self.stats["penalty"] += scheduling.penalty(st.mu, st.sigma, late)
        center = self._check(coord, q, st)
        mu, s2, ready, span = self._model(coord, q)
        d = st.cal.dilation
        st.mu, st.sigma = mu * d, math.sqrt(s2 * d)
        st.center = None if center is None else (center, self._eps(coord, q, self.p(q)))
        dt = 0.0
        if self.defer and ready and self.coefficients(q) is not None:
            dt = bm.defer(q.precision / 2, self.p(q), mu * d, s2 * d, min(self.tmax, max(span, coord.period))) - self.lead
        if self.defer:          # sampled sources: none changes before its next sample is due (as far as the
            dt = max(dt, min(self.holds.due(q.sources) - t, self.tmax))     # holds' calibration trusts them)
        st.deadline = t + max(dt, coord.period)   # stream items arrive once per tick at most

    def period(self, coord, t):
        T = coord.period
        sources = coord.cache.sources
        due = []
        for qid in sorted(self.tasks):
            st = self.tasks[qid]
            if st.inflight is not None:
                st.inflight = {k for k in st.inflight if sources[k].online}
                if not st.inflight or t - st.sent > self.timeout:
                    st.inflight = None          # replies lost: release the task again now
                    st.deadline = min(st.deadline, t)
                else:
                    continue
            if st.deadline >= t + T:
                continue
            keys = [k for k in coord.queries[qid].sources if k in sources and sources[k].online]
            if self.defer:      # probe only the sources that may have changed: the others are held
                keys = [k for k in keys if self.holds.due((k,)) < t + T] or keys
            if keys:
                due.append((scheduling.Task(qid, st.deadline, len(keys), st.mu, st.sigma), keys))
        if not due:
            self.carry = min(self.carry + self.capacity * T, self.capacity * T)
            return
        cap = self.capacity * T
        budget = self.carry + cap
        chosen = scheduling.plan([d[0] for d in due], t, budget, T, self.order)
        keys_of = {d[0].id: d[1] for d in due}
        self.stats["dispatched"] += len(chosen)
        self.stats["missed"] += len(due) - len(chosen)      # due before the next tick, left waiting
        probed = set()
        for task in chosen:
            st = self.tasks[task.id]
            for key in keys_of[task.id]:
                if key not in probed:
                    probed.add(key)
                    self.pid = (self.pid + 1) & 0xFFFF
                    coord.probe(key, self.pid)
                    self.stats["probes"] += 1
                self.awaiting.setdefault(key, set()).add(task.id)
            st.inflight = set(keys_of[task.id])
            st.sent = t
        waiting = [d[0].cost for d in due if d[0] not in chosen]
        self.carry = min(budget - len(probed), max([cap] + waiting)) if cap < math.inf else 0.0


PROTOCOLS = {"brownian": Brownian}
