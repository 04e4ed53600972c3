"""The final mirror (DESIGN.md §4 final answers): Olston et al. 2003 §1.2.3 bounds replayed in event time, in
each device's own sequence order; segments (Elmeleegy et al. 2009) taken the same way.

The live mirror applies an uplink when the λ-queue releases it: a late one at the current clock, a reordered
older report not at all, so its history of bounds is not exact. Here every uplink the coordinator releases
is taken in its device's sequence order once no number before it is missing, at its own event time, with the
backend's controls (widths, filters with their epochs, periodic shrinks, segment modes) at the event times they
were made, into a bound cache of its own (the same hull rules: a narrowing keeps the old mirror until a report
carries its epoch, here whether the protocol counts on it or not; a report from a clock off by up to σ keeps
the mirrors before it until the latest instant it can have happened, a guarded one only their hull with its
value). After each instant a source's known bound is recorded as a piece ``[a, lo, hi, dlo, dhi, why, mem]``
(``lines.py``); a source in segment mode records its segments instead.

**Watermark** (integrity's, ``integrity.py``, capped by the release clock and what ``sequence.py`` still holds
to replay in order). A report-mode source's pieces hold before its device's watermark W; a segment-mode source's
before W − D (data of τ is sent by τ + D; a committed line is not trusted past what was heard), a whole flush's
stamp for a committed line, or a mark's (a device marks only with no segment data pending). A lost source
says why from its limit on; a device lost for good moves with the clock until a birth restates it (from the
latest instant it can have been sent). Controls are kept until replayed: the coordinator makes them at its event
clock, which every released uplink's time is at most.
"""
import heapq
import math

from backend.coordinator.core.boundcache import BoundCache, shrink_source
from backend.coordinator.core.lines import A, HI, LO, value
from backend.coordinator.core.segments import before
from backend.coordinator.core.sequence import REPORT, SEGMENT, Sequence
from edge.core.predict import horizon

INF = math.inf


class FinalCache(BoundCache):
    """A bound cache replayed one source at a time: a line's next restatement is kept on its source only."""

    def refresh(self, s, t):
        s.due = t + horizon(s.filt.gap) / s.unit


class Replay(Sequence):
    def __init__(self, sink):
        self.sink = sink        # .piece(key, p), .moved(key), .floor(key), .low(key), .rng {key: count ranges}
        self.cache = FinalCache()
        self.dev = {}
        self.src = {}
        self.shrinks = []       # (t, fraction) of every periodic shrink
        self.waiting = {}       # devices heard whose watermark may be ahead of their sources' limits
        self.heard_now = False  # an uplink or mark was accepted in the coordinator's current call
        self.n = 0

    def heard(self, device):
        """Integrity accepted an uplink or a mark of ``device``: its watermark may have moved."""
        self.waiting[device] = None
        self.heard_now = True

    def catch_up(self, clock):
        """Move the sources of the devices heard as far as their watermark, by release clock ``clock``. Only after a
        call that heard a device (limits never move on a timer alone, so a lazy coordinator that skips idle ticks
        and one ticking every period issue the same answers)."""
        if not self.heard_now:
            return
        self.heard_now = False
        for device in list(self.waiting):
            d = self.dev.get(device)
            for key in d.keys if d is not None else ():
                self._advance(key)
            if max(self.sink.watermark(device, None, INF)) <= clock:
                del self.waiting[device]        # (else its watermark is ahead of the clock: again later)

    # -- controls ---------------------------------------------------------------------------------------
    def control(self, key, t, op, args):
        """A control made at event time ``t``: ``("width", (width, epoch))`` or ``("filter", (width, cons, epoch, acked))``."""
        if key in self.src:
            self._push(key, t, op, args)

    def shrink(self, t, frac):
        """Olston §3.1's periodic shrink of every filter at tick ``t`` (in order with the controls around it)."""
        self.n += 1
        self.shrinks.append((t, self.n, frac))

    def mode(self, key, t, d, model):
        """A segment-mode control made at ``t``: D seconds (``model`` 0: back to reports)."""
        s = self.src.get(key)
        if s is None:
            return
        if model:
            s.lag = d
            if s.mode == REPORT and s.pend is None:
                s.pend = t
        else:
            s.pend = None
        self.sink.moved(key)

    def _lose(self, key, why, gap=False):
        s = self.src[key]
        if s.lost is not None:      # (lost again: only what is taken in after this gap speaks for it)
            s.gap = self.n if gap and s.gap else 0
            if not s.gap and s.limit != INF:
                s.limit = INF
                self.sink.moved(key)
            return
        self._replay(key, s.limit)
        s.lost, s.gap, s.live = why, self.n if gap else 0, []
        self._piece(key, s, [s.limit, -INF, INF, 0.0, 0.0, why, None])
        if not gap:
            s.limit = INF
            self.sink.moved(key)

    def _resume(self, key, s, n, hull):
        """A gap-lost source speaks again (by an uplink taken after the gap): known from the latest instant it
        can have spoken (``hull``), never before a final answer went."""
        if s.lost is not None and s.gap and n > s.gap:
            self._known(key, s, hull)

    def _known(self, key, s, hull):
        """A lost source is known again from ``hull`` on (what it was before is unknown)."""
        s.lost, s.gap = None, 0
        s.floor = max(s.floor, hull, self.sink.floor(key))

    # -- replay -----------------------------------------------------------------------------------------
    def _push(self, key, t, op, args):
        s = self.src[key]
        if t < s.limit < INF:
            # an uplink's event time (stamp − the clock's upper bound now, loosened since) fell before the limit
            # reached: it was sent after the uplink that limit stands on, so it happened at the limit at the earliest;
            # a control made at the event clock (the limit may be at the release clock, past it) reaches the device
            # later still
            t = s.limit
        self.n += 1
        heapq.heappush(s.heap, (t, self.n, op, args))

    def _advance(self, key):
        """Replay ``key`` as far as its device's uplinks are complete; its limit moves there."""
        if key is None:
            return
        s = self.src[key]
        if s.lost is not None and not s.gap:
            return
        w, mark = self.sink.watermark(s.device, self.dev[s.device])
        if s.mode == SEGMENT:
            lim = max(before(w, s.lag), mark)
        elif s.pend is not None:
            lim = max(min(w, s.pend), before(w, s.lag), mark)
        else:
            lim = max(w, mark)
        if s.taken is not None:
            lim = max(lim, s.proof)
        self._replay(key, lim)
        if s.mode == SEGMENT:
            lim = min(lim, s.cover)
        if lim > s.limit:
            s.limit = lim
            self.sink.moved(key)

    def _replay(self, key, limit, record=True):
        """Apply ``key``'s events before ``limit`` in (time, order made) order, its pieces after each instant."""
        s = self.src[key]
        c, heap, shrinks = self.cache, s.heap, self.shrinks
        while True:
            f = c.sources.get(key)
            due = f.due if f is not None and f.due is not None else INF
            t = min(heap[0][0] if heap else INF, shrinks[s.si][0] if s.si < len(shrinks) else INF, due)
            if t >= limit:
                return
            c.now = t
            while True:         # (a tick's shrink comes after what was applied before it, as live)
                a = heap[0] if heap and heap[0][0] == t else None
                b = shrinks[s.si] if s.si < len(shrinks) and shrinks[s.si][0] == t else None
                if a is None and b is None:
                    break
                if b is None or a is not None and a[1] < b[1]:
                    _, n, op, args = heapq.heappop(heap)
                    self._op(key, s, t, n, op, args, record)
                else:
                    s.si += 1
                    f = c.sources.get(key)
                    if f is not None:
                        until = self.sink.cover(s.device, t)    # a device whose clock may be behind shrinks
                        if until > t:                           # as late as this: the mirrors before it stay
                            self._push(key, until, "release", ())   # until then (as ``Resync._shrink_hold``)
                        shrink_source(f, b[2], until if until > t else None)
            f = c.sources.get(key)
            if f is not None and f.due == t:
                c.refresh(f, t)
            if record and s.mode == REPORT and s.lost is None and f is not None:
                self._record(key, s, t)

    def _op(self, key, s, t, n, op, args, record):
        c = self.cache
        if op == "birth":
            i, width, epoch, v, single, unit, hull = args
            if key not in c.sources:
                c.add(key, s.device, i, width, epoch, v, single, unit)
                s.floor = max(s.floor, hull)
            else:
                if s.lost is None and hull > t:     # the device may have kept its old state until then
                    c.hold(key, hull)
                    self._push(key, hull, "release", ())
                c.rebirth(key, width, epoch, t, v, single, unit)
            self._resume(key, s, n, hull)       # (a birth taken before a loss, replayed after it, says nothing)
        elif key not in c.sources:
            return
        elif op == "report":
            epoch, v, line, hull, kind, tight, lead = args
            if hull > t:        # (a guarded report: the hull of the bound before it and the value, as live)
                c.hold(key, hull, v if tight else None)
                self._push(key, hull, "release", ())
            c.report(key, epoch, t, v, line, lead)
            if s.lost is not None:
                self._resume(key, s, n, hull)
            if kind not in ("reply", "rsegs") and s.mode == SEGMENT:
                s.mode, s.cover, s.live = REPORT, INF, []     # back to reports (after the segments up to here)
        elif op == "width":
            c.set_width(key, args[0], epoch=args[1])
        elif op == "filter":        # kept until confirmed even when the protocol counts on it at once
            c.set_filter(key, args[0], args[1], keep_old=True, epoch=args[2], acked=args[3])
        elif op == "release":
            c.release(key, t)
        elif op == "seg" and (s.lost is None or s.gap):
            piece, e, a = args
            self._resume(key, s, n, t)
            s.mode, s.pend, s.cover, s.seg = SEGMENT, None, e, (a, piece[A])
            held = s.live or ([[list(s.pieces[-1]), INF]] if s.pieces else [])
            for g in held:          # what held before it holds until it surely began
                g[1] = min(g[1], piece[A])
            s.live = [g for g in held if g[1] > t] + [[piece, INF]]
            if record and s.lost is None:
                self._band(key, s, t)
        elif op == "band" and s.mode == SEGMENT:
            s.live = [g for g in s.live if g[1] > t]
            if record and s.lost is None:
                self._band(key, s, t)

    def _band(self, key, s, t):
        """The piece of a segment-mode source from ``t``: its segment's, or while the clock leaves open which of
        them held (a device's segment began between a − hi and a − lo) the hull of theirs until that is decided."""
        if len(s.live) == 1:
            return self._piece(key, s, list(s.live[0][0]))
        end = min(g[1] for g in s.live)
        lo, hi = INF, -INF
        for p, _ in s.live:
            for x in {max(t, p[A]), max(end, p[A])}:
                lo, hi = min(lo, value(p, LO, x)), max(hi, value(p, HI, x))
        self._piece(key, s, [t, lo, hi, 0.0, 0.0, next((p[5] for p, _ in s.live if p[5]), None), None])
        self._push(key, end, "band", ())

    def _record(self, key, s, t):
        lo, hi = self.cache.known(key)
        rs = self.sink.rng.get(key)
        mem = {r: self.cache.member(key, r) for r in rs} if rs else None
        f = self.cache.sources[key]
        fs = [f.filt] + f.old + [g for _, g in f.prior] if f.old or f.prior else (f.filt,)
        why = ("no reading yet", key) if any(g.center is None for g in fs) else None     # (or not before it)
        if why is None and s.lag and (lo == -INF or hi == INF):     # a source only lag queries read: its filter is
            why = ("awaiting segments", key)                        # infinite until its segments flow (again)
        self._piece(key, s, [t, lo, hi, 0.0, 0.0, why, mem])

    def _piece(self, key, s, p):
        ps = s.pieces
        floor = max(s.floor, ps[-1][A] if ps else -INF)
        if p[A] < floor:        # final answers went past (or a segment from before a loss): from there on its line
            p = [floor, value(p, LO, floor), value(p, HI, floor)] + p[3:]
        if ps and ps[-1][1:] == p[1:] and not (p[3] or p[4]):
            return
        if ps and ps[-1][A] == p[A]:
            ps[-1][1:] = p[1:]
            return
        ps.append(p)
        self.sink.piece(key, p)
        if len(ps) > 16:
            low = self.sink.low(key)
            i = 0
            while i + 1 < len(ps) and ps[i + 1][A] <= low:
                i += 1
            del ps[:i]
