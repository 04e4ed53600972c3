"""Query-aware slack for MIN/MAX (Olston et al. 2003 App. A) through Cheng et al. 2005 §3 constraints: cuts.

App. A shows that a source far from the extreme cannot simply get a wide bound: if the extreme then
drops, that bound becomes the answer's and the precision δ is broken for a round trip. A *cut* keeps
the precision on the device instead. For a MAX query with answer [L, H] (L = max lo) a source whose
bound lies well below L gets no width and the constraints ``(-inf, c + k·δ)``, k < RUNGS (MIN:
mirrored): it stays silent while below c, where the backend knows it as ``(-inf, c]``, and reports
only when it crosses a rung (then known within [c + k·δ, c + (k+1)·δ]). Such a source can only affect
the answer once it could become the extreme, which is exactly when it reports.

- **Demote** a source when its known bound ends ``(reach + 1)·δ`` inside every MIN/MAX query it is in:
  cut c = L − reach·δ in each (one downlink, and the acknowledging report: the old bound stays in force
  until the device has it). Only sources in no SUM/AVG query, and all of a source's queries at once:
  a source that keeps a width for one query would save nothing by a cut in another.
- **Re-cut** when L drops so that L − c < (reach − 1)·δ: c := L − reach·δ again (the acknowledging
  report tells the value; a source found above the new cut is promoted).
- **Promote** a source that reports above one of its cuts: back to an ordinary bound (width ≤ δ).

Precision: an out-source's bound ends at most at c + 2δ (top rung), or c + 2.5δ while its promotion
to a width-δ bound is unconfirmed; the answer is [L, max hi], so it stays within δ while L − c ≥ 1.5δ:
unless L falls by more than (reach − 2.5)·δ within one round trip, or a source climbs past the top
rung before its promotion arrives (the answer then says so by an unbounded side, never by a wrong one).
Containment never depends on any of this: the backend mirrors the device's filter exactly.
"""
import math

from backend.coordinator.core import aggregate

INF = math.inf
REACH = 4.0         # cuts sit this many δ beyond the answer's inner end (L for MAX, H for MIN)
RUNGS = 3           # constraints c, c ± δ, c ± 2δ: how far a rising source stays bounded while promoted


class Cuts:
    """The out-sources of every MIN/MAX query and their cuts: {(query id, key): c}."""

    def __init__(self, reach=REACH, stats=None):
        if isinstance(reach, bool) or not isinstance(reach, (int, float)) or not reach >= 2:
            raise ValueError("reach must be a number >= 2, got %r" % (reach,))
        self.reach = float(reach)
        self.cut = {}           # (qid, key) -> cut, in insertion order
        self.prec = {}          # qid -> precision the cuts were made for
        self.edge = {}          # qid -> its innermost cut (or one beyond it), so most reports skip the re-cut scan
        self.stats = {} if stats is None else stats        # counters, in the protocol's stats when given
        self.stats.update({"demoted": 0, "recut": 0, "promoted": 0})

    def reset(self, coord):
        """Drop the cuts of queries that are gone or whose precision or sources changed."""
        qs = coord.queries
        keep = {qid for qid, q in qs.items() if q.kind in ("min", "max") and self.prec.get(qid) == q.precision}
        self.cut = {p: c for p, c in self.cut.items() if p[0] in keep and p[1] in qs[p[0]].weights}
        self.prec = {qid: q.precision for qid, q in qs.items() if q.kind in ("min", "max")}
        self.edge = {qid: e for qid, e in self.edge.items() if qid in keep}

    def constraints(self, coord, key):
        """The rung constraints of ``key``'s cuts, in query order."""
        out = []
        for qid in sorted(coord.by_source.get(key, ())):
            c = self.cut.get((qid, key))
            if c is not None:
                d = coord.queries[qid].precision
                if coord.queries[qid].kind == "max":
                    out += [(-INF, c + k * d) for k in range(RUNGS)]
                else:
                    out += [(c - k * d, INF) for k in range(RUNGS)]
        return out

    def silent(self, coord, key):
        """Whether ``key`` needs no width: out of every MIN/MAX query it is in, and in no SUM/AVG row."""
        qids = coord.by_source.get(key, ())
        out = False
        for qid in qids:
            q = coord.queries[qid]
            if q.kind in ("min", "max"):
                if (qid, key) not in self.cut:
                    return False
                out = True
            elif q.kind in ("sum", "avg"):
                return False
        return out

    def reported(self, coord, key, v):
        """A report of ``key`` (value ``v``) was applied: the keys whose cuts changed, in order.

        A source's cuts go together: it is out of all its MIN/MAX queries (silent) or of none, since a
        source still in one keeps its width and a cut for another would only cost messages."""
        changed = {}
        qids = [qid for qid in sorted(coord.by_source.get(key, ())) if coord.queries[qid].kind in ("min", "max")]
        if not qids:
            return []
        # a source that a SUM/AVG query needs keeps a width anyway: no cut (but its reports move the extremes)
        free = not any(coord.queries[qid].kind in ("sum", "avg") for qid in coord.by_source[key])
        free = free and key not in coord.segments.mode      # a segment's band is its width (App. A: W ≤ δ)
        ends = {qid: self._inner(coord, coord.queries[qid]) for qid in qids}
        if free and (qids[0], key) in self.cut:
            if any(_side(coord.queries[qid]) * (v - self.cut[(qid, key)]) > 0 for qid in qids):
                for qid in qids:        # it could become an extreme: an ordinary bound again
                    del self.cut[(qid, key)]
                self.stats["promoted"] += 1
                changed[key] = None
        elif free and all(ends[qid] is not None for qid in qids):
            a, b = coord.cache.known(key)
            far = True
            for qid in qids:
                q = coord.queries[qid]
                s = _side(q)
                near = b if s > 0 else a            # the end of key's bound that faces the extreme
                far = far and q.precision > 0 and s * (ends[qid] - near) >= (self.reach + 1.0) * q.precision
            if far:
                for qid in qids:
                    self._set(coord.queries[qid], key, ends[qid])
                self.stats["demoted"] += 1
                changed[key] = None
        for qid in qids:
            q, inner = coord.queries[qid], ends[qid]
            s, d = _side(q), q.precision
            e = self.edge.get(qid)
            if inner is None or e is None or s * (inner - e) >= (self.reach - 1.0) * d:
                continue
            # the inner end moved towards the cuts: re-cut those too close, find the new innermost
            self.edge[qid] = None
            for p, c in list(self.cut.items()):
                if p[0] != qid:
                    continue
                if s * (inner - c) < (self.reach - 1.0) * d:
                    self.stats["recut"] += 1
                    changed[p[1]] = None
                    c = inner - s * self.reach * d
                self._set(q, p[1], inner, c)
        return list(changed)

    def _inner(self, coord, q):
        """The answer's end that cuts are measured from: L = max lo (MAX), H = min hi (MIN); None if unbounded."""
        lo, hi = aggregate.answer(q, coord.cache.known)
        x = lo if q.kind == "max" else hi
        return x if math.isfinite(x) else None

    def _set(self, q, key, inner, c=None):
        s = _side(q)
        c = self.cut[(q.id, key)] = inner - s * self.reach * q.precision if c is None else c
        e = self.edge.get(q.id)
        self.edge[q.id] = c if e is None else s * max(s * e, s * c)


def _side(q):
    return 1.0 if q.kind == "max" else -1.0
