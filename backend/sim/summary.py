"""Summary-site workloads on the simulator loop (Bulut & Singh 2003 §5 setup): SWAT-ASR and its baselines.

One device streams readings every ``data.interval`` seconds into a SWAT tree; client sites ask
one-time summary queries (kind "summary", type point | range | inner) at a query arrival rate;
phases end every ``phase`` seconds. The loop runs the readings, reads and phase ends as events of
the site tree (``backend.sim.sites``); every answer carries its error estimate (a guaranteed
interval) and is checked against the exact window (the truth plug-in kept here). Workload keys::

    {"window": 32, "protocol": "swat-asr" | "dc" | "aps", "clients": 1, "phase": 10,
     "duration": 1000, "seed": 0, "warmup": s,
     "data": {"generator": "weather" | "uniform" | "random_walk", "interval": 2.0},
     "queries": [{"id": "q", "kind": "summary", "type": "inner", "weights": "linear",
                  "window": "random" | [first, last], "rate": 1.0, "precision": 2.0, "client": "all"}],
     "params": {...constructor keywords of the system...}}

``precision`` is the tolerated error per unit of weight: a query with weights W must be answered
within delta = precision * sum|W| (a point query within ``precision``); ``rate`` is queries per second
per client; "range" queries also take ``value`` (default: the window mean) and ``radius``.
"""
import math
import random

from backend.coordinator.swat.asr import weights_for
from backend.sim.loop import Loop
from backend.sim.sites import SYSTEMS
from backend.sim.spec import Base, WorkloadError, integer, keys, number, protocol_params, read

TYPES = ("point", "range", "inner")
WEIGHTS = ("linear", "exponential", "uniform")
GENERATORS = ("weather", "uniform", "random_walk")
TOP = ("name", "window", "protocol", "clients", "phase", "duration", "seed", "warmup", "data", "queries", "params")
QUERY = ("id", "kind", "type", "weights", "window", "rate", "precision", "radius", "value", "client")
DATA, QUERY_EVENT, PHASE = "data", "query", "phase"


def stream(generator, n, seed):
    """``n`` readings. "weather": a daily-maximum-temperature stand-in (seasonal cycle + AR(1)
    noise, °F) for the paper's Santa Barbara trace, which is not available here; "uniform": the
    paper's synthetic U[0, 100]; "random_walk": unit steps."""
    rng = random.Random(seed)
    out = []
    if generator == "weather":
        e = 0.0
        for t in range(n):
            e = 0.7 * e + rng.gauss(0.0, 3.0)
            out.append(round(68.0 + 8.0 * math.sin(2 * math.pi * t / 365.25) + e, 1))
    elif generator == "uniform":
        out = [rng.uniform(0.0, 100.0) for _ in range(n)]
    else:
        v = 50.0
        for _ in range(n):
            v += rng.choice((-1.0, 1.0))
            out.append(v)
    return out


class SummaryWorkload(Base):
    kind, KEYS, name = "summary", TOP, "summary"

    def __init__(self, raw):
        Base.__init__(self, raw)
        win = raw.get("window", 32)
        if not isinstance(win, int) or isinstance(win, bool) or win < 4 or win & (win - 1):
            raise WorkloadError("window must be a power of two >= 4, got %r" % (win,))
        self.window = win
        self.protocol = raw.get("protocol", "swat-asr")
        if self.protocol not in SYSTEMS:
            raise WorkloadError("protocol must be one of %s, got %r" % (", ".join(sorted(SYSTEMS)), self.protocol))
        self.clients = integer(raw, "clients", 1, "workload", hi=254)
        if "duration" not in raw:
            raise WorkloadError("duration (simulated seconds) is required")
        self.duration = number(raw, "duration", None, "workload", positive=True)
        self.phase = number(raw, "phase", 10.0, "workload", positive=True)
        data = keys(raw.get("data", {}), ("generator", "interval"), "data")
        self.generator = data.get("generator", "weather")
        if self.generator not in GENERATORS:
            raise WorkloadError("data.generator must be one of %s" % ", ".join(GENERATORS))
        self.interval = number(data, "interval", 1.0, "data", positive=True)
        self.warmup = number(raw, "warmup", 2 * win * self.interval, "workload", lo=0.0)
        qs = raw.get("queries")
        if not isinstance(qs, list) or not qs:
            raise WorkloadError("queries must be a non-empty list")
        for n, q in enumerate(qs):
            if not isinstance(q, dict) or q.get("kind") != "summary":
                raise WorkloadError("every query needs kind \"summary\", got %r" % (q,))
            keys(q, QUERY, "queries[%d]" % n)
            if q.get("type", "inner") not in TYPES:
                raise WorkloadError("query %s: type must be one of %s" % (q.get("id"), ", ".join(TYPES)))
            if q.get("weights", "linear") not in WEIGHTS:
                raise WorkloadError("query %s: weights must be one of %s" % (q.get("id"), ", ".join(WEIGHTS)))
            qw = q.get("window", "random")
            if qw != "random" and not (isinstance(qw, list) and len(qw) == 2 and all(isinstance(x, int) for x in qw)
                                       and 0 <= qw[0] <= qw[1] < win):
                raise WorkloadError("query %s: window must be \"random\" or [first, last] within 0..%d"
                                    % (q.get("id"), win - 1))
            for key, default, positive in (("rate", 1.0, True), ("precision", 1.0, False), ("radius", 1.0, False)):
                number(q, key, default, "queries[%d]" % n, lo=0.0, positive=positive)
            client = q.get("client", "all")
            if client != "all" and (not isinstance(client, int) or not 1 <= client <= self.clients):
                raise WorkloadError("query %s: client must be \"all\" or 1..%d" % (q.get("id"), self.clients))
        self.queries = qs
        params = raw.get("params", {})
        if not isinstance(params, dict):
            raise WorkloadError("params must be an object")
        for k in ("window", "sites"):
            if k in params:
                raise WorkloadError("params.%s: the workload's window and clients set it" % k)
        self.params = protocol_params(SYSTEMS[self.protocol], params)
        try:
            SYSTEMS[self.protocol](win, sites=self.clients + 1, **self.params)
        except ValueError as e:
            raise WorkloadError("params: %s" % e)


class SummarySimulation(Loop):
    """Readings, reads and phase ends of one site tree, in time order; answers checked against the window."""
    ORDER = {DATA: 0, QUERY_EVENT: 1, PHASE: 2}

    def __init__(self, workload):
        self.w = w = workload if isinstance(workload, SummaryWorkload) else \
            SummaryWorkload(workload if isinstance(workload, dict) else read(workload))
        Loop.__init__(self)
        self.handlers.update({DATA: self.data, QUERY_EVENT: self.query, PHASE: self.phase_end})
        self.system = SYSTEMS[w.protocol](w.window, sites=w.clients + 1, **w.params)
        self.rng = random.Random(w.seed + 7)
        self.window = []            # the truth: the exact window, newest first
        self.msgs0 = self.up0 = None
        self.stats = {"queries": 0, "answered": 0, "local": 0, "violations": 0, "rel_err": 0.0, "abs_err": 0.0,
                      "bound": 0.0, "precision_misses": 0, "range_sure": 0, "range_maybe": 0, "range_exact": 0}

    def start(self):
        w = self.w
        values = stream(w.generator, int(w.duration / w.interval) + 2, w.seed)
        for j in range(int(w.duration / w.interval) + 1):
            self.push(j * w.interval, DATA, values[j])
        for q in w.queries:
            rate = float(q.get("rate", 1.0))
            for c in (range(1, w.clients + 1) if q.get("client", "all") == "all" else [q["client"]]):
                t = self.rng.uniform(0, 1.0 / rate)
                while t <= w.duration:
                    self.push(t, QUERY_EVENT, (c, q))
                    t += 1.0 / rate
        for j in range(1, int(w.duration / w.phase) + 1):
            self.push(j * w.phase, PHASE, None)

    def _warm(self, t):
        if self.msgs0 is None and t >= self.w.warmup:
            self.msgs0, self.up0 = self.system.msgs, self.system.uplink

    def data(self, t, value):
        self._warm(t)
        self.window.insert(0, value)
        if len(self.window) > self.w.window:
            self.window.pop()
        self.system.on_data(t, value)

    def phase_end(self, t, _):
        self._warm(t)
        self.system.on_phase(t)

    def query(self, t, data):
        self._warm(t)
        c, q = data
        win, st = self.window, self.stats
        if len(win) < self.w.window:
            return
        qw = q.get("window", "random")
        if qw == "random":
            a = self.rng.randrange(self.w.window)
            b = self.rng.randrange(a, self.w.window)
        else:
            a, b = qw
        kind = q.get("type", "inner")
        positions = list(range(a, b + 1)) if kind != "point" else [a]
        ws = weights_for(q.get("weights", "linear"), len(positions)) if kind == "inner" else [1.0] * len(positions)
        prec = float(q.get("precision", 1.0)) * sum(abs(x) for x in ws)
        warm = t >= self.w.warmup
        if kind == "range":
            # a range query needs each reading within radius: ask for every one at that precision
            ans = [self.system.on_query(t, c, [i], [1.0], prec) for i in positions]
            if not warm or None in ans:
                return
            p, r = float(q.get("value", 0.0)) or sum(win) / len(win), float(q.get("radius", 1.0))
            exact = [i for i in positions if p - r <= win[i] <= p + r]
            sure = [i for i, x in zip(positions, ans) if p - r <= x["lo"] and x["hi"] <= p + r]
            maybe = [i for i, x in zip(positions, ans) if x["lo"] <= p + r and x["hi"] >= p - r]
            st["queries"] += 1
            st["answered"] += 1
            st["local"] += all(x["local"] for x in ans)
            st["violations"] += (not set(sure) <= set(exact)) + (not set(exact) <= set(maybe))
            st["range_sure"] += len(sure)
            st["range_maybe"] += len(maybe)
            st["range_exact"] += len(exact)
            self._answer(t, q, c, {"lo": float(len(sure)), "hi": float(len(maybe)), "exact": float(len(exact))})
            return
        ans = self.system.on_query(t, c, positions, ws, prec)
        if not warm:
            return
        st["queries"] += 1
        if ans is None:
            return
        exact = sum(wt * win[i] for i, wt in zip(positions, ws))
        st["answered"] += 1
        st["local"] += ans["local"]
        if not ans["lo"] - 1e-6 * (1 + abs(exact)) <= exact <= ans["hi"] + 1e-6 * (1 + abs(exact)):
            st["violations"] += 1
        err = abs(ans["estimate"] - exact)
        st["abs_err"] += err
        st["rel_err"] += err / abs(exact) if exact else 0.0
        st["bound"] += ans["hi"] - ans["lo"]
        st["precision_misses"] += (ans["hi"] - ans["lo"]) > prec + 1e-9
        self._answer(t, q, c, dict(ans, exact=exact))

    def _answer(self, t, q, client, fields):
        self.answers.append(dict(fields, time=t, query=q.get("id"), client=client, degraded=False))

    def result(self, elapsed):
        w, st, system = self.w, self.stats, self.system
        n = max(st["answered"], 1)
        return {"kind": "summary", "protocol": w.protocol, "window": w.window, "clients": w.clients,
                "messages": system.msgs - (self.msgs0 or 0), "uplink_messages": system.uplink - (self.up0 or 0),
                "bytes_up": getattr(system, "bytes_up", None),
                "queries": st["queries"], "answered_locally": st["local"] / n,
                "violations": st["violations"], "precision_misses": st["precision_misses"],
                "mean_rel_error": st["rel_err"] / n, "mean_abs_error": st["abs_err"] / n,
                "mean_bound_width": st["bound"] / n,
                "cached_approximations": system.cached() if hasattr(system, "cached") else None,
                "runtime_s": elapsed}
