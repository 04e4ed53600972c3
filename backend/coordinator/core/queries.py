"""Continuous query specs (Olston et al. 2003 §3, App. B): kind, query set, weights, precision δ."""
import math

AGGREGATES = ("sum", "avg", "min", "max", "count")
ENTITIES = ("range", "knn")                       # Cheng et al. 2005 §2
SUMMARY_TYPES = ("point", "inner", "range")          # Bulut & Singh 2003 §2.5
SUMMARY_WEIGHTS = ("linear", "exponential", "uniform")


class QueryError(ValueError):
    """A query spec that cannot be registered; the message says what is wrong."""


class Query:
    __slots__ = ("id", "kind", "sources", "weights", "precision", "range", "extra", "_norm", "reserve")

    def __init__(self, qid, kind, sources, weights, precision, rng=None, extra=None):
        self.id = qid
        self.kind = kind
        self.sources = sources          # list of source keys, in spec order
        self.weights = weights          # dict key -> weight K (1 when absent)
        self.precision = precision      # δ: maximum answer width
        self.range = rng                # (a, b) for count-in-range, else None
        self.extra = extra or {}        # protocol-specific fields (tolerances, k, point, ...)
        self._norm = None
        self.reserve = 0.0              # of δ kept off the widths for clock skew (coordinator.core.reserve)

    def budget(self):
        """The precision the widths of the query's sources are allocated from: δ less the reserve."""
        return max(0.0, self.precision - self.reserve)

    def norm(self):
        """Σ|K| over the query's sources, summed once (uniform widths ask for it at every birth)."""
        n = self._norm
        if n is None:
            n = self._norm = math.fsum(abs(w) for w in self.weights.values())
        return n

    def among(self, keys):
        """The query's sources in ``keys`` (a set or dict), looked up from the smaller side: in the
        order of ``keys`` or of the query, whichever is shorter (a generator)."""
        if len(keys) < len(self.weights):
            return (s for s in keys if s in self.weights)
        return (s for s in self.sources if s in keys)

    def meets(self, keys):
        """Whether any source in ``keys`` is one of the query's."""
        return bool(keys) and any(True for _ in self.among(keys))

    def spec(self):
        d = {"id": self.id, "kind": self.kind, "sources": list(self.sources), "precision": self.precision}
        if any(w != 1 for w in self.weights.values()):
            d["weights"] = [self.weights[s] for s in self.sources]
        if self.range is not None:
            d["range"] = list(self.range)
        d.update(self.extra)
        return d


def _number(v, what, qid):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise QueryError("query %s: %s must be a finite number, got %r" % (qid, what, v))
    return float(v)


def parse_query(spec, all_sources, kinds=AGGREGATES, known=None):
    """Validate a query dict from a workload file or a spec topic; return a Query.

    ``all_sources`` is ordered: ``"sources": "all"`` expands in that order (weights follow it). With
    ``known`` (a container of every source) it may be a function giving them, called only for ``"all"``,
    so a query naming its sources costs its own size, not the fleet's."""
    if known is None:
        all_sources = list(all_sources)
        known = set(all_sources)
    known_sources = known
    if not isinstance(spec, dict):
        raise QueryError("a query must be an object, got %r" % (spec,))
    qid = spec.get("id")
    if not isinstance(qid, str) or not qid or "/" in qid or "+" in qid or "#" in qid:
        raise QueryError("query id must be a non-empty string without '/', '+' or '#', got %r" % (qid,))
    kind = spec.get("kind")
    if kind not in kinds:
        raise QueryError("query %s: kind must be one of %s, got %r" % (qid, ", ".join(kinds), kind))
    srcs = spec.get("sources", "all")
    if srcs == "all":
        srcs = list(all_sources() if callable(all_sources) else all_sources)
    if not isinstance(srcs, list) or not srcs or not all(isinstance(s, str) for s in srcs):
        raise QueryError("query %s: sources must be \"all\" or a non-empty list of source ids" % qid)
    if len(set(srcs)) != len(srcs):
        raise QueryError("query %s: sources repeat" % qid)
    unknown = [s for s in srcs if s not in known_sources]
    if unknown:
        raise QueryError("query %s: unknown sources %s" % (qid, ", ".join(unknown[:5])))
    weights = {s: 1.0 for s in srcs}
    if "weights" in spec and kind != "summary":     # a summary query weighs window positions
        ws = spec["weights"]
        if kind not in ("sum", "avg"):
            raise QueryError("query %s: weights apply to sum and avg only" % qid)
        if not isinstance(ws, list) or len(ws) != len(srcs):
            raise QueryError("query %s: weights must be a list as long as sources" % qid)
        for s, w in zip(srcs, ws):
            weights[s] = _number(w, "weight", qid)
            if weights[s] == 0:
                raise QueryError("query %s: a weight of 0 — leave the source out instead" % qid)
    precision = _number(spec.get("precision", 0.0), "precision", qid)
    if precision < 0:
        raise QueryError("query %s: precision must be >= 0" % qid)
    rng = None
    if kind in ("count", "range") and "range" in spec:
        r = spec["range"]
        if not isinstance(r, list) or len(r) != 2:
            raise QueryError("query %s: range must be [a, b]" % qid)
        a, b = _number(r[0], "range", qid), _number(r[1], "range", qid)
        if b < a:
            raise QueryError("query %s: range [a, b] needs a <= b" % qid)
        rng = (a, b)
    if "confidence" in spec:
        p = _number(spec["confidence"], "confidence", qid)
        if not 0 < p < 1:
            raise QueryError("query %s: confidence must be a probability in (0, 1), got %r" % (qid, p))
    if "lag" in spec or "segment" in spec:
        _check_lag(qid, kind, spec)
    known = {"id", "kind", "sources", "weights", "precision", "range"} - ({"weights"} if kind == "summary" else set())
    extra = {k: v for k, v in spec.items() if k not in known}
    q = Query(qid, kind, srcs, weights, precision, rng, extra)
    if kind in ("range", "knn"):
        _check_entity(q)
    if kind == "summary":
        _check_summary(q)
    return q


def _tol(q, name):
    v = q.extra.get(name, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0.0 <= v < 0.5):
        raise QueryError("query %s: %s must be a number in [0, 0.5), got %r" % (q.id, name, v))
    return float(v)


def _check_entity(q):
    """Check an entity query and normalise its fields in ``q.extra`` (raises QueryError)."""
    x = q.extra
    if q.kind == "range":
        if q.range is None:
            raise QueryError("query %s: a range query needs \"range\": [l, u]" % q.id)
        for bad in ("k", "point", "rank_tolerance"):
            if bad in x:
                raise QueryError("query %s: %s applies to knn queries only" % (q.id, bad))
    else:
        k = x.get("k")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < len(q.sources):
            raise QueryError("query %s: k must be an integer in 1..%d (fewer than the sources), got %r"
                             % (q.id, len(q.sources) - 1, k))
        p = x.get("point")
        if isinstance(p, str) and p.strip().lower() in ("-inf", "inf", "+inf"):
            p = -math.inf if p.strip().startswith("-") else math.inf
        if isinstance(p, bool) or not isinstance(p, (int, float)) or p != p:
            raise QueryError("query %s: point must be a number, \"-inf\" (k-min) or \"inf\" (k-max), got %r"
                             % (q.id, x.get("point")))
        x["point"] = float(p)
        r = x.get("rank_tolerance", 0)
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or k + r >= len(q.sources):
            raise QueryError("query %s: rank_tolerance must be an integer >= 0 with k + r < %d sources, got %r"
                             % (q.id, len(q.sources), r))
        if "rank_tolerance" in x and ("fp_tolerance" in x or "fn_tolerance" in x):
            raise QueryError("query %s: state either rank_tolerance or fp/fn tolerances, not both" % q.id)
    _tol(q, "fp_tolerance")
    _tol(q, "fn_tolerance")


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_summary(q):
    """Check a summary query's own fields (QueryError names the one at fault)."""
    x = q.extra
    if len(q.sources) != 1:
        raise QueryError("query %s: a summary query reads exactly one source" % q.id)
    if x.get("type", "inner") not in SUMMARY_TYPES:
        raise QueryError("query %s: type must be one of %s" % (q.id, ", ".join(SUMMARY_TYPES)))
    w = x.get("window", "random")
    if w != "random" and not (isinstance(w, list) and len(w) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                       for i in w) and 0 <= w[0] <= w[1]):
        raise QueryError("query %s: window must be \"random\" or [first, last] positions, 0 <= first <= last" % q.id)
    ws = x.get("weights", "linear")
    if isinstance(ws, list):
        if w == "random" or len(ws) != w[1] - w[0] + 1 or not all(finite(v) for v in ws):
            raise QueryError("query %s: a weights list needs a fixed window and one number per position" % q.id)
    elif ws not in SUMMARY_WEIGHTS:
        raise QueryError("query %s: weights must be one of %s or a list" % (q.id, ", ".join(SUMMARY_WEIGHTS)))
    if x.get("type", "inner") == "range" and not (finite(x.get("value")) and finite(x.get("radius", 1.0))
                                                  and x.get("radius", 1.0) >= 0):
        raise QueryError("query %s: a range summary needs a numeric value and radius >= 0" % q.id)
    every = x.get("every", 1)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise QueryError("query %s: every must be an integer >= 1 (ticks between reads)" % q.id)


def _check_lag(qid, kind, spec):
    """``lag`` seconds > 0 on an aggregate query (final answers by t + L; SUM, AVG, MIN, MAX put their sources in
    segment mode, backend/coordinator/core/segments.py), ``segment`` ``line`` (default) or ``constant``."""
    if "lag" not in spec:
        raise QueryError("query %s: segment applies to queries with a lag only" % qid)
    lag = _number(spec["lag"], "lag", qid)
    if lag <= 0:
        raise QueryError("query %s: lag must be > 0 seconds, got %r" % (qid, spec["lag"]))
    if kind in ENTITIES:
        raise QueryError("query %s: lag does not apply to %s queries: their tolerance (Cheng et al. 2005 §3) is "
                         "kept by filters that report a crossing at once, which a segment of width W sent up to L "
                         "later cannot decide; they answer in real time" % (qid, kind))
    if kind not in AGGREGATES:
        raise QueryError("query %s: lag applies to aggregate queries (%s), not %s" % (qid, ", ".join(AGGREGATES), kind))
    if "segment" in spec and kind == "count":
        raise QueryError("query %s: segment applies to sum, avg, min and max: a count's sources keep reporting "
                         "membership changes" % qid)
    if spec.get("segment", "line") not in ("line", "constant"):
        raise QueryError("query %s: segment must be \"line\" or \"constant\", got %r" % (qid, spec["segment"]))
