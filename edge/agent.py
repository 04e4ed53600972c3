"""Device state machine: samples, control messages and time in; messages and the next timer out.

Olston et al. 2003 §3.1 (report on exit, shrink every T and re-check), Cheng et al. 2005 §3
(constraints, probes, shutdown), DESIGN.md §3 (epochs, sequence numbers, birth/resync, heartbeat).
Sans-IO: every call takes ``now`` (the device clock) and returns a list of ``(channel, payload)``
where channel is ``"up"`` or ``"state"``. Bad samples and bad messages are counted, never raised.
"""
from edge.core import codec
from edge.core.codec import NO_VALUE, newer
from edge.core.interval import IntervalFilter, INF

FIRMWARE = "qf-0.1"
_RECENT = 8             # downlink sequence numbers remembered for duplicate suppression


def _finite(v):
    return (isinstance(v, float) or isinstance(v, int)) and not isinstance(v, bool) and v == v and v != INF and v != -INF


class Agent:
    def __init__(self, device, sources, boot=0, caps=0, width=0.0):
        if not sources or len(sources) > 255:
            raise ValueError("an agent needs 1..255 sources")
        self.device = device
        self.names = list(sources)
        self.index = {}
        for i, name in enumerate(self.names):
            self.index[name] = i
        self.filters = [IntervalFilter(width) for _ in self.names]
        self.values = [None] * len(self.names)
        self.boot = boot
        self.caps = caps
        self.seq = 0
        self.recent = []
        self.period_len = 0.0   # T; 0 disables shrinking
        self.shrink = 0.0       # S
        self.beat = 0.0         # heartbeat period; 0 disables
        self.t0 = 0.0
        self.period = 0         # number of shrinks applied since t0
        self.last_up = None
        self.summaries = None   # source index -> swat.Replicator, allocated by the first summary control
        self.stats = {"samples": 0, "reports": 0, "bad_samples": 0, "bad_messages": 0, "probes": 0}

    # -- outgoing -------------------------------------------------------------
    def _up(self, now, kind, fields):
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        fields["seq"] = self.seq
        self.last_up = now
        return ("up", codec.encode(kind, fields))

    def _report(self, now, i, why):
        """Report source ``i``'s current value stamped ``now`` and recentre on it."""
        f = self.filters[i]
        v = self.values[i]
        f.recenter(v)
        self.stats["reports"] += 1
        return self._up(now, "report", {"src": i, "epoch": f.epoch, "t": now, "v": v, "why": why})

    def start(self, now):
        """Birth (also sent after every reconnect): recentres every source on its current value."""
        recs = []
        for i, f in enumerate(self.filters):
            v = self.values[i]
            if v is not None:
                f.recenter(v)
            recs.append({"name": self.names[i], "epoch": f.epoch, "width": f.width,
                         "v": NO_VALUE if v is None else v})
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.last_up = now
        return [("state", codec.encode("birth", {"seq": self.seq, "t": now, "boot": self.boot,
                                                  "fw": FIRMWARE, "caps": self.caps, "sources": recs}))]

    def will(self):
        """Payload of the Last Will registered with the broker."""
        return codec.encode("gone", {"boot": self.boot})

    # -- inputs ---------------------------------------------------------------
    def handle_sample(self, now, source, value):
        i = self.index.get(source, source) if isinstance(source, str) else source
        if not isinstance(i, int) or i < 0 or i >= len(self.filters) or not _finite(value):
            self.stats["bad_samples"] += 1
            return []
        self.stats["samples"] += 1
        self.values[i] = value
        f = self.filters[i]
        out = []
        if f.center is None:
            out.append(self._report(now, i, codec.WHY_FIRST))
        elif f.check(value):
            out.append(self._report(now, i, codec.WHY_EXIT))
        if self.summaries is not None and i in self.summaries:
            from edge.core import swat      # loaded only on devices that summarise
            out += swat.ship(self, now, i, self.summaries[i].sample(now, value))
        return out

    def handle_message(self, now, payload):
        try:
            kind, m = codec.decode(payload)
            return self._apply(now, kind, m)
        except (codec.CodecError, ValueError, KeyError):
            self.stats["bad_messages"] += 1
            return []

    def _apply(self, now, kind, m):
        if codec.SCHEMAS[kind][1] != "down":
            raise ValueError("not a control message")
        seq = m["seq"]
        if seq in self.recent:
            return []
        self.recent.append(seq)
        if len(self.recent) > _RECENT:
            self.recent.pop(0)
        if kind == "config":
            self._configure(now, m)
            return []
        if kind == "rebirth":
            return self.start(now)
        i = m["src"]
        if i >= len(self.filters):
            raise ValueError("unknown source index")
        if kind == "summary":
            from edge.core import swat
            return swat.configure(self, now, i, m)
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
        if kind == "width":
            w = m["width"]
            if self.shrink:
                for _ in range(self.period - m["period"]):
                    w = w * (1 - self.shrink)
            f.set_width(w, m["epoch"])
        elif kind == "bound":
            f.set_bound(m["lo"], m["hi"], m["epoch"])
        else:
            f.set_filter(m["width"], [(c["l"], c["u"]) for c in m["cons"]], m["epoch"])
        v = self.values[i]
        if v is not None and (m["ack"] or f.check(v)):
            return [self._report(now, i, codec.WHY_ASSIGN)]
        return []

    def _configure(self, now, m):
        if m["period"] < 0 or not (0 <= m["shrink"] < 1) or m["beat"] < 0:
            raise ValueError("bad config")
        self.period_len = m["period"]
        self.shrink = m["shrink"]
        self.beat = m["beat"]
        self.t0 = m["t0"]
        self.period = int((now - self.t0) // self.period_len) if self.period_len > 0 and now >= self.t0 else 0

    # -- time -----------------------------------------------------------------
    def next_deadline(self):
        t = None
        if self.period_len > 0 and self.shrink > 0:
            t = self.t0 + (self.period + 1) * self.period_len
        if self.beat > 0 and self.last_up is not None:
            b = self.last_up + self.beat
            if t is None or b < t:
                t = b
        return t

    def handle_timer(self, now):
        out = []
        if self.period_len > 0 and self.shrink > 0:
            while self.t0 + (self.period + 1) * self.period_len <= now:
                self.period += 1
                at = self.t0 + self.period * self.period_len   # stamp the re-check at the shrink instant
                for i, f in enumerate(self.filters):
                    f.shrink(self.shrink)
                    v = self.values[i]
                    if v is not None and f.check(v):
                        out.append(self._report(at, i, codec.WHY_SHRINK))
        if self.beat > 0 and self.last_up is not None and now - self.last_up >= self.beat and not out:
            out.append(self._up(now, "beat", {"t": now}))
        return out
