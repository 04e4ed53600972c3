"""Downlinks (DESIGN.md §3): the coordinator's controls, configs and probes, and the waits for their effect.

A mixin of ``Coordinator`` (coordinator.py). Every downlink carries the device's next sequence number,
the backend's incarnation and the token of the birth it answers (a device of an earlier run gets this
run's config first); a narrowing or an acknowledged control is expected back in a report carrying its
epoch and sent again until it is (``Integrity.expect``), timed from when it left: the event time reached
plus λ, or, in echo mode, when the broker is seen passing it on (``handle_echo``).
"""
import math

from edge.core.codec import newer
from edge.core import codec
from backend.coordinator.core.integrity import FILTER, RETRY
from edge.core.predict import CONSTANT, MOMENTUM


class Unsent:
    """Echo mode: a control or probe made but not yet seen leaving (``Downlink._leave``): the sequence number it
    went out under, its token, the rest of what ``Downlink._left`` needs, when it was made on the adapter's clock
    (the device cannot have had it before) and whether the driver has since published it (``published``)."""
    __slots__ = ("seq", "token", "unsafe", "wait", "made", "published")

    def __init__(self, seq, token, unsafe, wait, made):
        self.seq, self.token, self.unsafe, self.wait, self.made = seq, token, unsafe, wait, made
        self.published = False


class Downlink:
    def send(self, device, kind, fields):
        d = self.devices[device]
        config = kind == "config" or kind == "setup"
        if d.get("inc") not in (None, self.inc) and not config and kind != "rebirth":
            self.send_config(device)    # a new backend run: its config first, or the device drops the rest
        d["down"] = (d["down"] + 1) & 0xFFFFFFFF
        fields["seq"] = d["down"]
        fields["inc"] = self.inc
        fields["to"] = d["to"]
        if config:
            d["inc"] = self.inc
        elif kind == "rebirth":
            d["rebirth"], d["asked"] = d["down"], self.wall
        self.out.append(("down", device, codec.encode(kind, fields)))

    def assign_width(self, key, width, confirm=None, flags=0):
        """A new width; a narrowing is acknowledged, and sent again until it is (``_sent``). ``flags``: the
        ``codec.METER`` bit for a metered device (edge.core.meter)."""
        s = self.cache.sources[key]
        epoch, narrowing = self.cache.set_width(key, width)
        self.finals.replay.control(key, self._event_now(), "width", (width, epoch))
        ack = 1 if narrowing or confirm else 0
        self._flags(s, key, flags)
        self.send(s.device, "width", {"src": s.index, "epoch": epoch, "period": self.tick - 1,
                                      "width": width, "ack": ack | flags})
        self._sent(key, epoch, ack, confirm)

    def assign_filter(self, key, width, cons, ack=1, confirm=None, flags=0):
        """Install constraints; ``ack=0`` (Cheng §3): the device reports only a membership change, and the
        protocol counts on the filter at once. With a heartbeat (the coordinator watches delivery) such a
        filter is acknowledged all the same: until it is, answers over the source are degraded, and its
        loss is found (``_missed``). ``flags``: ``codec.METER``/``SYNC`` bits for a metered device."""
        s = self.cache.sources[key]
        epoch = self.cache.set_filter(key, width, cons, keep_old=bool(ack))
        self.finals.replay.control(key, self._event_now(), "filter", (width, list(cons), epoch, bool(ack)))
        if not ack and (self.beat or self.integrity.links.acking(s.device)):
            ack, confirm = 1, (FILTER, self._event_now(), 0, True)
        self._flags(s, key, flags)
        self.send(s.device, "filter", {"src": s.index, "epoch": epoch, "width": width, "ack": ack | flags,
                                       "cons": [{"l": l, "u": u} for l, u in cons]})
        self._sent(key, epoch, ack, confirm)

    def _flags(self, s, key, flags):
        """Keep the METER/SYNC ``flags`` of ``key``'s latest control: sent again (``_resend``), it carries them, so
        a metered device whose first METER control was lost or dropped (it came before the device's config)
        still starts its meter, and a lost SYNC still syncs (else the backend counts the source as a meter
        twin while its device sends unmetered reports the ledger never sees: precision.regret)."""
        d = self.devices[s.device]
        if flags:
            d.setdefault("flags", {})[key] = flags
        elif key in d.get("flags", ()):
            del d["flags"][key]

    def _event_now(self):
        """The event time reached (before the first event: the adapter's clock). A control sent now has
        left by this plus λ on the adapter's clock, whichever call made it (a lazy or a ticking coordinator)."""
        return self.clock if self.clock > -math.inf else self.wall

    def _sent(self, key, epoch, ack, confirm):
        """A control was made. Acknowledged, a report carrying ``epoch`` is expected (the device reports at
        once if it has a value; in segment mode too, its segments riding along): ``confirm`` = (stage,
        since, tries, unsafe) of ``Integrity.expect``, by default sent again until answered (the mirror
        covers its loss)."""
        s = self.cache.sources[key]
        stage, since, tries, unsafe = confirm or (RETRY, None, 0, False)
        wait = (since, stage, tries, unsafe) if ack and s.value is not None else None
        self._leave(s.device, key, epoch, unsafe, wait)
        self._touch(key)

    def _leave(self, device, what, token, unsafe=False, wait=None):
        """A control (``what``: its key, ``token``: its epoch) or a probe (``("probe", key)``, its id) was
        just made: integrity expects the device to state it once it can have arrived (``wait``: the rest of
        ``Integrity.expect``'s arguments), timed from when it left: by the event time reached plus λ, or,
        in echo mode, when it is seen leaving."""
        if self.echo:
            self.devices[device]["unsent"][what] = Unsent(self.devices[device]["down"], token, unsafe, wait, self.wall)
        else:
            self._left(device, what, token, unsafe, wait, self._event_now() + self.latency, self.wall)

    def _left(self, device, what, token, unsafe, wait, at, wall):
        """It left by ``at`` (event time + λ, or the echo), the adapter's clock reading ``wall`` at most (the
        device cannot have had it before)."""
        if type(what) is not tuple:
            self.integrity.sent(what, token, at - self.latency, unsafe, wall)
        elif self.integrity.left.get(what, (None,))[0] != token:   # (asked again: a reply may answer the first)
            self.integrity.left[what] = (token, wall)       # a reply comes after it (offsets)
        if wait is not None:
            self.integrity.expect(device, what, token, at, *wait)

    def handle_echo(self, now, device, payload):
        """Echo mode: a downlink to ``device`` as the broker passed it on at ``now`` (the Spark job's
        controls leave after its batch; the bridge spools them). The waits for its effect start here."""
        self._catch_up(now)
        d = self.devices.get(device)
        try:
            kind, m = codec.decode(payload)
        except codec.CodecError:
            kind = None
        if not self.echo or d is None or kind is None or codec.SCHEMAS[kind][1] != "down" or m["inc"] != self.inc:
            return self._advance(now)
        seq = m["seq"]
        if seq == d["rebirth"]:         # the birth request has left: wait for its answer from now
            d["rebirth"], d["asked"] = None, now
        for what, u in list(d["unsent"].items()):
            if not newer(u.seq, seq):
                del d["unsent"][what]
                # the waits start at the echo; the clock bound takes when it was made: the device may have it
                # before the echo reaches the bridge (two subscribers, either first), never before it was made
                self._left(device, what, u.token, u.unsafe, u.wait, now, u.made)
        return self._advance(now)

    def published(self, now):
        """Echo mode: the driver is about to publish the controls it has (``now`` on the adapter's clock): each one
        made since the last such mark leaves after ``now``, so a device's reply to it bounds the device's clock
        from above by its stamp − ``now`` (``offsets``), not − when it was made, a batch earlier: the Spark
        job's batch latency (0.3-3 s) made every such bound looser than the prior ±σ (0.1 s live), so every
        live report's instant was uncertain by σ and the reserve R took up to half of each query's precision."""
        self._catch_up(now)
        for d in self.devices.values():
            for u in d["unsent"].values():
                if not u.published:
                    u.made, u.published = max(u.made, now), True
        return self._advance(now)

    def sent_by(self, device, what, token):
        """Echo mode: when the control ``what`` carrying ``token`` that the device answers left at the earliest
        (None: not waiting for its echo). A device answers at once what it received, often before the bridge
        spools the control's echo (two subscribers, either first): its reply bounds the clock all the same."""
        u = self.devices[device]["unsent"].get(what)
        return u.made if u is not None and u.token == token and u.published else None

    def send_config(self, device, keys=None):
        """Tell ``device`` the adjustment schedule: ticks at t0 + k·T (integer ms), the shrink S, the
        heartbeat, this backend's clock, and the number of ticks applied so far. Re-send it to every
        device after changing the period or the shrink: the device counts periods from it. ``keys``: the
        device's sources when its birth is being applied (their names, before they are its keys)."""
        t0, period = self.schedule_ms()
        fields = {"period": period, "shrink": self.shrink, "beat": codec.beat_field(self.integrity.links.told(device)), "t0": t0,
                  "now": round(self.wall * 1000), "tick": self.tick - 1}
        if self.devices[device]["lines"]:
            fields["allow"] = self.devices[device]["allow"] = self.allowed(device, keys)
        self.send(device, "setup" if "allow" in fields else "config", fields)

    def allowed(self, device, keys=None):
        """The filter models ``device`` may use now: ``allow``, without the lead where ``extreme``, constant
        alone where it may choose among them and the protocol does not let it (``Protocol.may_choose``)."""
        if self.allow & CONSTANT and self.allow != CONSTANT and not self.protocol.may_choose(self, device):
            return CONSTANT
        return self.allow & ~MOMENTUM if self.allow & MOMENTUM and self.extreme(device, keys) else self.allow

    def restate(self, device):
        """A setup to ``device`` if the models it may use changed since its last (a query change, or a birth
        in parts), at once: a metered deadband run and an adaptive one change at the same instant
        (precision.regret's exact ledger), and before any control of the change."""
        d = self.devices[device]
        if d.get("allow") is not None and self.allowed(device) != d["allow"]:
            self.send_config(device)

    def restate_models(self):
        for device in self.devices:
            self.restate(device)

    def extreme(self, device, keys=None):
        """Whether a source of ``device`` is read by a MIN or MAX over several sources: there it may not lead
        (edge.core.predict): a lead's bound lies mostly past the reading, which keeps the source among the
        extreme's candidates and off Olston App. A's cuts (extremes-20: adaptive 1,141 → 1,508 messages with leads)."""
        for key in self.devices[device]["keys"] if keys is None else keys:
            for qid in self.by_source.get(key, ()):
                q = self.queries[qid]
                if q.kind in ("min", "max") and len(q.sources) > 1:
                    return True
        return False

    def probe(self, key, probe_id=0, tries=0):
        """Ask ``key``'s device for its value; asked again (same id) until it replies."""
        s = self.cache.sources[key]
        self.send(s.device, "probe", {"src": s.index, "probe": probe_id & 0xFFFF})
        self._leave(s.device, ("probe", key), probe_id & 0xFFFF, wait=(None, RETRY, tries, False))

    def _touch(self, key):
        self.dirty_src[key] = None
