"""Each device's uplinks in its own sequence order (DESIGN.md §3 sequence numbers; §4 watermarks): the final
mirror's intake, a mixin of ``replay.Replay``.

An uplink the coordinator releases is held until every number before it is in, then taken at its event time.
This buffer only orders the replay: gaps, marks and the device's watermark are ``integrity.py``'s (the one
sequence tracking), read through the sink (``watermark``): integrity's watermark and latest proven mark, capped by
the coordinator's release clock and by what is still held here. A birth whose number does not follow (a reboot,
numbers lost before it) starts the sequence again there. Numbers found lost for good (integrity's "lost uplink") are skipped: each source of the
device is unknown from its watermark until an uplink taken after the gap speaks for it. Other findings (gone,
silent, rebooted, lost state, skewed) make the device lost until its next birth.
"""
import math

from backend.coordinator.core.integrity import SKEWED, newer
from backend.coordinator.core.lines import A
from backend.coordinator.core.segments import PAD
from edge.core.codec import CAP_F32, CAP_MS, NO_VALUE, newer as later
from edge.core.segment import MAX_RECORDS

INF = math.inf
REPORT, SEGMENT = 0, 1
BUFFER = 256            # uplinks held behind a missing number at most (integrity's window)


class Dev:
    __slots__ = ("boot", "next", "buf", "last", "hole", "lost", "keys", "single", "unit", "fresh")

    def __init__(self, boot):
        self.boot = boot
        self.next = None        # the next sequence number due
        self.buf = {}           # seq -> (kind, m) received ahead of a missing number
        self.last = -INF        # event time of the latest uplink taken (they are taken no earlier)
        self.hole = False       # numbers were skipped: the next one may never come (a birth superseded it)
        self.lost = None        # (reason, device) while lost
        self.keys = []
        self.single = False
        self.unit = 1
        self.fresh = True       # a new boot: its device starts over (reports, no segments)


class Src:
    __slots__ = ("device", "heap", "pieces", "mode", "lag", "pend", "limit", "floor", "si", "cover", "lost",
                 "taken", "proof", "gap", "ep", "live", "seg")

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
        self.live = []          # [piece, until]: the segments (or piece before them) its value may be in now
        self.seg = None         # (device start, piece start) of its latest segment replayed
        self.ep = None          # the newest filter epoch its device's uplinks carried in this boot



class Sequence:
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
        if d is None or m["boot"] != d.boot:
            return
        if d.lost is not None and not restart:      # held: the birth it waits for may come after it (reordered),
            if len(d.buf) < BUFFER and kind != "birth":     # and what it numbered after itself is kept then
                d.buf[m["seq"]] = (kind, m)
            return
        if not newer(m["seq"], d.next - 1):
            return
        if m["seq"] == d.next:
            d.hole = False
        if m["seq"] == d.next and not d.buf:        # (in order, as most are)
            d.next = (d.next + 1) & 0xFFFFFFFF
            self._apply(device, d, kind, m)
            for key in d.keys:
                self._advance(key)
            return
        if len(d.buf) < BUFFER:
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
                d.keys, d.lost = old.keys, old.lost
        d.buf = {s: x for s, x in d.buf.items() if newer(s, m["seq"])}
        d.next = m["seq"]
        d.hole = False
        return d

    def _drain(self, device, d):
        while d.next in d.buf:
            kind, m = d.buf.pop(d.next)
            d.next = (d.next + 1) & 0xFFFFFFFF
            self._apply(device, d, kind, m)
        for key in d.keys:
            self._advance(key)

    def _rebooted(self, device, d, kind, m):
        """Whether ``m`` carries a filter epoch older than one its device already sent in this boot: a device's
        epochs never go back within a boot, so it rebooted unseen (its birth lost) and its sequence numbers
        started again, this one only seeming to follow; the device is lost from its watermark (``rebooted``)."""
        recs = m["segs"] if kind in ("segs", "rsegs") else ()
        if kind in ("report", "reply", "line", "rsegs"):
            recs = list(recs) + [m]
        for r in recs:
            key = d.keys[r["src"]] if r["src"] < len(d.keys) else None
            s = self.src.get(key)
            if s is not None and s.ep is not None and later(s.ep, r["epoch"]):
                self._offline(device, d, ("rebooted", device))
                return True
        for r in recs:
            s = self.src.get(d.keys[r["src"]] if r["src"] < len(d.keys) else None)
            if s is not None and (s.ep is None or later(r["epoch"], s.ep)):
                s.ep = r["epoch"]
        return False

    def _apply(self, device, d, kind, m):
        # an uplink sent after another happened after it: its event time (its stamp less the clock's upper bound
        # when it came, which loosens with age) is taken no earlier than the one before it in sequence order
        t = d.last = max(m["t"], d.last)
        if kind != "birth" and self._rebooted(device, d, kind, m):
            return
        if kind == "birth":
            self._birth(device, d, m, t)
        elif kind in ("report", "reply", "line", "rsegs") and m["src"] < len(d.keys) and m["v"] != NO_VALUE:
            line = (m["td"], m["slope"], m["gap"]) if kind == "line" and m["gap"] > 0 else None
            key = d.keys[m["src"]]
            self._push(key, t, "report", (m["epoch"], m["v"], line, m.get("hull", t), kind, m.get("tight"), m.get("lead", 0)))
            if kind not in ("reply", "rsegs") and key is not None:
                self.src[key].taken = None
        if kind in ("segs", "rsegs"):      # (an rsegs report's segments after its report: edge.core.segment.ride)
            for r in m["segs"]:
                if r["src"] < len(d.keys) and d.keys[r["src"]] is not None:
                    self._segment(d.keys[r["src"]], d, r, m.get("clock", (0.0, 0.0)))
            if len(m["segs"]) < MAX_RECORDS:    # a whole flush (edge.core.segment.flush): every segment source's
                for key in d.keys:              # closed segments are in, an open one starts at the last end,
                    s = self.src.get(key)       # a committed one holds through now
                    if s is not None and s.taken is not None:
                        s.proof = max(s.proof, t if s.taken == INF else s.taken)

    def _birth(self, device, d, m, t):
        if m["first"] == 0:
            d.single = bool(m["caps"] & CAP_F32)
            d.unit = 1000 if m["caps"] & CAP_MS else 1
        fresh, d.fresh, d.lost = d.fresh, False, None
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
            s.ep = rec["epoch"]
            args = (i, rec["width"], rec["epoch"], v, d.single, d.unit, hull)
            if s.lost is not None and not s.gap:    # what came before is unknown: replayed without pieces (a birth
                self._replay(key, t, record=False)  # among them is older than the loss: still lost), then the
                self._op(key, s, t, self.n, "birth", args, True)    # birth, which speaks from its latest instant
                self._known(key, s, hull)
                if fresh:       # a new boot reports until told its segment mode again
                    s.mode, s.pend, s.cover, s.taken, s.live = REPORT, None, INF, None, []
                if s.mode == REPORT:
                    self._record(key, s, t)
                s.limit = -INF
                self.sink.moved(key)    # (its final queries wait for it again: it holds nowhere until its watermark)
            else:
                self._push(key, t, "birth", args)

    def _segment(self, key, d, r, clock):
        """One segment record (``edge.core.segment``) stamped by a clock whose lead lies in ``clock`` (lo, hi):
        a piece of its own, or the end of the last one. In event time it starts between a − hi and a − lo; from
        a − lo on its line holds, widened by what its slope moves in hi − lo (replay ``_band``: before, the hull
        with the piece before it), and it is sure to hold until e − hi."""
        s = self.src[key]
        unit, (lo, hi) = d.unit, clock
        a, e = r["a"] / unit, (INF if r["f"] & 1 else r["e"] / unit - hi)
        slope, v, h, wob = r["s"] * unit, r["v"], r["w"] / 2, hi - lo
        pad, grow = PAD[d.single] * (abs(v) + h), PAD[d.single] * abs(slope)
        dlo, dhi = slope - grow, slope + grow
        piece = [a - lo, v - h - pad + min(0.0, dlo * wob), v + h + pad + max(0.0, dhi * wob), dlo, dhi, None, None]
        s.taken = e     # (a source's records come in time order, a committed one's end after it)
        if s.pieces and s.mode == SEGMENT and s.seg is not None and s.seg[0] == a and s.seg[1] == s.pieces[-1][A] \
                and s.seg[1] < s.limit:
            s.cover = e         # a committed line's end (the same line): it holds until then
            self.sink.moved(key)
        elif a - lo >= s.limit:
            self._push(key, a - hi, "seg", (piece, e, a))

    def offline(self, device, why):
        """``device`` is out of sync or gone (``why``: (reason, device)): lost until its next birth; for a lost
        uplink, the numbers missing before those held are skipped and each source is unknown until it reports
        again (a report restates the value, its epoch which of the mirrors' filters the device is on). With
        nothing held past the gap they are unknown from their limits all the same: integrity's watermark moves
        past numbers a birth made no longer missing before that birth reaches this intake."""
        d = self.dev.get(device)
        if d is None or d.lost is not None:
            return
        self._offline(device, d, why)

    def _offline(self, device, d, why):
        gap = why[0] == "lost uplink"
        for key in d.keys:
            if key is not None:
                self._lose(key, why, gap)
        if not gap:
            d.lost, d.buf = why, {}
        elif d.buf:
            d.next = min(d.buf, key=lambda x: (x - d.next) & 0xFFFFFFFF)
            d.hole = True       # (what follows the numbers held may be missing too: until the next one comes)
            self._drain(device, d)
