"""Final answers for every aggregate query (DESIGN.md §4: provisional vs final; Olston et al. 2003 App. A bounds
over the final mirror of ``replay.py``, as lines of ``lines.py``).

Per query the **final horizon** is the least limit of its sources (how far their pieces hold: their watermark,
``replay.py``), capped by the event clock. When it moves, every stretch between the old and the new horizon is
answered from the pieces, for every aggregate kind: a final answer ``{"time", "lo", "hi", "dlo", "dhi",
"final": true, "degraded", "watermark"}`` states that from ``time`` until the query's next final answer the exact
aggregate lies in [lo + dlo·(τ−time), hi + dhi·(τ−time)]. It is never withdrawn: it stands on uplinks taken in
each device's sequence order, so no later news can change it. It is degraded, with its reason, where a source's
value is unknown (its device lost or gone: "lost uplink: d3"), or where it is wider than the query's precision
("wider than precision: width W": a narrowing not confirmed yet, the hull of a clock's skew; each final answer
with every source known is measured into its query's reserve, ``reserve.py``, so the widths leave room for that
hull). ``watermark`` is the horizon when it was issued; provisional answers carry the horizon too.

Work per change: a source's new piece or limit costs O(log n) per query over it (a lazy heap of limits, a heap
of pending piece boundaries, ``lines.Lines``); a query's state is built once, when its horizon first exists (or
its sources change). Families whose protocols do not answer from bounds (probabilistic, relay, summaries) and
entity queries have no finals (``FINALS``).
"""
import heapq
import math

from backend.coordinator.core.lines import A, SLACK, TIGHT, Lines
from backend.coordinator.core.replay import Replay
from edge.core.codec import newer

INF = math.inf
FINALS = ("sum", "avg", "min", "max", "count")


def _nodata(key, t):
    return [t, -INF, INF, 0.0, 0.0, ("no data yet", key), None]


class Query:
    __slots__ = ("start", "h", "lines", "pend", "heap", "last", "q", "ident")

    def __init__(self, start):
        self.start = start      # event time it was registered at
        self.h = None           # final horizon reached (None: not begun)
        self.lines = None       # lines.Lines at the horizon
        self.pend = []          # heap of (a, n, key, piece): boundaries not answered yet
        self.heap = None        # lazy heap of (limit, key)
        self.last = None        # newest final answer
        self.q = None           # the query object the state was built for
        self.ident = None       # what the newest one was made of (``Lines.ident``)


class Finals:
    def __init__(self, coord):
        self.coord = coord
        self.replay = Replay(self)
        self.qs = {}            # query id -> Query
        self.touched = {}       # query ids whose horizon may have moved
        self.lost = {}          # source keys lost now (their limit moves with the clock)
        self.rng = {}           # key -> the ranges of the COUNT-in-range queries over it
        self.n = 0

    # -- what the final mirror asks (replay.Replay's sink) ---------------------------------------------
    def _of(self, key):
        return [self.qs[qid] for qid in self.coord.by_source.get(key, ()) if qid in self.qs]

    def piece(self, key, p):
        for qid in self.coord.by_source.get(key, ()):
            st = self.qs.get(qid)
            if st is not None and st.h is not None:
                self.n += 1
                heapq.heappush(st.pend, (p[A], self.n, key, p))

    def moved(self, key):
        lim = self.limit(key)
        if lim == INF:
            self.lost[key] = None
        else:
            self.lost.pop(key, None)
        for qid in self.coord.by_source.get(key, ()):
            st = self.qs.get(qid)
            if st is None:
                continue
            if st.heap is not None:
                heapq.heappush(st.heap, (lim, key))
                if len(st.heap) > 4 * len(st.q.sources) + 16:
                    st.heap = None
            self.touched[qid] = None

    def floor(self, key):
        """The furthest horizon among ``key``'s queries: its pieces may not start before it."""
        return max([st.h for st in self._of(key) if st.h is not None] + [-INF])

    def low(self, key):
        """The nearest horizon among ``key``'s queries: its pieces before it are no longer needed."""
        hs = [st.h for st in self._of(key)]
        return INF if not hs else -INF if None in hs else min(hs)

    def watermark(self, device, d, cap=None):
        """(W, mark) of ``device`` (sequence.Dev ``d``): integrity's watermark and latest proven mark, capped by
        the release clock (``cap``) and, while uplinks are held for a missing number or numbers were skipped, by
        the latest one taken (the missing one came after it; a birth may have made it no longer missing for
        integrity). So too while a birth that made numbers no longer missing for integrity (its watermark jumps to
        the birth's stamp on arrival) is not taken yet: what the missing numbers said is lost from the latest
        uplink taken, which the mirror learns only when it takes that birth (issue #30: released λ later, the
        limit had moved with the clock past a lost report's instant and a MAX final answer missed it)."""
        ig, coord = self.coord.integrity, self.coord
        if cap is None:     # the release clock: never past an uplink due but not applied yet (a batch released in
            head = coord.queue[0][0] if coord.queue else INF        # one call is taken one at a time; issue #30)
            cap = max(coord.clock, min(coord.wall - coord.latency, head))
        if d is not None and (d.buf or d.hole):
            cap = min(cap, d.last)
        f = ig.skipped.get(device)
        if f is not None and d is not None:
            taken = newer(d.next, f[1]) if d.boot == f[0] and d.next is not None else newer(d.boot, f[0])
            if taken:
                del ig.skipped[device]      # (that birth is taken, or a later boot's)
            else:
                cap = min(cap, d.last)
        return min(ig.watermark(device), cap), min(ig.marked(device), cap)

    def cover(self, device, t):
        """The latest instant ``device`` can have acted at its clock's ``t`` (integrity's clock bounds)."""
        ig = self.coord.integrity
        return ig.cover(device, t) if ig.sigma > 0 else t

    def slack(self, q):
        """The rounding allowed over ``q``'s precision: a float32 board's (``SLACK``) if any of its sources' devices
        is one (as born so far), else a float64 sum's (``TIGHT``)."""
        rp = self.replay
        single = any(rp.dev[rp.src[key].device].single for key in q.sources
                     if key in rp.src and rp.src[key].device in rp.dev)
        return SLACK if single else TIGHT

    def limit(self, key):
        s = self.replay.src.get(key)
        return -INF if s is None else s.limit

    # -- queries ----------------------------------------------------------------------------------------
    def queries_changed(self, now, qids):
        """Follow the coordinator's queries ``qids`` (those that changed): new ones start at ``now``, changed
        ones are rebuilt at their horizon, removed ones go (O(their sources) each)."""
        coord = self.coord
        keys = {}
        for qid in qids:
            q, st = coord.queries.get(qid), self.qs.get(qid)
            for x in (st and st.q, q):
                if x is not None and x.kind == "count" and x.range is not None:
                    keys.update(dict.fromkeys(x.sources))
            if q is None or q.kind not in FINALS or not coord.protocol.finals:
                self.qs.pop(qid, None)
                self.touched.pop(qid, None)
                continue
            st = st or Query(now)
            if st.q is not q:
                st.q, st.heap = q, None
                if st.h is not None:
                    self._build(st, st.h)
                self.touched[qid] = None
            self.qs[qid] = st
        for key in keys:            # the ranges of the COUNT-in-range queries over each of theirs, in query order
            rng = ()
            for qid in sorted(coord.by_source.get(key, ())):
                q = coord.queries[qid]
                if qid in self.qs and q.kind == "count" and q.range is not None and q.range not in rng:
                    rng += (q.range,)
            if rng:
                self.rng[key] = rng
            else:
                self.rng.pop(key, None)

    def horizon(self, qid):
        """The final horizon of ``qid`` (None: no final answer yet)."""
        st = self.qs.get(qid)
        return None if st is None else st.h

    def newest(self, qid):
        st = self.qs.get(qid)
        return None if st is None else st.last

    # -- answers ----------------------------------------------------------------------------------------
    def _reach(self, st, clock):
        """How far every source of ``st``'s query holds, by ``clock``."""
        heap = st.heap
        if heap is None:
            heap = st.heap = [(self.limit(key), key) for key in st.q.sources]
            heapq.heapify(heap)
        while self.limit(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return min(heap[0][0], clock)

    def answers(self, clock):
        """The final answers issued by event clock ``clock`` (every uplink and control up to it applied)."""
        out = []
        if self.replay.waiting:
            self.replay.catch_up(clock)
        if not self.touched and not self.lost:
            return out
        for key in self.lost:
            for qid in self.coord.by_source.get(key, ()):
                if qid in self.qs:
                    self.touched[qid] = None
        touched, self.touched = self.touched, {}
        for qid in sorted(touched):
            st = self.qs.get(qid)
            h = self._reach(st, clock)
            if st.h is None:
                h0 = self._begin(st, h)
                if h0 is None:
                    continue
                out += self._issue(qid, st, h0, h)
            if h > st.h:
                self._emit(qid, st, h, out)
        return out

    def _begin(self, st, h):
        """Start ``st``'s final answers once every source holds past the latest of its first pieces and the
        query's start: its state there, every boundary after (O(sources + pieces), once)."""
        if h == -INF:
            return None
        f0 = st.start
        for key in st.q.sources:
            ps = self.replay.src[key].pieces
            if not ps:
                return None
            f0 = max(f0, ps[0][A])
        if h <= f0:
            return None
        self._build(st, f0)
        return f0

    def _build(self, st, t):
        """``st``'s lines at ``t`` from its sources' pieces, and the boundaries after ``t``."""
        st.lines = Lines(st.q, self.slack(st.q))
        st.lines.advance(t)
        st.pend = []
        for key in st.q.sources:
            s = self.replay.src.get(key)
            ps = s.pieces if s is not None else []
            i = 0
            while i + 1 < len(ps) and ps[i + 1][A] <= t:
                i += 1
            st.lines.set(key, ps[i] if ps and ps[i][A] <= t else _nodata(key, t))
            for p in ps[i + 1 if ps and ps[i][A] <= t else 0:]:
                self.n += 1
                st.pend.append((p[A], self.n, key, p))
        heapq.heapify(st.pend)
        st.lines.advance(t)
        st.h = t

    def _emit(self, qid, st, h, out):
        """Final answers of ``qid`` for [st.h, h), at every instant its answer changes there."""
        lines, pend, pop = st.lines, st.pend, heapq.heappop
        while True:
            t = pend[0][0] if pend else INF
            e = lines.next_event()
            if e < t:
                t = e
            if t >= h:
                break
            lines.advance(t)
            while pend and pend[0][0] == t:
                _, _, key, p = pop(pend)
                lines.set(key, p)
            if lines.next_event() <= t:
                lines.advance(t)
            st.h = t
            out += self._issue(qid, st, t, h)
        st.h = h

    def _issue(self, qid, st, t, h):
        ident = st.lines.ident()
        if st.last is not None and ident == st.ident:
            return []       # the same line goes on
        st.ident = ident
        rec = st.lines.line(self.coord.queries[qid].precision)
        last = st.last
        if last is not None and not (rec["dlo"] or rec["dhi"]) and all(last.get(k) == v for k, v in rec.items()):
            return []
        rec.update(time=t, query=qid, final=True, guarantee="interval", watermark=h)
        st.last = rec
        coord = self.coord      # its reserve budgets the finals too (reserve.py), where clocks may be off (with
        # exact clocks no final holds a hull: one wider than δ − R is a precision being reached by shrinking)
        if coord.integrity.sigma > 0 and not st.lines.why \
                and coord.reserve.observe(st.q, t, rec["hi"] - rec["lo"], True):
            coord.replan[qid] = None
        return [("answer", rec)]

    def realtime(self, q, t):
        """Fields of a lag query's provisional answer: its newest final answer extrapolated to ``t``, degraded
        (nothing about the present is proven before t + L)."""
        f = self.newest(q.id)
        lo, hi = (-INF, INF) if f is None else (f["lo"] + f["dlo"] * (t - f["time"]), f["hi"] + f["dhi"] * (t - f["time"]))
        return {"lo": lo, "hi": hi, "degraded": True,
                "reason": "segment mode: the answer for time t is final by t + %g s" % q.extra["lag"]}
