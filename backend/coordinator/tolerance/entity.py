"""Entity queries with non-value tolerance (Cheng et al. 2005 §3): range / k-NN specs, probes, answers.

Shared machinery of the entity protocols (``fraction``, ``rank``) and the paper's no-filter baseline:

* ``core.queries`` checks a ``range`` or ``knn`` query and normalises its fields in ``q.extra``:
  ``k``, ``point`` (a number, or ``"-inf"``/``"inf"`` for k-min/k-max), ``rank_tolerance`` (r),
  ``fp_tolerance`` (ε+) and ``fn_tolerance`` (ε−), each tolerance in [0, 0.5).
* ``EntityProtocol`` keeps one state object per query, installs the union of the queries'
  constraints on every source (unacknowledged filters: a device reports only a membership change),
  and runs probe rounds as an asynchronous state machine: a query with probes outstanding defers the
  reports that reach it and replays them, in order, once every reply is in. With zero network delay
  the replies arrive at the same instant, which is the paper's synchronous model; with any delay the
  answers are flagged ``degraded`` (the paper's guarantees assume instantaneous reports and probes).
"""
import bisect
import math
import random

from backend.coordinator.core.protocol import Protocol
from backend.coordinator.core.queries import ENTITIES

INF = math.inf
FP_FILTER = (-INF, INF)     # always inside: the stream is silent and counted in the answer
FN_FILTER = (INF, INF)      # never inside: the stream is silent and left out of the answer



def tolerances(q):
    """(ε+, ε−) of a validated query."""
    return float(q.extra.get("fp_tolerance", 0.0)), float(q.extra.get("fn_tolerance", 0.0))


def keyfn(point):
    """Ranking score of a value for query point q: |v − q|; v for k-min (q = −∞), −v for k-max."""
    if point == -INF:
        return lambda v: v
    if point == INF:
        return lambda v: -v
    return lambda v: abs(v - point)


def region(point, d):
    """The interval of values whose score is at most ``d`` (the k-NN bound R of §4, §5.2)."""
    if point == -INF:
        return (-INF, d)
    if point == INF:
        return (-d, INF)
    return (point - d, point + d)


def inside(c, v):
    return c[0] <= v <= c[1]


class QueryState:
    """Per-query protocol state; subclasses implement ``init`` and ``update``."""

    def __init__(self, proto, q):
        self.proto = proto
        self.q = q
        self.keys = list(q.sources)
        self.A = set()            # the answer set
        self.ready = False
        self.missing = None       # sources without a first value (before initialisation)
        self.waiting = set()      # probe ids outstanding
        self.then = None          # continuation once every reply is in
        self.backlog = []         # reports deferred while probes are outstanding

    def value(self, coord, key):
        return coord.cache.sources[key].value

    def busy(self):
        return bool(self.waiting) or self.then is not None

    def probe(self, coord, keys, then):
        """Probe ``keys`` (a real downlink each) and call ``then(coord)`` once all replies are in."""
        self.then = then
        for key in keys:
            self.waiting.add(self.proto.send_probe(coord, self, key))
        if not self.waiting:
            self._done(coord)

    def replied(self, coord, pid):
        self.waiting.discard(pid)
        if not self.waiting and self.then is not None:
            self._done(coord)

    def _done(self, coord):
        then, self.then = self.then, None
        then(coord)
        while not self.busy() and self.backlog:
            self.update(coord, self.backlog.pop(0))

    def reported(self, coord, key):
        if not self.ready:
            if self.missing is not None:
                self.missing.discard(key)
                if not self.missing:
                    self.missing = None
                    self.init(coord)
            return
        if self.busy():
            self.backlog.append(key)
        else:
            self.update(coord, key)

    def constrain(self, coord, key, c):
        self.proto.constrain(coord, key, self.q.id, c)

    def members(self):
        return self.A


class EntityProtocol(Protocol):
    """Base of the entity protocols: per-query states, constraint union per source, probe routing."""
    kinds = ENTITIES
    State = QueryState

    def __init__(self, choice="boundary", seed=0):
        if choice not in ("boundary", "random"):
            raise ValueError("choice must be boundary (boundary-nearest) or random, got %r" % (choice,))
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed must be an integer, got %r" % (seed,))
        self.choice = choice
        self.rng = random.Random(seed)
        self.states = {}          # query id -> QueryState
        self.cons = {}            # source key -> {query id: (l, u)}
        self.pending = {}         # probe id -> (query id, key)
        self.next_pid = 0
        self.stats = {"probes": 0, "filters": 0, "resolutions": 0}

    # -- coordinator hooks ------------------------------------------------------------
    def source_added(self, coord, key):
        pass      # devices report every reading (width 0) until a query installs its filter

    def resync(self, coord, key, want):
        self.install(coord, key, force=True)
        if coord.cache.sources[key].value is not None:     # the birth's value is news, like a report
            self.reported(coord, key, {})

    def queries_changed(self, coord, now):
        for qid in list(self.states):
            if qid not in coord.queries:
                del self.states[qid]
                for key, per in self.cons.items():
                    if per.pop(qid, None) is not None:
                        self.install(coord, key)
        for qid, q in coord.queries.items():
            if qid not in self.states and q.kind in self.kinds:
                st = self.states[qid] = self.State(self, q)
                st.missing = {k for k in st.keys if k not in coord.cache.sources
                              or coord.cache.sources[k].value is None}
                if not st.missing:
                    st.missing = None
                    st.init(coord)

    def reported(self, coord, key, m):
        if "probe" in m:
            hit = self.pending.pop(m["probe"], None)
            if hit is not None and hit[1] == key:
                st = self.states.get(hit[0])
                if st is not None:
                    st.replied(coord, m["probe"])
                return
        for qid in sorted(coord.by_source.get(key, ())):
            st = self.states.get(qid)
            if st is not None:
                st.reported(coord, key)

    def answer(self, coord, q):
        st = self.states.get(q.id)
        why = ("no state for the query" if st is None else "waiting for a first value of every source"
               if not st.ready else "probe replies outstanding" if st.busy() else
               "network delay: the tolerance assumes instantaneous reports and probes (§3)"
               if coord.latency > 0 else
               "a source lost its value (rebooted)" if any(coord.cache.sources[k].filt.center is None
                                                           for k in q.sources if k in coord.cache.sources)
               else None)
        out = {"members": sorted(st.members()) if st is not None else [], "degraded": why is not None}
        if why is not None:
            out["reason"] = why
        return out

    def target(self, coord, key):
        per = self.cons.get(key, {})
        cons = []
        for qid in sorted(per):
            if per[qid] not in cons:
                cons.append(per[qid])
        return INF, cons

    # -- helpers for states -----------------------------------------------------------
    def send_probe(self, coord, st, key):
        self.next_pid = (self.next_pid + 1) & 0xFFFF
        self.pending[self.next_pid] = (st.q.id, key)
        self.stats["probes"] += 1
        coord.probe(key, self.next_pid)
        return self.next_pid

    def constrain(self, coord, key, qid, c):
        self.cons.setdefault(key, {})[qid] = c
        self.install(coord, key)

    def install(self, coord, key, force=False):
        width, cons = self.target(coord, key)
        f = coord.cache.sources[key].filt
        if force or cons != f.cons or f._r(width) != f.width:
            self.stats["filters"] += 1
            coord.assign_filter(key, width, cons, ack=0)

    def pick(self, keys, count, near):
        """``count`` of ``keys``: at random, or those with the smallest ``near(key)`` (boundary-nearest)."""
        keys = sorted(keys)
        if count <= 0:
            return []
        if self.choice == "random":
            return self.rng.sample(keys, min(count, len(keys)))
        return sorted(keys, key=near)[:count]


class _ExactState(QueryState):
    """No-filter baseline: every reading is reported and the answer is exact."""

    def init(self, coord):
        q = self.q
        self.ready = True
        if q.kind == "range":
            for key in self.keys:
                if inside(q.range, self.value(coord, key)):
                    self.A.add(key)
            return
        self.key = keyfn(q.extra["point"])
        self.order = sorted((self.key(self.value(coord, k)), k) for k in self.keys)
        self.score = {k: s for s, k in self.order}

    def update(self, coord, key):
        v = self.value(coord, key)
        if self.q.kind == "range":
            if inside(self.q.range, v):
                self.A.add(key)
            else:
                self.A.discard(key)
            return
        old = self.score[key]
        del self.order[bisect.bisect_left(self.order, (old, key))]
        self.score[key] = s = self.key(v)
        bisect.insort(self.order, (s, key))

    def members(self):
        if self.q.kind == "range" or not self.ready:
            return self.A
        return [k for _, k in self.order[:self.q.extra["k"]]]


class NoFilter(EntityProtocol):
    """The paper's "no filter" baseline (§6): every update is sent; exact answers."""
    name = "nofilter"
    State = _ExactState

    def target(self, coord, key):
        return 0.0, []


PROTOCOLS = {"nofilter": NoFilter}
