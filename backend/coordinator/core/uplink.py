"""Devices' uplinks (DESIGN.md §3 reconnect): births, reports, Last Wills and the broker link, applied in
event time by the coordinator's queue; birth requests for devices we have no birth from.

A mixin of ``Coordinator`` (coordinator.py): ``handle_uplink`` decodes and admits an uplink (through
``Resync._admit``) and queues it at its event time; ``_apply`` runs it when the queue releases it.
"""
import heapq

from edge.core.codec import NO_VALUE, CAP_F32, CAP_MS, CAP_LINE, CAP_METER, PLAIN
from edge.core import codec
from edge.core.predict import LEAD_DOWN, LEAD_UP
from backend.coordinator.core.admission import BAD
from backend.coordinator.core.resync import UP

ECHO_WAIT = 30.0    # s a birth request may wait for its echo before it is made again (echo mode)
EARLY = 8           # uplinks kept per device heard before its first birth, applied after it
EARLY_DEVICES = 256     # devices whose early uplinks are kept (the oldest forgotten first)


class Uplink:
    def _ask_birth(self, device, now, early=False):
        """Ask a device we have no birth from for one, once per λ + 1 s after the last request left: every
        request makes it send a new birth, whose token voids the controls answering the one before, so
        a request per early report would keep it from ever taking a control. An ``early`` report waits
        λ + 1 s first: a device sends what it read before connecting, then its birth."""
        d = self._device(device)
        if early and d["asked"] is None:
            d["asked"] = now
            return
        if d["asked"] is None or (not self._in_flight(d, now) and now - d["asked"] >= self.latency + 1.0):
            d["asked"] = now
            self.send(device, "rebirth", {})

    def _in_flight(self, d, now):
        """Whether the device's latest birth request has not left yet (echo mode; at most ECHO_WAIT s)."""
        return self.echo and d["rebirth"] is not None and now - d["asked"] < ECHO_WAIT

    def _device(self, device):
        d = self.devices.get(device)
        if d is None:
            d = self.devices[device] = {"boot": None, "seq": 0, "down": 0, "keys": [], "src": [], "online": False,
                                        "to": 0, "single": False, "inc": None, "lines": False, "asked": None,
                                        "rebirth": None, "unsent": {}, "gone": False, "guard": None}
        return d

    def key_of(self, device, i):
        """The source ``device``'s uplinks number ``i`` (its place in the device's births), or None: not one
        it owns (refused or contested at its birth: the others keep their own numbers)."""
        d = self.devices.get(device)
        return d["src"][i] if d is not None and 0 <= i < len(d["src"]) else None

    def handle_uplink(self, now, device, payload, retained=False):
        """Take one uplink payload from ``device``; ``retained`` marks a broker-retained birth."""
        self.wall = now
        self._catch_up(now)        # lateness is judged against the ticks a per-period coordinator ran
        passed = self.admission.take(now, device)
        if passed is not True:
            if passed:                  # a flood starts its quarantine: what it drops is lost
                self._quarantine(device)
            return self._advance(now)
        try:
            kind, m = codec.decode(payload)
            if codec.SCHEMAS[kind][1] != "up":
                raise codec.CodecError("downlink kind on an uplink topic")
            kind = PLAIN.get(kind, kind)        # a metered report is a report (its counts ride along)
        except codec.CodecError as e:
            self.admission.note(now, device, BAD, str(e))
            return self._advance(now)
        rx = self.rx.get(device)
        if kind == "gone":
            if rx is not None and rx[0] == m["boot"]:
                self.n += 1
                heapq.heappush(self.queue, (max(self.clock, now - self.latency), UP, self.n, device, kind, m))
            return self._advance(now)
        if kind == "birth":
            if retained:
                # A retained birth may be stale (we restarted): ask the device for a fresh one.
                self._ask_birth(device, now)
                return self._advance(now)
            self.unit[device] = 1000 if m["caps"] & CAP_MS else 1
            self.integrity.offsets.ticks[device] = 0.001 if m["caps"] & CAP_MS else 0.0   # (a stamp's resolution)
        elif rx is None:
            self.stats["unknown_device"] += 1
            if kind != "mark":
                self._keep_early(device, m["seq"], payload)
            self._ask_birth(device, now, early=True)
            return self._advance(now)
        if kind == "reply":
            m["why"] = codec.WHY_ASSIGN     # a report a control asked for, as protocols see it
        elif kind in ("report", "line", "rsegs"):
            m["guarded"] = bool(m["why"] & codec.GUARDED)      # (resync.py: the hull while its time is unsure)
            m["lead"] = 1 if m["why"] & LEAD_UP else -1 if m["why"] & LEAD_DOWN else 0     # (edge.core.predict)
            m["why"] &= ~(codec.GUARDED | LEAD_UP | LEAD_DOWN)
        ms = self.unit.get(device) == 1000
        td = m.get("o", m["t"])     # a line's origin in device units (a metered line carries its own: a SYNC's
        if ms:                      # acknowledgement takes a line begun earlier)
            m["t"] = m["t"] / 1000
        if not self.admission.plausible(now, device, kind, m, self.unit.get(device, 1)):     # dropped alone
            return self._refused(now, device, kind, m)
        if kind == "line" and ms:   # integer ms, as the device computed with them (checked finite above)
            m["td"], m["gap"] = int(td), int(m["gap"])
        elif kind == "line":
            m["td"] = td
        t = self._admit(now, device, kind, m, rx)
        if t is None:
            self.stats["duplicates"] += kind != "mark"
            return self._advance(now)
        self.n += 1
        heapq.heappush(self.queue, (t, UP, self.n, device, kind, m))
        out = self._advance(now)
        for _, p in self.early.pop(device, ()) if kind == "birth" else ():
            out += self.handle_uplink(now, device, p)
        return out

    def _keep_early(self, device, seq, payload):
        """Keep an uplink numbered ``seq`` heard before the device's first birth: a network that reorders
        may deliver the birth after the reports that followed it; applied once the birth is in (as late
        uplinks), they are not lost (else each is a gap the birth finds, a lost uplink and a birth more).
        One forgotten (more than EARLY, more than EARLY_DEVICES devices) is dropped: missing if it
        followed the birth."""
        kept = self.early.pop(device, [])
        kept.append((seq, payload))
        self.early[device] = kept[-EARLY:]
        gone = [(device, s) for s, _ in kept[:-EARLY]]
        if len(self.early) > EARLY_DEVICES:
            old = next(iter(self.early))
            gone += [(old, s) for s, _ in self.early.pop(old)]
        for dev, s in gone:
            self.integrity.dropped(dev, s)

    def link_lost(self, now):
        """The adapter lost its broker: every device counts as gone (as by its Last Will) at
        ``now - λ``, so answers are degraded until each device's next uplink or birth."""
        self._catch_up(now)
        for device, d in self.devices.items():
            self.n += 1
            heapq.heappush(self.queue, (max(self.clock, now - self.latency), UP, self.n, device, "gone", {}))
        return self._advance(now)

    def link_restored(self, now):
        """Back on the broker: ask every known device for a fresh birth to resynchronise."""
        for device in self.devices:
            self.send(device, "rebirth", {})
        return self._advance(now)

    def adopt(self, now, device):
        """A device another coordinator owned until now (Spark query groups merged): ask it for a birth."""
        self._catch_up(now)
        self._ask_birth(device, now)
        return self._advance(now)

    def _quarantine(self, device):
        """``device`` flooded: degraded from now (its dropped messages are lost) until a birth after it."""
        if device in self.devices and device in self.integrity.dev:
            self.integrity.flag(device, "quarantined (flood)", self.wall)
            self._suspect(device, self.clock)

    def _set_online(self, device, online):
        d = self.devices[device]
        if d["online"] != online:
            d["online"] = online
            for key in d["keys"]:
                self.cache.set_online(key, online)
                self.models.set_online(key, online, self.clock)
                self._touch(key)

    def _birth(self, device, m):
        """Register or resynchronise a device from its birth, or from one part of it (DESIGN.md §3
        reconnect). Controls sent from now on answer this birth; earlier ones are dropped by the device."""
        d = self._device(device)
        if m["first"] == 0:
            for key in self.admission.born(device):     # the sources it contested are no longer
                self._touch(key)
            d["boot"], d["seq"] = m["boot"], m["seq"]
            d["to"] = (m["boot"] ^ m["seq"]) & 0xFFFFFFFF
            d["single"] = bool(m["caps"] & CAP_F32)
            d["lines"] = bool(m["caps"] & CAP_LINE)
            d["meter"] = bool(m["caps"] & CAP_METER)
            d["online"], d["gone"] = False, False
            self._set_online(device, True)
            self.send_config(device, [rec["name"] for rec in m["sources"]])
            self.integrity.links.born(device)
            if self.integrity.links.acking(device) or self.integrity.offsets.sigma > 0:    # (a reboot forgets it)
                self._link(device)
        if m["first"] == 0:
            d["src"] = []
        for i, rec in enumerate(m["sources"], m["first"]):
            key = rec["name"]
            s = self.cache.sources.get(key)
            d["src"].extend([None] * (i + 1 - len(d["src"])))
            if not self.admission.claim(self.wall, device, key, s and s.device):
                if s is not None:
                    self._touch(key)    # contested: the owner keeps it, its queries say so
                continue
            d["src"][i] = key
            v = None if rec["v"] == NO_VALUE else rec["v"]
            self.integrity.regressed(device, i, rec["epoch"], self.wall, birth=True)
            self.integrity.forget(device, key)      # controls sent before a birth are void
            d["unsent"].pop(key, None)
            if s is not None and not self.integrity.newest(device, i, m["seq"]):
                v = s.value     # a report sent after this birth was applied already
            if s is None:
                s = self.cache.add(key, device, i, rec["width"], rec["epoch"], v, d["single"],
                                   self.unit.get(device, 1))
                d["keys"].append(key)
                for qid in self.by_source.get(key, ()):
                    self._count_beats(qid, [key], 1)
                self.protocol.source_added(self, key)
                self.segments.born(self, key)
            else:
                # Trust the device's own state, then re-send what we want under an epoch newer than
                # both sides' (the device may have rebooted to epoch 0, or kept ours).
                want = (s.filt.width, list(s.filt.cons))
                s.index = i         # (a reboot may name its sources in another order: controls go to its number now)
                self.cache.rebirth(key, rec["width"], rec["epoch"], m["t"], v, d["single"], self.unit.get(device, 1))
                if v is not None:
                    self.models.observe(key, m["t"], v)
                self.protocol.resync(self, key, want)
                self.segments.resync(self, key)
            self._touch(key)
        self.restate(device)        # (a birth in parts: its config knew the first part's sources only)

    def _apply(self, device, kind, m):
        if kind in codec.SCHEMAS:       # an uplink (not an event queued here): the final mirror's too
            if kind == "gone":
                self.finals.replay.offline(device, ("offline", device))
            else:
                self.finals.replay.uplink(device, kind, m)
        if kind == "birth":
            if not self.integrity.fresh_birth(device, m["boot"], m["seq"]):
                return          # reordered behind a newer birth: its state and token are stale
            self._birth(device, m)
            self.integrity.resynced(device, m["hull"], m["seq"], m["boot"])
            self._trust(device, m["hull"])
            return
        if device not in self.devices:
            return
        if kind == "gone":         # offline until its next birth (a report applied after it does not bring it back)
            self.devices[device]["gone"] = True
            self._set_online(device, False)
            return
        if self._resync_event(device, kind, m):
            return
        self._trust(device)
        if kind in ("report", "reply", "line", "rsegs"):
            key = self.key_of(device, m["src"])
            if key is None:
                self.admission.note(self.wall, device, BAD, "source index %d: not one it owns" % m["src"])
                return
            if not self._fresh_report(device, key, m):
                self.protocol.superseded(self, key, m)
                return          # reordered behind a newer report or birth: the mirror is newer already
            if kind == "rsegs":         # the device's pending segments rode along
                self.segments.receive(self, device, m)
            elif kind != "reply":
                self.segments.reported(self, key, m["t"])
            if m["v"] != NO_VALUE:
                line = (m["td"], m["slope"], m["gap"]) if kind == "line" and m["gap"] > 0 else None
                self.cache.report(key, m["epoch"], m["t"], m["v"], line, m.get("lead", 0))
                self.models.observe(key, m["t"], m["v"])
                self._touch(key)
            self.protocol.reported(self, key, m)
        elif kind == "blob":
            self.protocol.blob(self, device, m)
        elif kind == "segs":
            self.segments.receive(self, device, m)
