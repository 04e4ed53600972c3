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
  a source that keeps a width for one query would save nothing by a cut in another. Lag queries do not
  count (their sources' segments serve them, ``core/segments.py``): a source that a lagged AVG and a
  real-time MAX read is cut like one that only the MAX reads.
- **Re-cut** when L drops so that L − c < (reach − 1)·δ: c := L − reach·δ again (the acknowledging
  report tells the value; a source found above the new cut is promoted).
- **Promote** a source that reports above one of its cuts: back to an ordinary bound (width ≤ δ).
- **Only where cuts pay** (``Ledger``): a cut episode costs messages (the demotion and each re-cut: a
  control and its acknowledgement; the promotion: the report, a control and its acknowledgement; the
  device's segments that go alone while its reports do not carry them) and saves the reports the source
  would have sent meanwhile (its mean time between reports while it had a width). Where the extreme
  sweeps up and down through its sources (a daily cycle every source follows), episodes are short and
  re-cuts many, and cuts cost more than they save: a source is demoted only while the recent episodes of
  its queries (closed ones, and open ones once re-cut) saved at least what they cost at its report rate
  (optimistic while there are none: a fleet's first demotions come together, and each, just made, would
  stop the next). An open episode that stops paying is abandoned at its next re-cut, unless its queries'
  episodes would demote it again at once (four messages where the re-cut costs two, for the same cut).

Precision: an out-source's bound ends at most at c + 2δ (top rung), or c + 2.5δ while its promotion
to a width-δ bound is unconfirmed; the answer is [L, max hi], so it stays within δ while L − c ≥ 1.5δ:
unless L falls by more than (reach − 2.5)·δ within one round trip, or a source climbs past the top
rung before its promotion arrives (the answer then says so by an unbounded side, never by a wrong one).
Containment never depends on any of this: the backend mirrors the device's filter exactly.
"""
import math

from backend.coordinator.core import aggregate
from backend.coordinator.core.protocol import lagged
from edge.core.codec import WHY_EXIT, WHY_FIRST, WHY_RESYNC

INF = math.inf
REACH = 4.0         # cuts sit this many δ beyond the answer's inner end (L for MAX, H for MIN)
RUNGS = 3           # constraints c, c ± δ, c ± 2δ: how far a rising source stays bounded while promoted


class Ledger:
    """What cut episodes cost and last, per MIN/MAX query, and each source's time between reports uncut."""
    DECAY = 0.75            # weight of the older closed episodes at each new one

    def __init__(self):
        self.gap = {}       # key -> [mean time between its exit reports while uncut (None: unknown), last one]
        self.open = {}      # key -> [demoted at, messages so far, lone segment messages of its device then, qids]
        self.book = {}      # qid -> [episodes, their time, their messages] of closed episodes (decayed)
        self.live = {}      # qid -> [open episodes re-cut at least once, sum of their starts, their messages so far]

    def began(self, key, t):
        """``key``'s first reading (after a start or a reconnect) centred its filter at ``t``: its next exit
        ends a time between reports."""
        self.gap.setdefault(key, [None, None])[1] = t

    def exited(self, key, t):
        g = self.gap.setdefault(key, [None, None])
        if g[1] is not None and t >= g[1]:
            g[0] = t - g[1] if g[0] is None else 0.8 * g[0] + 0.2 * (t - g[1])
        g[1] = t

    def pays(self, key, qids, t, closing=None):
        """Whether cutting ``key`` out of ``qids`` at ``t`` should save more reports than it costs: at its time
        between reports, over the recent episodes of its queries (closed, or open and re-cut; optimistic before
        any, and only then while that time is not measured yet). ``closing``: (start, messages, cost) of ``key``'s open episode, judged as if it had
        just closed at that cost."""
        gap = self.gap.get(key, (None,))[0]
        for qid in qids:
            n, dt, m = self.book.get(qid, (0.0, 0.0, 0.0))
            k, starts, mo = self.live.get(qid, (0, 0.0, 0.0))
            if closing is not None:
                t0, spent, cost = closing
                n, dt, m = self.DECAY * n + 1.0, self.DECAY * dt + (t - t0), self.DECAY * m + cost
                if spent > 2.0:
                    k, starts, mo = k - 1, starts - t0, mo - spent
            if n + k >= 1 and (gap is None or (dt + k * t - starts) / (gap if gap > 0 else 1e-300) < m + mo):
                return False
        return True

    def _live(self, ep, qids, sign):
        """Add (``sign`` 1) or take (-1) open episode ``ep`` to or from the live tallies of ``qids``: only once
        it has been re-cut. Before that it has cost its demotion alone and saved for too short a time to
        tell (a fleet's first demotions come together, and would each stop the next)."""
        if ep[1] > 2.0:
            for qid in qids:
                lv = self.live.get(qid)
                if lv is not None or sign > 0:
                    lv = self.live.setdefault(qid, [0, 0.0, 0.0])
                    lv[0], lv[1], lv[2] = lv[0] + sign, lv[1] + sign * ep[0], lv[2] + sign * ep[1]

    def demoted(self, key, qids, t, alone):
        self.open[key] = [t, 2.0, alone, qids]

    def recut(self, key):
        ep = self.open.get(key)
        if ep is not None:
            self._live(ep, ep[3], -1)
            ep[1] += 2.0
            self._live(ep, ep[3], 1)

    def keep(self, cut, queries):
        """Only the episodes of the keys still cut go on, in the queries they are still cut in (``cut``: the
        (query id, key) pairs), and the books of the ``queries``."""
        for key in list(self.open):
            ep = self.open[key]
            self._live(ep, [qid for qid in ep[3] if (qid, key) not in cut], -1)
            ep[3] = [qid for qid in ep[3] if (qid, key) in cut]
            if not ep[3]:
                del self.open[key]
        self.book = {qid: b for qid, b in self.book.items() if qid in queries}
        self.live = {qid: lv for qid, lv in self.live.items() if qid in queries}

    def worth(self, key, t, alone):
        """Whether ``key``'s open episode should go on at a re-cut at ``t``: it has saved so far at least
        what its re-cuts cost, this one included (its demotion is sunk: giving its width back costs as much
        again), or, abandoned, it would be demoted again at once (the recent episodes of its queries, this
        one closed, still pay): abandoning then costs its control and acknowledgement and the new demotion's,
        four messages where the re-cut costs two, and ends in the same cut."""
        ep, gap = self.open.get(key), self.gap.get(key, (None,))[0]
        if ep is None or gap is None or (t - ep[0]) / (gap if gap > 0 else 1e-300) >= ep[1]:
            return True
        return self.pays(key, ep[3], t, (ep[0], ep[1], ep[1] + 2.0 + max(0, alone - ep[2])))

    def promoted(self, key, t, alone, extra=3.0):
        """``key``'s episode ended at ``t``: on a report above its cut (``extra``: the report, the control
        giving its width back and its acknowledgement), or abandoned (the control and acknowledgement)."""
        ep = self.open.pop(key, None)
        if ep is None:
            return
        cost = ep[1] + extra + max(0, alone - ep[2])
        self._live(ep, ep[3], -1)
        for qid in ep[3]:
            b = self.book.setdefault(qid, [0.0, 0.0, 0.0])
            b[0], b[1], b[2] = self.DECAY * b[0] + 1.0, self.DECAY * b[1] + (t - ep[0]), self.DECAY * b[2] + cost
        self.gap.setdefault(key, [None, None])[1] = t


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
        self.stats.update({"demoted": 0, "recut": 0, "promoted": 0, "abandoned": 0})
        self.ledger = Ledger()

    def reset(self, coord):
        """Drop the cuts of queries that are gone or whose precision or sources changed."""
        qs = coord.queries
        ext = {qid: q for qid, q in qs.items() if q.kind in ("min", "max") and not lagged(q)}
        keep = {qid for qid, q in ext.items() if self.prec.get(qid) == q.precision}
        self.cut = {p: c for p, c in self.cut.items() if p[0] in keep and p[1] in qs[p[0]].weights}
        self.prec = {qid: q.precision for qid, q in ext.items()}
        self.ledger.keep(self.cut, ext)
        self.edge = {qid: e for qid, e in self.edge.items() if qid in keep}

    def uncut(self, coord, key, sent=True):
        """Drop ``key``'s cuts (it keeps its bound): its episode ends as abandoned, or, ``sent`` False (a
        demotion not made after all), is forgotten."""
        if any(p[1] == key for p in self.cut):
            if sent:
                self.ledger.promoted(key, coord.clock, self._alone(coord, key), 2.0)
            self.cut = {p: c for p, c in self.cut.items() if p[1] != key}
            self.ledger.keep(self.cut, self.prec)

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
            if lagged(q):
                continue
            if q.kind in ("min", "max"):
                if (qid, key) not in self.cut:
                    return False
                out = True
            elif q.kind in ("sum", "avg"):
                return False
        return out

    def reported(self, coord, key, v, why=WHY_EXIT, cut=True):
        """A report of ``key`` (value ``v``; ``why``: its codec reason, WHY_EXIT when it left its bound) was
        applied: the keys whose cuts changed, in order; ``cut``: whether ``key`` itself may be cut.

        A source's cuts go together: it is out of all its MIN/MAX queries (silent) or of none, since a
        source still in one keeps its width and a cut for another would only cost messages."""
        changed = {}
        qs = [coord.queries[qid] for qid in sorted(coord.by_source.get(key, ())) if not lagged(coord.queries[qid])]
        qids = [q.id for q in qs if q.kind in ("min", "max")]
        if not qids:
            return []
        # a source that a SUM/AVG query needs keeps a width anyway: no cut (but its reports move the extremes)
        free = cut and not any(q.kind in ("sum", "avg") for q in qs)
        ends = {qid: self._inner(coord, coord.queries[qid]) for qid in qids}
        t, book = coord.clock, self.ledger
        if free and (qids[0], key) in self.cut:
            if any(_side(coord.queries[qid]) * (v - self.cut[(qid, key)]) > 0 for qid in qids):
                for qid in qids:        # it could become an extreme: an ordinary bound again
                    del self.cut[(qid, key)]
                self.stats["promoted"] += 1
                book.promoted(key, t, self._alone(coord, key))
                changed[key] = None
            return self._recuts(coord, qids, ends, changed)
        if why == WHY_EXIT:
            book.exited(key, t)
        elif why in (WHY_FIRST, WHY_RESYNC):
            book.began(key, t)
        if free and all(ends[qid] is not None for qid in qids):
            a, b = coord.cache.known(key)
            far = True
            for qid in qids:
                q = coord.queries[qid]
                s = _side(q)
                near = b if s > 0 else a            # the end of key's bound that faces the extreme
                far = far and q.precision > 0 and s * (ends[qid] - near) >= (self.reach + 1.0) * q.precision
            # (a lag query's source needs its segments first)
            if far and book.pays(key, qids, t) and coord.segments.ready(coord, key):
                for qid in qids:
                    self._set(coord.queries[qid], key, ends[qid])
                self.stats["demoted"] += 1
                book.demoted(key, qids, t, self._alone(coord, key))
                changed[key] = None
        return self._recuts(coord, qids, ends, changed)

    def _recuts(self, coord, qids, ends, changed):
        """Re-cut the sources of ``qids`` whose cuts the inner ends ``ends`` came too close to."""
        for qid in qids:
            q, inner = coord.queries[qid], ends[qid]
            s, d = _side(q), q.precision
            e = self.edge.get(qid)
            if inner is None or e is None or s * (inner - e) >= (self.reach - 1.0) * d:
                continue
            # the inner end moved towards the cuts: re-cut those too close, find the new innermost
            self.edge[qid] = None
            for p, c in list(self.cut.items()):
                if p[0] != qid or p not in self.cut:
                    continue
                if s * (inner - c) < (self.reach - 1.0) * d:
                    changed[p[1]] = None
                    if not self.ledger.worth(p[1], coord.clock, self._alone(coord, p[1])):     # it costs more than it saves: a width again
                        for x in [x for x in self.cut if x[1] == p[1]]:
                            del self.cut[x]
                        self.stats["abandoned"] += 1
                        self.ledger.promoted(p[1], coord.clock, self._alone(coord, p[1]), 2.0)
                        continue
                    self.stats["recut"] += 1
                    self.ledger.recut(p[1])
                    c = inner - s * self.reach * d
                self._set(q, p[1], inner, c)
        return list(changed)

    @staticmethod
    def _alone(coord, key):
        return coord.segments.alone.get(coord.cache.sources[key].device, 0)

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
