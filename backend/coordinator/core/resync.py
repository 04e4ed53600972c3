"""Devices out of sync (DESIGN.md §3 reconnect, §4 bounded withdrawal; issue #20): the coordinator's side of
``integrity``.

A mixin of ``Coordinator``: every uplink is admitted through ``Integrity`` (duplicates dropped; gaps,
reboots found; its event time t − hi and the end of its skew hull t − lo from the device's clock bounds;
a stamp the clock cannot have made placed by its arrival), each report is checked for order and for the
epochs the device should have by now, and what integrity finds makes the device's sources degraded
(offline, widened by the interruption model) and revokes the answers over them since the finding's
``since`` — until a birth resynchronises it and has surely happened. What integrity asks for goes out
here: in ack mode an ``ack`` and a ``nack`` per gap (``acks``: one admission refused is acknowledged too,
``_refused``), the
``link`` that switches it on, a config telling a new heartbeat B, and a probe whose reply bounds a device
clock from above (``ECHO``).
"""
import heapq
import math

from backend.coordinator.core.integrity import CHECK, CONTROL, FILTER, LOST_STATE, RETRY
from backend.coordinator.core.waits import asked
from edge.core.codec import NO_VALUE, WHY_ASSIGN, newer

UP = -1         # the coordinator's event order of uplinks within one timestamp
ECHO = 0xFFFF   # the probe id of a request for a clock echo (its reply bounds the clock's lead from above)


class Resync:
    def _admit(self, now, device, kind, m, rx):
        """Admit an uplink (``m["t"]`` in device seconds): its event time (at least the clock), or None
        for a duplicate or a mark. Sets ``m["t"]`` to the event time and, for reports, replies and births,
        ``m["hull"]`` (the latest instant it can have happened) and the boot it belongs to."""
        ig = self.integrity
        boot = m["boot"] if kind == "birth" else rx[0]
        stamped = ig.offsets.heard(device, m["t"], now)     # else dropped for this message: placed by arrival
        filled = device in ig.dev and m["seq"] in ig.dev[device]["missing"] and kind != "mark"     # a resend
        ok = ig.accept(now, device, boot, m["seq"], m["t"], birth=kind == "birth", mark=kind == "mark")
        if ig.unseen.get(device):
            self.protocol.unseen(self, device, ig.unseen.pop(device))
        if device in ig.revokes:
            self._suspect(device, ig.revokes.pop(device))
        self._deliver(now, device, kind, ok, filled)
        if ok:
            self.finals.replay.heard(device)        # (its watermark may have moved: integrity's is the final mirror's)
        if not ok or kind == "mark":
            return None
        self.rx[device] = (boot, m["seq"])
        d = self.devices.get(device)
        key = self.key_of(device, m["src"]) if kind in ("report", "reply", "line", "rsegs") else None
        if stamped and key is not None:
            sent = self.sent_by(device, *asked(key, m["epoch"], m.get("probe"))) if self.echo else None
            if sent is not None:
                ig.offsets.echoed(device, m["t"], sent)
            ig.echo(device, key, m["epoch"], m["t"], now, m.get("probe"), m.get("why") == WHY_ASSIGN)
        if kind in ("report", "reply", "line", "rsegs", "birth"):
            m["hull"] = ig.cover(device, m["t"]) if stamped else now
        if kind in ("segs", "rsegs"):       # its segments' times are its clock's: placed within the clock's bounds
            m["clock"] = ig.offsets.bounds(device, ig.now) if ig.sigma > 0 else (0.0, 0.0)     # (σ = 0: exact)
        m.setdefault("boot", rx[0] if rx else None)     # (the boot it is counted under: the final mirror's)
        m["stamp"] = m["t"]         # the device's own time: a relay's bodies keep their lifetimes in its clock
        t = m["t"] = ig.event(device, m["t"]) if stamped else now - ig.links.net
        if d is not None and m.get("guarded"):  # within its guard: until its hull the value was in the bound before
            m["tight"] = m["hull"] - t <= (d["guard"] or 0.0)       # it or at the reported value (both mirrors' hold)
        if t < self.clock:
            self.stats["late"] += 1     # applied now; later than λ (not covered by a protocol's
            if now - t > self.tolerance:    # padding either): the answers meanwhile are revoked
                self._revoke(device, t)
            t = self.clock
        return t

    def _refused(self, now, device, kind, m):
        """An uplink admission dropped: its data is lost to us, so a lost uplink (``Integrity.refused``: answers
        over the device revoked and degraded until a birth restates it), acknowledged in ack mode so the device
        does not resend it for ever (a birth or a mark takes no place in its resend buffer)."""
        if kind not in ("birth", "mark") and self.integrity.refused(now, device, m["seq"]):
            self._deliver(now, device, kind, False, True)
        return self._advance(now)

    def _fresh_report(self, device, key, m):
        """Check a report or reply before it is applied: False when superseded (reordered behind a
        newer one or a birth). An epoch older than one the device stated, or than a control sent
        long enough before, flags the device; a report from a skewed clock holds the prior bound."""
        ig = self.integrity
        if ig.superseded(device, m["boot"], m["src"], m["seq"]):
            if m["v"] != NO_VALUE:
                self.cache.widen(key, m["v"], m.get("lead", 0))     # (the newer one's hold did not know its bound)
                self._touch(key)
            return False
        if ig.answered(device, key, m["epoch"]) | ("probe" in m and ig.answered(device, ("probe", key), m["probe"])):
            self._trust(device)         # the control it was suspect for is in force
        last = self.cache.sources[key].last_t
        last = self.clock if last is None else last
        lost = ig.unconfirmed(key, m["epoch"], m["t"])
        if lost is not None:        # a control lost, or the device lost its state after its last report:
            if lost[1]:             # send it again; the answers the protocol bases on it are wrong meanwhile
                self._lost_control(device, min(last, lost[0]))
            self._resend(key, (CHECK, min(last, lost[0]), 0, lost[1]))
        elif self.cache.sources[key].unsure is not None and newer(m["epoch"], self.cache.sources[key].unsure):
            self._resend(key, (RETRY, None, 0, False))  # a later epoch came without the constraints: again
        if ig.regressed(device, m["src"], m["epoch"], self.wall):
            self._suspect(device, last)     # it lost its state after that report
        if m["v"] != NO_VALUE and m["hull"] > self.clock:     # it may have happened as late as that
            self.cache.hold(key, m["hull"], m["v"] if m.get("tight") else None)
            self._later(m["hull"], device, "expire", {"key": key})
        return True

    def _resync_event(self, device, kind, m):
        """Apply the events queued here (a birth settled, a skew hull over); False for any other."""
        if kind == "settled":
            self._trust(device)
        elif kind == "expire":
            self.cache.release(m["key"], self.clock)
            self._touch(m["key"])
        else:
            return False
        return True

    def _shrink_hold(self, t):
        """A periodic shrink at tick ``t``: a device whose clock may be behind shrinks as late as t − lo
        (its clock's lower bound): until then the mirror keeps its bound from before the shrink too.
        Returns {key: until} for ``BoundCache.shrink``."""
        hold = {}
        if self.integrity.offsets.sigma <= 0:
            return hold
        for key, s in self.cache.sources.items():
            until = self.integrity.cover(s.device, t)
            if until > t:
                hold[key] = until
                self._later(until, s.device, "expire", {"key": key})
        return hold

    def _later(self, t, device, kind, m):
        self.n += 1
        heapq.heappush(self.queue, (t, UP, self.n, device, kind, m))

    def _revoke(self, device, since):
        """The provisional answers over ``device``'s sources from ``since`` to the clock may have been wrong
        (final answers stand on uplinks in sequence order, ``replay.py``: never withdrawn)."""
        d = self.devices.get(device)
        for key in d["keys"] if d else ():
            for qid in self.by_source.get(key, ()):
                a, b = self.revoked.get(qid, (since, self.clock))
                self.revoked[qid] = [min(a, since), max(b, self.clock)]
                self.dirty[qid] = None

    def _suspect(self, device, since):
        """``device`` is out of sync: revoke its answers since ``since`` and degrade it from now on; its final
        answers say so from its watermark until a birth restates it (unless only a control was lost, which
        the final mirror's hull covers)."""
        if device in self.devices:
            self._revoke(device, since)
            self._set_online(device, False)
            why = self.integrity.suspect.get(device)
            if why is not None and why != CONTROL:
                self.finals.replay.offline(device, (why, device))

    def _trust(self, device, settle=None):
        """Online unless suspect or settling after a birth (its values may be as recent as ``settle``)."""
        ok = self.integrity.trusted(device, self.clock) and not self.devices[device]["gone"]
        self._set_online(device, ok)
        if settle is not None and not ok and device not in self.integrity.suspect:
            self._later(settle, device, "settled", {})

    def _integrity(self, now):
        """Degrade devices with a lost uplink or silence; ask suspects for a birth; send again what
        was not answered; send the quiet acks due."""
        for device in self.acks.due(now):
            if device in self.devices and self.integrity.links.acking(device):
                self._ack(now, device)
        if self.integrity.next_deadline() > now:
            return
        new, ask, missed = self.integrity.due(now)
        for device, _, since in new:
            self._suspect(device, since)
        for device in ask:
            if device in self.devices and not self._in_flight(self.devices[device], now):
                self.send(device, "rebirth", {})
        for device, what, w in missed:
            self._missed(device, what, w)

    def _missed(self, device, what, w):
        """No answer to a control or probe (``Integrity.expect``) in 2λ + margin: see its stage."""
        token, _, since, stage, tries, unsafe = w
        key = what[1] if type(what) is tuple else what
        s = self.cache.sources.get(key)
        if s is None or s.device != device:
            return
        self.integrity.stats["resent"] += 1
        if tries == 0:      # the device may have dropped it waiting for a config that was lost: both again
            self.send_config(device)
            if self.integrity.links.acking(device) or self.integrity.offsets.sigma > 0:
                self._link(device)
        if type(what) is tuple and what[0] == "segment":      # a segment mode or its answer lost
            self.segments.resend(self, key, tries + 1)
        elif type(what) is tuple:       # a probe or its reply lost: ask again, same id
            self.probe(key, token, tries + 1)
        elif stage == RETRY:            # the mirror covers its loss: send it again
            self._resend(key, (RETRY, None, tries + 1, False))
        elif stage == FILTER:           # the protocol counts on it: degrade, revoke, send it again
            self._lost_control(device, since)
            self._resend(key, (CHECK, since, 0, unsafe))
        elif tries < 1:                 # CHECK: once more (this one or its report may be lost as well)
            self._resend(key, (CHECK, since, tries + 1, unsafe))
        else:                           # sent again and never answered: the device may have lost its state
            self.integrity.flag(device, LOST_STATE, self.wall)
            self._suspect(device, since)

    def _lost_control(self, device, since):
        """A control to ``device`` is lost: degraded until a report shows it in force (or a birth)."""
        self.integrity.flag(device, CONTROL, self.wall, ask=False)
        self._suspect(device, since)

    def _resend(self, key, confirm):
        """Send ``key``'s filter again under a new epoch, to be confirmed (``confirm``: see ``_sent``), with the
        METER/SYNC flags of the control it repeats (``_flags``)."""
        s = self.cache.sources[key]
        flags = self.devices[s.device].get("flags", {}).get(key, 0)
        if s.filt.cons:
            self.assign_filter(key, s.filt.width, list(s.filt.cons), ack=1, confirm=confirm, flags=flags)
        else:
            self.assign_width(key, s.filt.width, confirm=confirm, flags=flags)

    def _link(self, device, guard=None):
        """Tell ``device`` its resend timeout (ack mode, or 0) and its guard (GUARDED reports): 2σ after a
        birth, then twice the uncertainty of its clock once that is known (``_deliver``), the same again when
        a control went unanswered. The smallest guard told is what is believed (the device may not have a
        later, larger one: believing that is unsound; a device that has a larger one reports more)."""
        ig, d = self.integrity, self.devices[device]
        ms = (round(2000 * ig.offsets.sigma) if d["guard"] is None else round(1000 * d["guard"])) if guard is None \
            else guard
        d["guard"] = ms / 1000 if d["guard"] is None else min(d["guard"], ms / 1000)
        self.send(device, "link", {"rto": round(ig.links.timeout(device) * 1000) if ig.links.acking(device) else 0,
                                   "guard": ms})

    def _ack(self, now, device, quiet=True):
        """A cumulative ``ack`` to ``device`` (``quiet``: the one ``acks`` armed, due now)."""
        upto = self.integrity.upto(device)
        if quiet:
            self.acks.sent(now, device, upto)
        self.integrity.links.stats["acked"] += 1
        self.send(device, "ack", {"upto": upto, "now": round(now * 1000)})

    def _deliver(self, now, device, kind, new, filled=False):
        """After an uplink from ``device`` (``new``: not a duplicate; ``filled``: it filled a gap): nack its
        gaps and acknowledge it in ack mode (``acks``), switch a
        device with a gap to ack mode, tell a new heartbeat B, ask for a clock echo, degrade a device whose
        clock is known less well than ±σ."""
        ig, d = self.integrity, self.devices.get(device)
        news = ig.news
        if kind == "birth":         # its config and link go out when it is applied
            news["link"] = [x for x in news["link"] if x != device]
            news["beat"] = [x for x in news["beat"] if x != device]
        for dev in news["link"]:
            if dev in self.devices:
                self._link(dev)
        for dev in news["beat"]:
            if dev in self.devices:
                self.send_config(dev)
        for dev, was in news["moved"]:
            self._beat_moved(dev, was)
        news["link"], news["beat"], news["moved"] = [], [], []
        if d is None or self.rx.get(device) is None:
            return
        if ig.links.acking(device):
            d0 = ig.dev[device]
            holes = sorted((s for s in d0["missing"] if s not in d0["refused"]),
                           key=lambda s: (s - d0["high"]) & 0xFFFFFFFF)
            ack, miss = self.acks.heard(now, device, ig.upto(device), holes, ig.links.trip(device),
                                        prompt=filled, again=not new, born=kind == "birth")
            for s in miss:
                self.send(device, "nack", {"upto": ig.upto(device), "miss": s})
            if ack:
                self._ack(now, device, False)
        if d["guard"] and kind != "birth":          # the guard follows the clock's uncertainty down
            lo, hi = ig.offsets.bounds(device, now)
            want = math.ceil(2000 * (hi - lo)) + 2
            if 4 * want <= 1000 * d["guard"]:
                self._link(device, want)
        unclocked = not ig.clocked(device, now)
        if unclocked != (d["keys"] and d["keys"][0] in self.unclocked):
            for key in d["keys"]:
                if unclocked:
                    self.unclocked[key] = None
                else:
                    self.unclocked.pop(key, None)
                self._touch(key)
        if ig.offsets.sigma > 0 and d["keys"] and not ig.offsets.highs.get(device) \
                and ("probe", d["keys"][0]) not in ig.left and ("probe", d["keys"][0]) not in d["unsent"]:
            self.probe(d["keys"][0], ECHO)      # (once: in echo mode it is ``unsent`` until the bridge sees it)
