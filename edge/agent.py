"""Device state machine: samples, control messages and time in; messages and the next timer out.

Olston et al. 2003 §3.1 (report on exit, shrink every T and re-check), Cheng et al. 2005 §3
(constraints, probes, shutdown), DESIGN.md §3 (epochs, birth/resync; sequence numbers, heartbeat marks and
ack mode's resends in ``edge.core.delivery``).
Sans-IO: every call takes ``now`` (the caller's clock) and returns a list of ``(channel, payload)``
where channel is ``"up"`` or ``"state"``. Bad samples and bad messages are counted, never raised.

Time is float32-safe (DESIGN.md §2). ``unit`` is the clock's units per second: 1000 on a board, whose
clock is integer milliseconds, so every time computation is integer arithmetic and ``t`` goes on the
wire exactly; 1 for float seconds (simulator, CPython). Device time is the caller's clock plus
``offset``: a clock that is not ``synced`` (NTP failed) takes the backend's from every config.
Shrink instants are the backend's: a config carries its tick origin, period and the number of periods
it has applied, and a width carries the period it was computed for, so no wall clock is trusted for
the count. Downlinks answer one birth (``to``) of one backend run (``inc``): a control message from
before the latest birth or from an earlier backend run is dropped, duplicates by a 30-entry window.
"""
import sys

from edge.core import codec
from edge.core.codec import NO_VALUE, newer, CAP_F32, CAP_MS, CAP_LINE, CAP_METER
from edge.core.delivery import Delivery
from edge.core.guard import guarded
from edge.core.interval import IntervalFilter, INF
from edge.core.window import current, fresh

FIRMWARE = "qf-0.2"
CATCH_UP = 64           # missed shrinks applied one by one; after more (a stall, a clock jump) the width is 0
F32 = 1.0 + 2.0 ** -30 == 1.0       # this interpreter's floats are single precision
_HEAD = 2 + 4 + 8 + 4 + 1 + len(FIRMWARE) + 1 + 1 + 1     # a birth without its source records
BOARD = sys.implementation.name == "micropython"


def _finite(v):
    return (isinstance(v, float) or isinstance(v, int)) and not isinstance(v, bool) and v == v and v != INF and v != -INF


class Agent:
    def __init__(self, device, sources, boot=0, caps=0, width=0.0, unit=1, synced=True, rnd=None, lines=None,
                 meter=True, resend=None):
        if not sources or len(sources) > codec.MAX_LIST:
            raise ValueError("an agent needs 1..255 sources")
        for name in sources:
            if not isinstance(name, str) or not 0 < len(name.encode()) <= codec.MAX_STR:
                raise ValueError("source names are 1..%d bytes of utf-8: %r" % (codec.MAX_STR, name))
        if unit != 1 and unit != 1000:
            raise ValueError("unit is 1 (float seconds) or 1000 (integer milliseconds)")
        self.device = device
        self.names = list(sources)
        self.index = {}
        for i, name in enumerate(self.names):
            self.index[name] = i
        self.rnd = rnd          # None (native floats) or edge.core.float32.f32 (emulate a single-precision board)
        self.filters = [IntervalFilter(width, (), 0, rnd) for _ in self.names]
        self.values = [None] * len(self.names)
        self.boot = boot
        if lines is None:       # lines cost a board heap (the module, two shadow filters per source): boards opt in
            lines = not BOARD
        self.caps = caps | (CAP_LINE if lines else 0) | (CAP_F32 if F32 or rnd is not None else 0) | \
            (CAP_MS if unit == 1000 else 0) | (CAP_METER if meter else 0)
        self.unit = unit
        self.synced = synced
        self.offset = 0         # device time = caller's clock + offset
        # numbering, heartbeat marks and ack mode's resend buffer (a few messages on a board's heap)
        self.delivery = Delivery(resend or (8 if BOARD else 16), 8192 if BOARD else None, boot)
        self.token = None       # boot ^ seq of the latest birth: every downlink must carry it
        self.inc = None         # incarnation of the backend run that configured us after that birth
        self.top = None         # highest downlink sequence number accepted in this session
        self.seen = 0           # bit k set: top - 1 - k was accepted
        self.period_ms = 0      # T; 0 disables shrinking
        self.t0_ms = 0          # tick origin: shrink k happens at t0 + k·T (backend time, ms)
        self.shrink = 0.0       # S
        self.period = 0         # number of shrinks applied (the backend's period count)
        self.summaries = None   # source index -> swat_asr.Replicator, allocated by the first summary control
        self.alt = None         # per source edge.core.predict.Chooser, once the backend allows lines
        self.allow = 1          # filter models allowed (edge.core.predict bits), from the ``setup`` control
        self.segs = None        # source index -> segment.Segmenter (segment mode), allocated by the first segment control
        self.meter = None       # edge.core.meter.Meter (plain deadband's shadow filters), from the first METER control
        self.guard = 0          # guard time after a report (clock units; ``link``), 0: none
        self.guards = {}        # source index -> (until, lo, hi): readings outside [lo, hi] are reported until then
        self.stats = {"samples": 0, "reports": 0, "bad_samples": 0, "bad_messages": 0, "probes": 0,
                      "stale": 0, "unsupported": 0}

    # -- time -----------------------------------------------------------------
    def _ms(self, ms):
        """Integer milliseconds in this clock's units."""
        return ms if self.unit == 1000 else ms / 1000

    def stamp(self, now):
        """Device time at the caller's ``now`` as decimal seconds text (ground-truth logs)."""
        t = now + self.offset
        if self.unit == 1:
            return repr(t)
        sign = "-" if t < 0 else ""
        t = abs(t)
        return "%s%d.%03d" % (sign, t // 1000, t % 1000)

    # -- outgoing -------------------------------------------------------------
    def _up(self, now, kind, fields):
        return ("up", self.delivery.number(now, kind, fields))

    def _report(self, now, i, why, constant=False, segs=None):
        """Report source ``i``'s current value stamped ``now`` and recentre on it; when lines are
        allowed (edge.core.predict) the chosen model starts there, and only a line needs a ``line``.
        ``segs``: segment records riding along (a constant report, kind ``rsegs``: edge.core.segment)."""
        f = self.filters[i]
        v = self.values[i]
        kind, mt = "report", self.meter
        if mt is not None and mt.departed[i] and segs is None and mt.owes(i) and (why == codec.WHY_EXIT or
                                                                               why == codec.WHY_GAP):
            from edge.core import meter
            return meter.back(self, now, i)     # its models lost to plain deadband's: back to it
        self.stats["reports"] += 1
        fields = {"src": i, "epoch": f.epoch, "t": now, "v": v, "why": why}
        guarded = self.guard and f.center is not None and f.lo != -INF
        if guarded:
            # while the backend does not know when this reading came (clock skew), it states the hull of the
            # bound before it and this value: a reading outside that hull within the guard is reported too
            self.guards[i] = (now + self.guard, min(f.lo, v), max(f.hi, v))
        if mt is not None and mt.shadows[i] is None:
            mt.count(i)         # the filter is deadband's: so is the report
        if self.alt is None or mt is not None and not mt.free(i):
            f.recenter(v)       # (a twin whose departures lost stays deadband's constant filter: edge.core.meter)
        else:
            fields["why"] |= self.alt[i].report(f, now, v, self.allow, constant)     # (a lead's flag)
            if f.slope:
                fields["slope"], fields["gap"] = f.slope, f.gap
                kind = "line"
            if mt is not None and mt.shadows[i] is None and (f.slope or f.led):
                mt.fork(self, i, True)      # it departs from deadband's constant filter: a shadow carries that on
        if segs is not None and kind == "report":   # (segment mode: outside the backend's ledger, no counts)
            fields["segs"] = segs
            kind = "rsegs"
        elif mt is not None:
            kind = mt.stamp(i, fields, kind)
        if guarded:
            fields["why"] |= codec.GUARDED
        return self._up(now, kind, fields)

    def _exit(self, now, i, why, ack=0):
        """Report source ``i`` after a shrink or an assignment; in segment mode with the pending segments."""
        if self.segs and i in self.segs:
            from edge.core import segment
            return segment.ride(self, now, i, why, ack)
        return [self._report(now, i, why)]

    def start(self, now):
        """Birth (also sent after every reconnect), in parts when one payload cannot hold every source."""
        return self._start(now + self.offset)

    def _start(self, now):
        recs = []
        if self.meter is not None:
            self.meter.birth(self.values)
        for i, f in enumerate(self.filters):
            v = self.values[i]
            if v is not None:
                f.recenter(v)
            recs.append({"name": self.names[i], "epoch": f.epoch, "width": f.width,
                         "v": NO_VALUE if v is None else v})
        out = []
        first = 0
        while first < len(recs):
            size, j = _HEAD, first
            while j < len(recs) and size + codec.record_size(recs[j]) <= codec.MAX_PAYLOAD:
                size += codec.record_size(recs[j])
                j += 1
            out.append(("state", self.delivery.number(now, "birth", {"t": now, "boot": self.boot, "fw": FIRMWARE,
                        "caps": self.caps, "first": first, "sources": recs[first:j]}, False)))
            if first == 0:
                self.token = (self.boot ^ self.delivery.seq) & 0xFFFFFFFF
            first = j
        self.inc = self.top = None
        self.seen = 0
        self.guards = {}
        self.delivery.born(now)
        return out

    def will(self):
        """Payload of the Last Will registered with the broker."""
        return codec.encode("gone", {"boot": self.boot})

    # -- inputs ---------------------------------------------------------------
    def handle_sample(self, now, source, value):
        now += self.offset
        i = self.index.get(source, source) if isinstance(source, str) else source
        ok = isinstance(i, int) and 0 <= i < len(self.filters) and _finite(value)
        if ok:
            try:
                value = float(value) if self.rnd is None else self.rnd(value)
            except OverflowError:
                ok = False
        if not ok or not _finite(value):
            self.stats["bad_samples"] += 1
            return []
        self.stats["samples"] += 1
        self.values[i] = value
        f = self.filters[i]
        if self.meter is not None:
            self.meter.sample(self, i, now, value)
        if self.segs is not None and i in self.segs:
            from edge.core import segment
            return segment.sample(self, now, i, value)
        if self.alt is not None:
            self.alt[i].sample(now, value, f.width)
            f.at(now)
        out = []
        if f.center is None:
            out.append(self._report(now, i, codec.WHY_FIRST))
        elif f.check(value) or (i in self.guards and guarded(self.guards, i, now, value)):
            out.append(self._report(now, i, codec.WHY_EXIT))
        elif self.meter is not None and self.meter.due(i):
            out.append(self._report(now, i, codec.WHY_METER))      # deadband's count, lest it go unseen
        if self.summaries is not None and i in self.summaries:
            from edge.core import swat_asr      # loaded only on devices that summarise
            out += swat_asr.ship(self, now, i, self.summaries[i].sample(now, value))
        return out

    def handle_message(self, now, payload):
        try:
            kind, m = codec.decode(payload)
            return self._apply(now + self.offset, kind, m)
        except (codec.CodecError, ValueError, KeyError, IndexError, TypeError):
            self.stats["bad_messages"] += 1
            return []

    def _fresh(self, seq):
        ok, self.top, self.seen = fresh(self.top, self.seen, seq)
        return ok

    def _apply(self, now, kind, m):
        if codec.SCHEMAS[kind][1] != "down":
            raise ValueError("not a control message")
        # a birth may be asked for whatever birth the backend saw last; every control must come from
        # a current backend run, and all but a rebirth must answer our latest birth
        if not current(self.inc, kind, m["inc"]) or (kind != "rebirth" and m["to"] != self.token):
            self.stats["stale"] += 1    # sent before our latest birth, or by an earlier backend run
            return []
        if kind == "rebirth":
            return self._start(now)
        config = kind == "config" or kind == "setup"
        if config and m["inc"] != self.inc:
            self.inc, self.top, self.seen = m["inc"], None, 0
        if not self._fresh(m["seq"]):
            return []
        if config:
            self._configure(now, m)
            if kind == "setup":
                self._models(m["allow"])
            return []
        if kind == "ack":
            self.delivery.acked(m["upto"])
            return []
        if kind == "nack":
            return [("up", p) for p in self.delivery.nacked(now, m["upto"], m["miss"])]
        if kind == "link":
            self.delivery.link(self._ms(m["rto"]))
            self.guard = self._ms(m["guard"])
            return []
        i = m["src"]
        if i >= len(self.filters):
            raise ValueError("unknown source index")
        if kind == "segment":
            try:
                from edge.core import segment
            except ImportError:         # a board built without segment mode: say so, keep running
                self.stats["unsupported"] += 1
                return []
            return segment.configure(self, now, i, m)
        if kind == "summary":
            try:
                from edge.core import swat_asr
            except ImportError:         # a board built without SWAT: say so, keep running
                self.stats["unsupported"] += 1
                return []
            return swat_asr.configure(self, now, i, m)
        f = self.filters[i]
        if kind == "probe":
            self.stats["probes"] += 1
            v = self.values[i]
            if v is None:
                v = NO_VALUE
            else:
                f.recenter(v)
            return [self._up(now, "reply", {"src": i, "epoch": f.epoch, "t": now, "v": v, "probe": m["probe"]})]
        if not newer(m["epoch"], f.epoch):
            return []   # stale or duplicate assignment
        if self.meter is not None or m["ack"] & ~1:       # plain deadband's filter (edge.core.meter)
            from edge.core import meter
            out = meter.control(self, now, i, kind, m)
            if out is not None:
                return out
        if kind == "width":
            f.set_width(m["width"], m["epoch"])
            if self.shrink:
                for _ in range(self.period - m["period"]):   # the shrinks since the backend computed it
                    f.shrink(self.shrink)
        elif kind == "bound":
            f.set_bound(m["lo"], m["hi"], m["epoch"])
        else:
            f.set_filter(m["width"], [(c["l"], c["u"]) for c in m["cons"]], m["epoch"])
        v = self.values[i]
        if v is not None and (m["ack"] & codec.ACK or f.check(v)):
            return self._exit(now, i, codec.WHY_ASSIGN, m["ack"] & codec.ACK)
        return []

    def _configure(self, now, m):
        if not (0 <= m["shrink"] < 1):
            raise ValueError("bad config")
        if not self.synced:
            self.offset += self._ms(m["now"]) - now     # no clock of our own: take the backend's
        same = m["t0"] == self.t0_ms and m["period"] == self.period_ms
        self.t0_ms, self.period_ms = m["t0"], m["period"]
        self.shrink = m["shrink"]
        self.delivery.beat = self._ms(codec.beat_ms(m["beat"]))
        self.period = max(self.period, m["tick"]) if same else m["tick"]

    def _models(self, allow):
        """The backend's filter models: lines need edge.core.predict (loaded only then); a filter
        keeps its line until its next report, which follows the new ``allow``."""
        self.allow = allow
        if allow & 2 and self.alt is None:
            try:
                from edge.core import predict
                filters = []
                for f in self.filters:
                    g = predict.LineFilter(f.width, f.cons, f.epoch, self.rnd)
                    g.center, g.mask, g.lo, g.hi, g.v0 = f.center, f.mask, f.lo, f.hi, f.center or 0.0
                    filters.append(g)
                alt = [predict.Chooser(self.rnd, self.unit) for _ in filters]
            except (ImportError, MemoryError):     # a board built without lines, or too small: stay constant
                self.stats["unsupported"] += 1
                return
            self.filters, self.alt = filters, alt

    # -- time -----------------------------------------------------------------
    def _shrink_at(self):
        return self._ms(self.t0_ms + (self.period + 1) * self.period_ms)

    def next_deadline(self):
        """The caller's time of the next shrink, resend, heartbeat mark, line gap or data due, or None."""
        ts = [self.delivery.deadline()]
        if self.period_ms > 0 and self.shrink > 0:
            ts.append(self._shrink_at())
        if self.alt is not None:
            from edge.core import predict
            ts.append(predict.deadline(self))
        if self.segs:
            from edge.core import segment
            ts.append(segment.deadline(self))
        ts = [t for t in ts if t is not None]
        return min(ts) - self.offset if ts else None

    def handle_timer(self, now):
        now += self.offset
        out = []
        if self.alt is not None:
            from edge.core import predict
            out += predict.gaps(self, now)
        if self.period_ms > 0 and self.shrink > 0:
            at = self._shrink_at()
            n = 0
            while at <= now:
                n += 1
                jump = n > CATCH_UP     # a stall or a clock jump: no loop of millions; the narrowest
                if jump:                # bound (width 0) is always safe
                    ms = now if self.unit == 1000 else now * 1000
                    self.period = int((ms - self.t0_ms) // self.period_ms) - 1
                    at = self._shrink_at()
                self.period += 1        # stamp the re-check at the shrink instant
                for i, f in enumerate(self.filters):
                    if jump:
                        f.set_width(0.0, f.epoch)
                    else:
                        f.shrink(self.shrink)
                    v = self.values[i]
                    if v is not None and f.check(v):
                        out += self._exit(at, i, codec.WHY_SHRINK)
                if jump:
                    break
                at = self._shrink_at()
        complete = now
        if self.segs:
            from edge.core import segment
            out += segment.flush(self, now)
            complete = segment.complete(self, now)
        for payload in self.delivery.due(now, bool(out), complete):
            out.append(("up", payload))
        return out
