"""Central processing of relay bodies (Zhang et al. 2005 §5, Theorems 1-3): COUNT/SUM and window joins with bounds.

Relays are devices whose single source is named after the relay. The protocol sends each relay the
querying-metadata (``moq``: window, aggregate, requested relative error η) and receives raw items,
forecast bodies and correct bodies as ``blob`` messages. A lifetime (tb, te] is closed by its last
correct-body message, which carries the correct-factor δ the relay used; from then on each forecast
body k is known exactly (corrected) or within ``f_e/(1+δ) <= f_r <= f_e/(1-δ)`` (constraint (1)).

Queries: ``count`` (optionally ``range`` [a, b], the select operator of §5.1), ``sum`` and ``join``
(two sources, equi-join on the item with sliding window ``span`` T, §5.2), all over ``window``
[tb, te] meaning timestamps tb < t <= te (default [0, inf]) and ``error`` η (default 0.01) for the
relays' δ. Times are the relay's own stamps: it aligns its lifetimes to the window in its clock, and a
body names its lifetime by them, so the clock placement of reports (``offsets.py``) does not apply (with
σ > 0 it moved the forecast bodies' keys off their correct bodies' and dropped them). Answers cover (tb, through] where ``through`` is the latest time every queried relay has
closed: ``{"estimate", "lo", "hi", "error_bound", "through", "final", "aligned"}`` with the exact
answer always in [lo, hi]; ``aligned`` says no lifetime straddles the window, so Theorems 1-2 bound
the estimate's relative error by η. Join estimates use the uniform-density integral of Theorem 3.
"""
import bisect
import math

from edge.core import codec
from edge.core import relay as body
from backend.coordinator.core.admission import BAD
from backend.coordinator.core.protocol import Protocol
from backend.coordinator.core.queries import QueryError

INF = math.inf


class RelayLog:
    """What the backend knows of one relay: raw items and closed lifetimes with their bodies."""

    def __init__(self):
        self.raw_t = []
        self.raw_k = []
        self.sorted_n = 0
        self.forecast = {}              # tb -> {k: f_e} of the lifetime starting at tb
        self.pending = {}               # te -> [tb, δ, {k: diff}] while correct bodies arrive
        self.closed = []                # [(tb, te, [(k, estimate, lo, hi)])] in time order
        self.through = -INF

    def raw(self):
        if self.sorted_n != len(self.raw_t):
            order = sorted(range(len(self.raw_t)), key=self.raw_t.__getitem__)
            self.raw_t = [self.raw_t[i] for i in order]
            self.raw_k = [self.raw_k[i] for i in order]
            self.sorted_n = len(self.raw_t)
        return self.raw_t, self.raw_k

    def close(self, tb, te, delta, corr):
        fc = self.forecast.pop(tb, {})
        bodies = []
        for k, fe in sorted(fc.items()):
            if k in corr:
                f = fe + corr[k]
                bodies.append((k, f, f, f))
            else:
                lo = max(0, math.ceil(fe / (1 + delta) - 1e-9))
                hi = math.floor(fe / (1 - delta) + 1e-9) if delta < 1 else INF
                bodies.append((k, fe, lo, hi))
        self.closed.append((tb, te, bodies))
        self.through = max(self.through, te)


def _clip(tb, te, qb, qe):
    """Fraction of lifetime (tb, te] inside (qb, qe], and whether it lies wholly inside or outside."""
    a, b = max(tb, qb), min(te, qe)
    if b <= a:
        return 0.0, True
    if a == tb and b == te:
        return 1.0, True
    return (b - a) / (te - tb), False


def _overlap_integral(b1, e1, b2, e2, T):
    """∫_{x in [b1,e1]} |[x-T, x+T] ∩ [b2, e2]| dx, exact (the integrand is piecewise linear)."""
    def g(x):
        return max(0.0, min(x + T, e2) - max(x - T, b2))
    pts = sorted({b1, e1} | {p for p in (b2 - T, b2 + T, e2 - T, e2 + T) if b1 < p < e1})
    return sum((pts[i + 1] - pts[i]) * (g(pts[i]) + g(pts[i + 1])) / 2 for i in range(len(pts) - 1))


class RelayAggregate(Protocol):
    """The paper's method: relays send forecast and correct bodies instead of frequent items."""
    name = "relay"
    kinds = ("count", "sum", "join")
    finals = False      # its answers carry the relay's own "final" (the last window item counted)
    topology = "relay"
    relay_params = {}                   # what the relays of this protocol run (overrides)

    def __init__(self, **params):
        if params:
            raise ValueError("protocol %s takes no params (relay settings go under 'relays'), got %s"
                             % (self.name, ", ".join(sorted(params))))
        self.logs = {}                  # source key (relay name) -> RelayLog
        self.sent = {}                  # qid -> moq fields sent to relays
        self.bad = 0

    # -- controller: querying-metadata to relays -----------------------------------------
    @staticmethod
    def window(q):
        w = q.extra.get("window", [0, INF])
        if (not isinstance(w, list) or len(w) != 2 or
                not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w) or not w[0] <= w[1]):
            raise QueryError("query %s: window must be [tb, te] with tb <= te" % q.id)
        eta = q.extra.get("error", 0.01)
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0 <= eta < INF:
            raise QueryError("query %s: error (relative, η) must be a number >= 0" % q.id)
        if q.kind == "join":
            span = q.extra.get("span")
            if isinstance(span, bool) or not isinstance(span, (int, float)) or not 0 <= span < INF:
                raise QueryError("query %s: join needs span (the sliding window T) >= 0" % q.id)
            if len(q.sources) != 2:
                raise QueryError("query %s: join needs exactly two sources" % q.id)
        return float(w[0]), float(w[1]), float(eta)

    def _moq(self, q):
        tb, te, eta = self.window(q)
        return {"op": 1, "qid": q.id, "tb": tb, "te": te, "agg": 1 if q.kind == "sum" else 0, "eta": eta}

    def source_added(self, coord, key):
        self.logs.setdefault(key, RelayLog())
        self.resync(coord, key, None)

    def resync(self, coord, key, want):
        dev = coord.cache.sources[key].device
        for qid in sorted(self.sent):
            if key in coord.queries[qid].sources:
                coord.send(dev, "moq", dict(self.sent[qid]))

    def queries_changed(self, coord, now):
        want = {qid: self._moq(q) for qid, q in coord.queries.items()}
        for qid in sorted(set(self.sent) | set(want)):
            if self.sent.get(qid) == want.get(qid):
                continue
            q = coord.queries.get(qid)
            fields = want.get(qid) or {"op": 0, "qid": qid, "tb": 0.0, "te": 0.0, "agg": 0, "eta": 0.0}
            for key in sorted(coord.cache.sources):
                if q is None or key in q.sources:
                    coord.send(coord.cache.sources[key].device, "moq", dict(fields))
            if qid in want:
                self.sent[qid] = want[qid]
            else:
                del self.sent[qid]

    # -- bodies --------------------------------------------------------------------------------
    def blob(self, coord, device, m):
        keys = coord.devices[device]["keys"]
        try:
            b = body.decode_body(m["tag"], m["data"])
        except codec.CodecError:
            b = None
        if b is None or not keys:
            self.bad += 1
            coord.admission.note(coord.wall, device, BAD, "a blob that does not decode")
            return
        key = keys[0]
        log = self.logs.setdefault(key, RelayLog())
        t = m["stamp"]      # the relay's own clock, as the lifetimes' bounds inside the bodies (not placed by offsets)
        if b[0] == "raw":
            log.raw_t.append(t)
            log.raw_k.append(b[1])
        elif b[0] == "prb":
            log.forecast.setdefault(t, {}).update(dict(b[2]))
        else:
            _, tb, delta, last, recs = b
            p = log.pending.setdefault(t, [tb, delta, {}])
            p[2].update(dict(recs))
            if last:
                del log.pending[t]
                log.close(tb, t, delta, p[2])
                coord.dirty.update(coord.by_source.get(key, {}))

    # -- answers ---------------------------------------------------------------------------------
    def answer(self, coord, q):
        qb, qe, _ = self.window(q)
        logs = [self.logs.get(s) for s in q.sources]
        through = min((lg.through if lg is not None else -INF) for lg in logs)
        upto = min(qe, through)
        if upto <= qb:
            return {"estimate": 0.0, "lo": 0.0, "hi": 0.0, "error_bound": 0.0, "through": qb,
                    "final": False, "aligned": True}
        if q.kind == "join":
            est, lo, hi, aligned = self._join(logs, qb, upto, float(q.extra["span"]))
        else:
            est = lo = hi = 0.0
            aligned = True
            for lg in logs:
                e, l, h, a = self._aggregate(lg, q, qb, upto)
                est, lo, hi, aligned = est + e, lo + l, hi + h, aligned and a
        return {"estimate": est, "lo": lo, "hi": hi, "error_bound": max(hi - est, est - lo),
                "through": upto, "final": upto >= qe, "aligned": aligned}

    @staticmethod
    def _weight(q, k):
        if q.range is not None and not q.range[0] <= k <= q.range[1]:
            return 0
        return k if q.kind == "sum" else 1

    def _aggregate(self, lg, q, qb, upto):
        ts, ks = lg.raw()
        i, j = bisect.bisect_right(ts, qb), bisect.bisect_right(ts, upto)
        exact = float(sum(self._weight(q, k) for k in ks[i:j]))
        est, lo, hi, aligned = exact, exact, exact, True
        for tb, te, bodies in lg.closed:
            frac, whole = _clip(tb, te, qb, upto)
            if frac == 0.0 and whole:
                continue
            aligned = aligned and whole
            for k, f, flo, fhi in bodies:
                w = self._weight(q, k)
                if w:
                    est += w * f * frac
                    lo += w * flo if whole else 0.0
                    hi += w * fhi
        return est, lo, hi, aligned

    def _segments(self, lg, qb, upto):
        """Per item: raw timestamps and body segments (tb, te, estimate, lo, hi) clipped to (qb, upto]."""
        ts, ks = lg.raw()
        i, j = bisect.bisect_right(ts, qb), bisect.bisect_right(ts, upto)
        raw, segs = {}, {}
        for t, k in zip(ts[i:j], ks[i:j]):
            raw.setdefault(k, []).append(t)
        aligned = True
        for tb, te, bodies in lg.closed:
            frac, whole = _clip(tb, te, qb, upto)
            if frac == 0.0 and whole:
                continue
            aligned = aligned and whole
            a, b = max(tb, qb), min(te, upto)
            for k, f, flo, fhi in bodies:
                segs.setdefault(k, []).append((a, b, f * frac, flo if whole else 0, fhi))
        return raw, segs, aligned

    def _join(self, logs, qb, upto, T):
        if logs[0] is None or logs[1] is None:
            return 0.0, 0.0, 0.0, True
        ra, sa, al_a = self._segments(logs[0], qb, upto)
        rb, sb, al_b = self._segments(logs[1], qb, upto)
        est = lo = hi = 0.0
        for k in sorted(set(ra) | set(sa)):
            if k not in rb and k not in sb:
                continue
            ta, tb_ = ra.get(k, []), sorted(rb.get(k, []))
            # raw ⋈ raw: exact
            n = sum(bisect.bisect_right(tb_, t + T) - bisect.bisect_left(tb_, t - T) for t in ta)
            est, lo, hi = est + n, lo + n, hi + n
            # raw ⋈ body (Table 1) in both directions
            for times, segs in ((ta, sb.get(k, [])), (tb_, sa.get(k, []))):
                for t in times:
                    for b, e, f, flo, fhi in segs:
                        est += f * max(0.0, min(t + T, e) - max(t - T, b)) / (e - b)
                        if t - T <= b and e <= t + T:
                            lo += flo
                        if e >= t - T and b < t + T:
                            hi += fhi
            # body ⋈ body (Theorem 3)
            for b1, e1, f1, lo1, hi1 in sa.get(k, []):
                for b2, e2, f2, lo2, hi2 in sb.get(k, []):
                    est += _overlap_integral(b1, e1, b2, e2, T) * f1 * f2 / ((e1 - b1) * (e2 - b2))
                    if max(e2 - b1, e1 - b2) <= T:
                        lo += lo1 * lo2
                    if b2 < e1 + T and b1 < e2 + T:
                        hi += hi1 * hi2 if hi1 and hi2 else 0.0
        return est, lo, hi, al_a and al_b


class RelayForward(RelayAggregate):
    """Baseline: relays forward every raw item (no FDI), so every answer is exact."""
    name = "relay_forward"
    relay_params = {"fdi": 0}


PROTOCOLS = {"relay": RelayAggregate, "relay_forward": RelayForward}
