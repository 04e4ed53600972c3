"""Segment mirror and final answers: our extension of Olston et al. 2003 §1.2.3 bounds to the lagged line
segments of Elmeleegy et al. 2009 (swing/slide filters; not one of the five papers), device side
``edge/core/segment.py``.

A query with ``"lag": L`` (seconds) puts its sources in segment mode, at the width the protocol gives the lag
queries (``Protocol.segment_width``), unless a lag-free query holds the source's filter to no wider than
that for good (``Protocol.segments_needed``): its bounds, recorded as they change, then serve the lag
queries too, at no message of their own. Otherwise the lag-free queries are served by the source's filter,
whose width and constraints the protocol allocates over them only, and its reports carry the device's
pending segments (``edge/core/segment.py``); a source served by its filter that the protocol wants to let
go (a MIN/MAX cut) is asked for segments first (``ready``) and keeps its bounds recorded until they flow.
The device sends data of time
τ by τ + D, D = L − λ, so once the coordinator's event clock reaches c every segment covering τ <= c − D
has been applied. Per source the mirror keeps pieces ``[a, e, lo, hi, dlo, dhi]``: over [a, e) the value
lies in [lo + dlo·(τ−a), hi + dhi·(τ−a)] (``e`` infinite while a committed line goes on; a float32
board's lines are padded by a relative 2**-20). For each lag query the final horizon is the least of its
sources' coverage; every stretch between piece boundaries below it becomes a **final answer**
``{"time", "lo", "hi", "dlo", "dhi", "final": true}``: at τ from ``time`` until the next final answer,
the exact aggregate lies in [lo + dlo·(τ−time), hi + dhi·(τ−time)]. A gap in a source's pieces (a
reboot, an outage: what the device sent from D before it on may be lost) gives an unbounded, degraded
stretch. Real-time answers of a lag query are its newest final answer extrapolated and marked degraded:
nothing about the present is proven before t + L.

On a hostile network (issue #20) a ``segs`` message can be lost (a silent committed line then looks like
it goes on) or arrive after finals went past its data. Integrity finds both (a sequence gap or silence;
an uplink stamped ≤ horizon + D): the coordinator revokes the finals over the window, from D before what
was missed to the final horizon (``revoked`` on the query's next change, as for real-time answers), and
the next final answer is restated at the horizon; while the device is out of sync its pieces are ignored,
so the finals over the hole are degraded until a birth resynchronises it. A late message's pieces are
put between their neighbours. Segments are stamped by the device, so lag queries need skew 0.
"""
import bisect
import heapq
import math

from backend.coordinator.core.integrity import RETRY
from backend.coordinator.core.queries import QueryError

INF = math.inf
LINE, CONST = 1, 2
MODELS = {"line": LINE, "constant": CONST}
PAD = {True: 2.0 ** -20, False: 1e-12}     # relative slack of a float32 / float64 device's line


def lag_of(q):
    return q.extra.get("lag")


def before(t, d):
    """The largest time τ with τ + ``d`` < ``t`` in floats: data of τ is sent by τ + D as the device adds
    it, so a message stamped exactly τ + D may still be on its way at clock ``t`` (t − D may round above)."""
    if t == -INF or t == INF:
        return t
    h = t - d
    while h + d >= t:       # by an ulp of h or of t, whichever is coarser: h + d rounds at t's scale
        h -= max(math.ulp(h), math.ulp(t))
    return h


def send_lag(coord, q):
    """D = L − λ in whole milliseconds, rounded down: what the device is told and the mirror assumes."""
    return math.floor((lag_of(q) - coord.latency) * 1000 + 1e-6) / 1000


class Mirror:
    def __init__(self):
        self.mode = {}          # key -> (D seconds, model, width) of a source in segment mode
        self.pieces = {}        # key -> [[a, e, lo, hi, dlo, dhi], ...] in time order
        self.plain = {}         # key -> None: report-mode sources read by a lag query (history from known())
        self.final = {}         # lag query id -> final horizon reached (None: not started)
        self.start = {}         # lag query id -> event time it was registered at
        self.changed = {}       # key -> piece boundaries added since the last answers()
        self.pending = {}       # lag query id -> boundaries not finalised yet (times of possible answer changes)
        self.static = {}        # lag query id -> (lazy min-heap of (limit, key), largest D), rebuilt on mode changes
        self.lim = {}           # key -> its current limit (entries of the heaps that differ are stale)
        self.last = {}          # lag query id -> its newest final answer
        self.asked = {}         # key -> downlink number of its segment mode, until a segment shows it in force
        self.sent = {}          # key -> (event time its segment mode left, times it was sent again)
        self.alone = {}         # device -> its segment messages that no report carried

    # -- modes --------------------------------------------------------------------------------------
    def check(self, coord, q):
        """A lag query ``coord`` can run (QueryError otherwise): L beyond the latency tolerance λ."""
        if lag_of(q) is not None and send_lag(coord, q) <= 0:
            raise QueryError("query %s: lag %g s must exceed the latency tolerance λ = %g s by 1 ms at least"
                             % (q.id, lag_of(q), coord.latency))
        if lag_of(q) is not None and coord.integrity.sigma > 0:
            raise QueryError("query %s: segment mode needs synchronised device clocks (skew 0, have %g s): "
                             "segments are stamped by the device" % (q.id, coord.integrity.sigma))

    @staticmethod
    def _want(coord, qids, want, only=None):
        """(D, model, width) of every source of the lag queries among ``qids`` (or of ``only``): the shortest
        D, the model of the query that asks it, the width the protocol gives the lag queries."""
        for qid in qids:
            q = coord.queries[qid]
            for key in q.sources if only is None else (only,):
                if lag_of(q) is not None and (key not in want or send_lag(coord, q) < want[key][0]):
                    want[key] = (send_lag(coord, q), MODELS[q.extra.get("segment", "line")])
        for key in want:
            want[key] += (coord.protocol.segment_width(coord, key),)

    def born(self, coord, key):
        """A new source: segment mode if a lag query names it and its filter does not serve it."""
        want = {}
        self._want(coord, sorted(coord.by_source.get(key, ())), want, key)
        self.static = {}
        if key in want and coord.protocol.segments_needed(coord, key, want[key][2]):
            self.mode[key] = want[key]
            self.send(coord, key, *want[key])
        elif key in want:
            self.plain[key] = None
            self.touched(key, coord.clock, coord.cache.known(key))

    def ready(self, coord, key):
        """Whether a lag query over ``key`` may lose its filter's bounds: not before its segments flow (a
        source served by its filter is asked for them now; its filter must stay as it is until then)."""
        if key not in self.plain:
            return True
        if key not in self.mode:
            want = {}
            self._want(coord, sorted(coord.by_source.get(key, ())), want, key)
            self.mode[key] = want[key]
            self.send(coord, key, *want[key])
            self.static = {}
        return False

    def offline(self, key, t):
        """The device of ``key`` is gone at ``t``: what it sends from t − D on may be lost."""
        self.changed.setdefault(key, [])
        if key in self.mode:
            self._end(key, t - self.mode[key][0])

    def queries_changed(self, coord, now):
        """Put sources in or out of segment mode as the lag queries over them require."""
        want = {}
        self._want(coord, sorted(coord.queries), want)
        read = {k: None for qid in sorted(coord.queries) if lag_of(coord.queries[qid]) is not None
                for k in coord.queries[qid].sources}
        for key in list(self.mode):
            if key not in want:
                del self.mode[key]
                self._end(key, coord.clock)
                if key in coord.cache.sources:
                    self.send(coord, key, 0, 0, 0.0)
        for key, m in want.items():
            if key not in coord.cache.sources:
                continue        # (joins when it is born)
            if key in self.mode or coord.protocol.segments_needed(coord, key, m[2]):
                if self.mode.get(key) != m:
                    self.mode[key] = m
                    self.send(coord, key, *m)
            elif key not in self.plain:
                self.plain[key] = None
                self.touched(key, now, coord.cache.known(key))
        for key in list(self.plain):
            if key not in want:
                del self.plain[key]
        for key in list(self.pieces):
            if key not in read:
                del self.pieces[key]
        lagged = [qid for qid in sorted(coord.queries) if lag_of(coord.queries[qid]) is not None]
        self.start = {qid: self.start.get(qid, now) for qid in lagged}
        self.final = {qid: self.final.get(qid) for qid in lagged}
        self.pending = {qid: self.pending[qid] for qid in lagged if qid in self.pending}
        self.static = {}

    def send(self, coord, key, d, model, width, tries=0):
        """Tell ``key``'s device its segment mode; a device with a reading answers at once with a segment
        starting then, and is told again until it has (``resend``)."""
        s = coord.cache.sources[key]
        coord.send(s.device, "segment", {"src": s.index, "lag": round(d * 1000), "model": model, "width": width})
        self.sent[key] = (coord._event_now(), tries)
        if model and s.value is not None:
            self.asked[key] = coord.devices[s.device]["down"]
            coord._leave(s.device, ("segment", key), self.asked[key], wait=(None, RETRY, tries, False))

    def reported(self, coord, key, t):
        """A plain report of ``key`` stamped ``t``: from a source in segment mode, sent too long after its mode
        left to have crossed it, the device never got it (it had no reading to answer with then)."""
        if key in self.mode and t > self.sent[key][0] + 2 * coord.latency + coord.integrity.margin:
            self.resend(coord, key, self.sent[key][1] + 1)

    def resend(self, coord, key, tries):
        """No segment of ``key`` since its mode was sent (``send``): the control or the answer was lost."""
        if key in self.mode:
            self.send(coord, key, *self.mode[key], tries=tries)

    def resync(self, coord, key, t):
        """A device born again at ``t``: what it sent reaches t − D (it may have rebooted and lost the
        rest); it restarts its segments when it hears its mode again."""
        self.changed.setdefault(key, [])
        if key in self.mode:
            self._end(key, t - self.mode[key][0])
            self.send(coord, key, *self.mode[key])

    def _end(self, key, t):
        ps = self.pieces.get(key)
        if ps and ps[-1][1] > t:
            ps[-1][1] = max(ps[-1][0], t)
            self.changed.setdefault(key, []).append(ps[-1][1])

    # -- inputs ---------------------------------------------------------------------------------------
    def receive(self, coord, device, m, unit):
        """A ``segs`` message from ``device``; times in ``unit`` per second."""
        keys = coord.devices[device]["keys"]
        single = coord.devices[device]["single"]
        if "why" not in m:
            self.alone[device] = self.alone.get(device, 0) + 1
        off = coord.models.off_since
        for r in m["segs"]:
            if r["src"] >= len(keys) or keys[r["src"]] not in self.mode or keys[r["src"]] in off:
                continue        # (offline or out of sync: its pieces resume after a gap once it is born again)
            key = keys[r["src"]]
            self.plain.pop(key, None)       # its segments flow: they serve it from here on
            if key in self.asked:
                coord.integrity.answered(device, ("segment", key), self.asked.pop(key))
            a, e = r["a"] / unit, (INF if r["f"] & 1 else r["e"] / unit)
            slope, v, h = r["s"] * unit, r["v"], r["w"] / 2
            pad = PAD[single] * (abs(v) + h)
            grow = PAD[single] * abs(slope)
            piece = [a, e, v - h - pad, v + h + pad, slope - grow, slope + grow]
            ps = self.pieces.setdefault(key, [])
            if ps and ps[-1][0] == a:
                ps[-1] = piece
            elif not ps or ps[-1][0] < a:
                if ps and ps[-1][1] > a:
                    ps[-1][1] = a
                ps.append(piece)
            else:       # late, behind a newer message: between its neighbours (the newer keep their say)
                i = bisect.bisect_left(ps, [a])
                if i == 0 or ps[i][0] == a:
                    continue
                ps[i - 1][1] = min(ps[i - 1][1], a)
                piece[1] = min(e, ps[i][0])
                ps.insert(i, piece)
            self._trim(ps)
            self.changed.setdefault(key, []).extend((a, e) if e != INF else (a,))
            coord.dirty.update(coord.by_source.get(key, {}))

    def touched(self, key, t, bound):
        """A report-mode source's known bound changed at ``t``."""
        if key not in self.plain:
            return
        ps = self.pieces.setdefault(key, [])
        self.changed.setdefault(key, []).append(t)
        if ps and ps[-1][0] == t:
            ps[-1][2:4] = bound
            return
        if ps:
            ps[-1][1] = t
        ps.append([t, INF, bound[0], bound[1], 0.0, 0.0])
        self._trim(ps)

    # -- answers --------------------------------------------------------------------------------------
    def _limit(self, coord, key):
        """How far ``key``'s pieces reach whatever the clock: its last piece's end, and for a device gone
        offline its time less D (what it sent after may be lost)."""
        lim = self.pieces[key][-1][1]
        off = coord.models.off_since
        if key in self.mode and off and key in off:
            lim = min(lim, off[key] - self.mode[key][0])
        return lim

    def _horizon(self, coord, q, t):
        """Through when every source of ``q`` is known at clock ``t`` (None while one has no piece):
        min over sources of their limit (a lazy heap per query) and t − the largest D among them."""
        st = self.static.get(q.id)
        if st is None:
            if not all(self.pieces.get(key) for key in q.sources):
                return None
            for key in q.sources:
                self.lim[key] = self._limit(coord, key)
            heap = [(self.lim[key], key) for key in q.sources]
            heapq.heapify(heap)
            dmax = max([self.mode[key][0] for key in q.sources if key in self.mode] + [0.0])
            st = self.static[q.id] = (heap, dmax)
        heap = st[0]
        while self.lim.get(heap[0][1], heap[0][0]) != heap[0][0]:
            heapq.heappop(heap)             # stale: that source's limit moved since
        return min(heap[0][0], before(t, st[1]))

    @staticmethod
    def _at(ps, t):
        """The piece of ``ps`` covering ``t``, or None (a gap)."""
        i = bisect.bisect_right(ps, [t, INF, INF]) - 1
        if i >= 0 and ps[i][0] <= t < ps[i][1]:
            return ps[i]
        return None

    def realtime(self, q, t):
        """Fields of a lag query's real-time answer: its newest final answer extrapolated to ``t``, degraded
        (nothing about the present is proven before t + L)."""
        f = self.last.get(q.id)
        lo, hi = (-INF, INF) if f is None else (f["lo"] + f["dlo"] * (t - f["time"]), f["hi"] + f["dhi"] * (t - f["time"]))
        return {"lo": lo, "hi": hi, "degraded": True, "final": False,
                "reason": "segment mode: the answer for time t is final by t + %g s" % lag_of(q)}

    def answers(self, coord, t):
        """Final answers of every lag query whose horizon moved by clock ``t`` (uplinks up to t applied)."""
        for key, ts in self.changed.items():
            lim = self._limit(coord, key) if self.pieces.get(key) else None
            moved = lim != self.lim.get(key)
            self.lim[key] = lim
            for qid in coord.by_source.get(key, ()):
                if qid in self.final:
                    self.pending.setdefault(qid, []).extend(ts)
                    if moved and qid in self.static:
                        heapq.heappush(self.static[qid][0], (lim, key))
        self.changed = {}
        out = []
        for qid, f in self.final.items():
            q = coord.queries[qid]
            h = self._horizon(coord, q, t)
            if h is None:
                continue
            first = f is None
            if first:
                f = max([self.start[qid]] + [self.pieces[key][0][0] for key in q.sources])
                self.pending[qid] = [x for key in q.sources for p in self.pieces[key] for x in p[:2]] + [f]
            if h <= f:
                self.final[qid] = f
                continue
            pend = self.pending.get(qid, ())
            for x in sorted({x for x in pend if f <= x < h}):
                out.append(("answer", self._final(q, x)))
            self.pending[qid] = [x for x in pend if x >= h]
            self.final[qid] = h
        return out

    def _final(self, q, t):
        lo = hi = dlo = dhi = 0.0
        gap = False
        for key in q.sources:
            p = self._at(self.pieces[key], t)
            if p is None:
                gap = True
                break
            d, w = t - p[0], q.weights[key]
            a, b = p[2] + p[4] * d, p[3] + p[5] * d
            lo, hi = lo + w * (a if w > 0 else b), hi + w * (b if w > 0 else a)
            dlo, dhi = dlo + w * (p[4] if w > 0 else p[5]), dhi + w * (p[5] if w > 0 else p[4])
        n = len(q.sources) if q.kind == "avg" else 1
        rec = self.last[q.id] = {"time": t, "query": q.id, "final": True, "guarantee": "interval"}
        if gap:
            rec.update(lo=-INF, hi=INF, dlo=0.0, dhi=0.0, degraded=True, reason="segments lost (device reborn or offline)")
        else:
            rec.update(lo=lo / n, hi=hi / n, dlo=dlo / n, dhi=dhi / n, degraded=False)
        return rec

    def restate(self, qid):
        """Final answers of ``qid`` were revoked up to its horizon: the next one starts there."""
        if self.final.get(qid) is not None:
            self.pending.setdefault(qid, []).append(self.final[qid])

    def _trim(self, ps):
        """Drop the pieces of ``ps`` every lag query has finalised past (the newest stays)."""
        done = [f for f in self.final.values() if f is not None]
        if done and len(ps) > 1 and ps[1][0] <= min(done):
            f = min(done)
            i = bisect.bisect_right(ps, [f, INF, INF]) - 1
            del ps[:max(0, min(i, len(ps) - 1))]
