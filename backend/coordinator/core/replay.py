"""The final mirror (DESIGN.md §4 final answers): Olston et al. 2003 §1.2.3 bounds replayed in event time, in
each device's own sequence order; segments (Elmeleegy et al. 2009) taken the same way.

The live mirror applies an uplink when the λ-queue releases it: a late one at the current clock, a reordered
older report not at all, so its history of bounds is not exact. Here every uplink the coordinator releases
is taken in its device's sequence order once no number before it is missing, at its own event time, with the
backend's controls (widths, filters with their epochs, periodic shrinks, segment modes) at the event times they
were made, into a bound cache of its own (the same hull rules: a narrowing keeps the old mirror until a report
carries its epoch, here whether the protocol counts on it or not; a report from a clock off by up to σ keeps
the mirrors before it until the latest instant it can have happened). After each instant a source's known
bound is recorded as a piece ``[a, lo, hi, dlo, dhi, why, mem]`` (``lines.py``); a source in segment mode
records its segments instead.

**Watermark.** A device's uplinks are complete through the event time of the latest one with no missing number
before it (``W``; a ``mark`` proves its stamp once every number up to its ``seq`` is in). A report-mode source's
pieces hold before ``W``; a segment-mode source's before W − D (data of τ is sent by τ + D; a committed line
is not trusted past what was heard), or a mark's stamp. A device found out of sync (a lost uplink, silence, a
reboot, lost state, a skewed clock) or gone is *lost*: its sources' pieces say why from their watermark on, and
move with the clock (so a dead device never stalls a query's final answers), until a birth restates the device
(from the latest instant it can have been sent). Controls are kept until replayed: the coordinator makes them
at its event clock, which every released uplink's time is at most.
"""
import heapq
import math

from backend.coordinator.core.boundcache import BoundCache, shrink_source
from backend.coordinator.core.integrity import SKEWED, newer
from backend.coordinator.core.lines import A, LO
from backend.coordinator.core.segments import PAD, before
from edge.core.codec import CAP_F32, CAP_MS, NO_VALUE
from edge.core.segment import MAX_RECORDS
from edge.core.predict import horizon

INF = math.inf
REPORT, SEGMENT = 0, 1
BUFFER = 256            # uplinks held behind a missing number at most (integrity's window)


class FinalCache(BoundCache):
    """A bound cache replayed one source at a time: a line's next restatement is kept on its source only."""

    def refresh(self, s, t):
        s.due = t + horizon(s.filt.gap) / s.unit


class Dev:
    __slots__ = ("boot", "next", "buf", "w", "mark", "marks", "lost", "keys", "single", "unit", "fresh")

    def __init__(self, boot):
        self.boot = boot
        self.next = None        # the next sequence number due
        self.buf = {}           # seq -> (kind, m) received ahead of a missing number
        self.w = -INF           # watermark: event time of the latest contiguous uplink
        self.mark = -INF        # the latest mark's stamp proven (every number up to its seq in)
        self.marks = []         # (seq, t) of marks waiting for their numbers
        self.lost = None        # (reason, device) while lost
        self.keys = []
        self.single = False
        self.unit = 1
        self.fresh = True       # a new boot: its device starts over (reports, no segments)


class Src:
    __slots__ = ("device", "heap", "pieces", "mode", "lag", "pend", "limit", "floor", "si", "cover", "lost",
                 "taken", "proof", "gap")

    def __init__(self, device):
        self.device = device
        self.heap = []          # (t, n, op, args) not replayed yet
        self.pieces = []
        self.mode = REPORT
        self.lag = 0.0          # D of the segment mode it was last told
        self.pend = None        # event time a segment mode was told while it still reports
        self.limit = -INF       # its pieces hold before this
        self.floor = -INF       # no piece may start before this (final answers went past it)
        self.si = 0             # index of its next shrink
        self.cover = INF        # end of its last segment (INF: goes on)
        self.lost = None
        self.taken = None       # end of the last segment taken in (INF: committed, goes on); None: reporting
        self.proof = -INF       # its segments are complete before this (a whole flush heard)
        self.gap = 0            # lost for an uplink lost: known again from the next report or segment taken in
        #                         after this many (the intake's count then)


class Replay:
    def __init__(self, sink):
        self.sink = sink        # .piece(key, p), .moved(key), .floor(key), .low(key), .rng {key: count ranges}
        self.cache = FinalCache()
        self.dev = {}
        self.src = {}
        self.shrinks = []       # (t, fraction) of every periodic shrink
        self.n = 0

    # -- intake ---------------------------------------------------------------------------------------
    def uplink(self, device, kind, m):
        """An uplink as the coordinator releases it (``m["t"]`` its event time, ``m["boot"]`` its boot)."""
        d = self.dev.get(device)
        if d is not None and m["boot"] != d.boot and not newer(m["boot"], d.boot):
            return      # of an earlier boot (a birth delayed across a reboot): superseded
        restart = kind == "birth" and m["first"] == 0 and (
            d is None or d.boot != m["boot"] or d.lost is not None or m["seq"] != d.next and newer(m["seq"], d.next))
        if restart and d is not None and d.lost is not None and d.lost[0] == SKEWED:
            return      # a clock found off by more than σ stays off: its times cannot be placed
        if restart:
            d = self._restart(device, m)
        if d is None or m["boot"] != d.boot or not newer(m["seq"], d.next - 1) or d.lost is not None and not restart:
            return
        if m["seq"] == d.next and not d.buf and kind != "mark":     # (in order, as most are)
            d.next = (d.next + 1) & 0xFFFFFFFF
            self._apply(device, d, kind, m)
            if m["t"] > d.w:
                d.w = m["t"]
            if d.marks:
                self._drain(device, d)
            else:
                for key in d.keys:
                    self._advance(key)
            return
        if kind == "mark":
            d.marks.append((m["seq"], m["t"]))
        elif len(d.buf) < BUFFER:
            d.buf[m["seq"]] = (kind, m)
        self._drain(device, d)

    def _restart(self, device, m):
        """Follow ``device`` from birth ``m`` on (a new boot, a lost device, or numbers missing before it): its
        sources are lost from their watermark until the birth can have been sent."""
        d = self.dev.get(device)
        if d is not None and d.lost is None and d.boot == m["boot"]:     # (what is held past the gap goes too:
            for key in d.keys:                                           # it may lie after another one)
                if key is not None:
                    self._lose(key, ("lost uplink", device), True)
        elif d is not None and d.lost is None:
            self._offline(device, d, ("rebooted", device))
        if d is None or d.boot != m["boot"]:
            old = d
            d = self.dev[device] = Dev(m["boot"])
            if old is not None:
                d.keys, d.lost, d.w, d.mark = old.keys, old.lost, old.w, old.mark
        d.buf = {s: x for s, x in d.buf.items() if newer(s, m["seq"])}
        d.next = m["seq"]
        d.marks = []
        return d

    def _drain(self, device, d):
        while d.next in d.buf:
            kind, m = d.buf.pop(d.next)
            d.next = (d.next + 1) & 0xFFFFFFFF
            self._apply(device, d, kind, m)
            d.w = max(d.w, m["t"])
        while d.marks and not newer(d.marks[0][0], d.next - 1):
            d.mark = max(d.mark, d.marks.pop(0)[1])
        for key in d.keys:
            self._advance(key)

    def _apply(self, device, d, kind, m):
        t = m["t"]
        if kind == "birth":
            self._birth(device, d, m)
        elif kind in ("report", "reply", "line") and m["src"] < len(d.keys) and m["v"] != NO_VALUE:
            line = (m["td"], m["slope"], m["gap"]) if kind == "line" and m["gap"] > 0 else None
            key = d.keys[m["src"]]
            self._push(key, t, "report", (m["epoch"], m["v"], line, m.get("hull", t), kind))
            if kind != "reply" and key is not None:
                self.src[key].taken = None
        elif kind == "segs":
            for r in m["segs"]:
                if r["src"] < len(d.keys) and d.keys[r["src"]] is not None:
                    self._segment(d.keys[r["src"]], d, r)
            if len(m["segs"]) < MAX_RECORDS:    # a whole flush (edge.core.segment.flush): every segment source's
                for key in d.keys:              # closed segments are in, an open one starts at the last end,
                    s = self.src.get(key)       # a committed one holds through now
                    if s is not None and s.taken is not None:
                        s.proof = max(s.proof, t if s.taken == INF else s.taken)

    def _birth(self, device, d, m):
        if m["first"] == 0:
            d.single = bool(m["caps"] & CAP_F32)
            d.unit = 1000 if m["caps"] & CAP_MS else 1
        fresh, d.fresh, d.lost = d.fresh, False, None
        t = m["t"]
        hull = max(m.get("hull", t), t)
        for i, rec in enumerate(m["sources"], m["first"]):
            key = rec["name"]
            s = self.src.get(key)
            if s is not None and s.device != device:
                continue        # owned by another device (the live mirror counts the conflict)
            if s is None:
                s = self.src[key] = Src(device)
                s.si = len(self.shrinks)
                while s.si and self.shrinks[s.si - 1][0] > t:
                    s.si -= 1
            while len(d.keys) <= i:
                d.keys.append(None)
            d.keys[i] = key
            v = None if rec["v"] == NO_VALUE else rec["v"]
            args = (i, rec["width"], rec["epoch"], v, d.single, d.unit, hull)
            if s.lost is not None and not s.gap:    # what came before is unknown: replayed without pieces, then the birth
                self._replay(key, t, record=False)
                self._op(key, s, t, self.n, "birth", args, True)
                if fresh:       # a new boot reports until told its segment mode again
                    s.mode, s.pend, s.cover, s.taken = REPORT, None, INF, None
                if s.mode == REPORT:
                    self._record(key, s, t)
                s.limit = -INF
            else:
                self._push(key, t, "birth", args)

    def _segment(self, key, d, r):
        """One segment record (``edge.core.segment``): a piece of its own, or the end of the last one."""
        s = self.src[key]
        unit = d.unit
        a, e = r["a"] / unit, (INF if r["f"] & 1 else r["e"] / unit)
        slope, v, h = r["s"] * unit, r["v"], r["w"] / 2
        pad, grow = PAD[d.single] * (abs(v) + h), PAD[d.single] * abs(slope)
        piece = [a, v - h - pad, v + h + pad, slope - grow, slope + grow, None, None]
        s.taken = e     # (a source's records come in time order, a committed one's end after it)
        if s.pieces and s.mode == SEGMENT and a == s.pieces[-1][A] and a < s.limit:
            s.cover = e         # a committed line's end (the same line): it holds until then
            self.sink.moved(key)
        elif a >= s.limit:
            self._push(key, a, "seg", (piece, e))

    # -- controls ---------------------------------------------------------------------------------------
    def control(self, key, t, op, args):
        """A control made at event time ``t``: ``("width", (width, epoch))`` or ``("filter", (width, cons, epoch))``."""
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

    def offline(self, device, why):
        """``device`` is out of sync or gone (``why``: (reason, device)): lost until its next birth; for a lost
        uplink, the numbers missing before those held are skipped and each source is unknown until it reports
        again (a report restates the value, its epoch which of the mirrors' filters the device is on)."""
        d = self.dev.get(device)
        if d is None or d.lost is not None or why[0] == "lost uplink" and not d.buf:
            return      # (a gap found again, or none here: nothing missing before what was taken)
        self._offline(device, d, why)

    def _offline(self, device, d, why):
        gap = why[0] == "lost uplink"
        for key in d.keys:
            if key is not None:
                self._lose(key, why, gap)
        d.marks = []
        if not gap:
            d.lost, d.buf = why, {}
        elif d.buf:
            d.next = min(d.buf, key=lambda x: (x - d.next) & 0xFFFFFFFF)
            self._drain(device, d)

    def _lose(self, key, why, gap=False):
        s = self.src[key]
        if s.lost is not None:      # (lost again: only what is taken in after this gap speaks for it)
            s.gap = self.n if gap and s.gap else 0
            if not s.gap and s.limit != INF:
                s.limit = INF
                self.sink.moved(key)
            return
        self._replay(key, s.limit)
        s.lost, s.gap = why, self.n if gap else 0
        self._piece(key, s, [s.limit, -INF, INF, 0.0, 0.0, why, None])
        if not gap:
            s.limit = INF
            self.sink.moved(key)

    def _resume(self, key, s, n, hull):
        """A gap-lost source speaks again (by an uplink taken after the gap): known from the latest instant it
        can have spoken (``hull``), never before a final answer went."""
        if s.lost is not None and s.gap and n > s.gap:
            s.lost, s.gap = None, 0
            s.floor = max(s.floor, hull, self.sink.floor(key))

    # -- replay -----------------------------------------------------------------------------------------
    def _push(self, key, t, op, args):
        self.n += 1
        heapq.heappush(self.src[key].heap, (t, self.n, op, args))

    def _advance(self, key):
        """Replay ``key`` as far as its device's uplinks are complete; its limit moves there."""
        if key is None:
            return
        s = self.src[key]
        if s.lost is not None and not s.gap:
            return
        d = self.dev[s.device]
        if s.mode == SEGMENT:
            lim = max(before(d.w, s.lag), d.mark)
        elif s.pend is not None:
            lim = max(min(d.w, s.pend), before(d.w, s.lag), d.mark)
        else:
            lim = max(d.w, d.mark)
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
                        shrink_source(f, b[2])
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
            if s.lost is not None and (not s.gap or n > s.gap):     # what it was before is unknown: the birth
                s.lost, s.gap = None, 0                             # speaks from its latest instant
                s.floor = max(s.floor, hull, self.sink.floor(key))
        elif key not in c.sources:
            return
        elif op == "report":
            epoch, v, line, hull, kind = args
            if hull > t:
                c.hold(key, hull)
                self._push(key, hull, "release", ())
            c.report(key, epoch, t, v, line)
            if s.lost is not None:
                self._resume(key, s, n, hull)
            if kind != "reply" and s.mode == SEGMENT:
                s.mode, s.cover = REPORT, INF     # back to reports (after the segments up to here)
        elif op == "width":
            c.set_width(key, args[0], epoch=args[1])
        elif op == "filter":        # kept until confirmed even when the protocol counts on it at once
            c.set_filter(key, args[0], args[1], keep_old=True, epoch=args[2])
        elif op == "release":
            c.release(key, t)
        elif op == "seg" and (s.lost is None or s.gap):
            piece, e = args
            self._resume(key, s, n, t)
            s.mode, s.pend, s.cover = SEGMENT, None, e
            if record and s.lost is None:
                self._piece(key, s, piece)

    def _record(self, key, s, t):
        lo, hi = self.cache.known(key)
        rs = self.sink.rng.get(key)
        mem = {r: self.cache.member(key, r) for r in rs} if rs else None
        f = self.cache.sources[key]
        fs = [f.filt] + f.old + [g for _, g in f.prior] if f.old or f.prior else (f.filt,)
        why = ("no reading yet", key) if any(g.center is None for g in fs) else None     # (or not before it)
        self._piece(key, s, [t, lo, hi, 0.0, 0.0, why, mem])

    def _piece(self, key, s, p):
        ps = s.pieces
        floor = max(s.floor, ps[-1][A] if ps else -INF)
        if p[A] < floor:        # final answers went past (or a segment from before a loss): from there on its line
            p = [floor, p[LO] + p[3] * (floor - p[A]) if p[3] and abs(p[LO]) < INF else p[LO],
                 p[2] + p[4] * (floor - p[A]) if p[4] and abs(p[2]) < INF else p[2]] + p[3:]
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

