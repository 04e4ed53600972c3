"""Continuous query specs (Olston et al. 2003 §3, App. B): kind, query set, weights, precision δ."""
import math

AGGREGATES = ("sum", "avg", "min", "max", "count")


class QueryError(ValueError):
    """A query spec that cannot be registered; the message says what is wrong."""


class Query:
    __slots__ = ("id", "kind", "sources", "weights", "precision", "range", "extra")

    def __init__(self, qid, kind, sources, weights, precision, rng=None, extra=None):
        self.id = qid
        self.kind = kind
        self.sources = sources          # list of source keys, in spec order
        self.weights = weights          # dict key -> weight K (1 when absent)
        self.precision = precision      # δ: maximum answer width
        self.range = rng                # (a, b) for count-in-range, else None
        self.extra = extra or {}        # protocol-specific fields (tolerances, k, point, ...)

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


def parse_query(spec, all_sources, kinds=AGGREGATES):
    """Validate a query dict from a workload file or a spec topic; return a Query.

    ``all_sources`` is ordered: ``"sources": "all"`` expands in that order (weights follow it)."""
    all_sources = list(all_sources)
    known_sources = set(all_sources)
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
        srcs = list(all_sources)
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
    known = {"id", "kind", "sources", "weights", "precision", "range"} - ({"weights"} if kind == "summary" else set())
    extra = {k: v for k, v in spec.items() if k not in known}
    q = Query(qid, kind, srcs, weights, precision, rng, extra)
    if kind in ("range", "knn"):
        from backend.coordinator.entity import validate
        validate(q)
    if kind == "summary":
        from backend.coordinator.replication import validate
        validate(q)
    return q
