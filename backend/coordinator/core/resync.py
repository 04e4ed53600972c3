"""Devices out of sync (DESIGN.md §3 reconnect; issue #20): the coordinator's side of ``integrity``.

A mixin of ``Coordinator``: every uplink is admitted through ``Integrity`` (duplicates dropped; gaps,
reboots, skewed clocks found; its event time t − σ and the end of its skew hull set), each report is
checked for order and for the epochs the device should have by now, and what integrity finds makes
the device's sources degraded (offline, widened by the interruption model) and revokes the answers
over them since the finding's ``since`` — until a birth resynchronises it and has surely happened.
"""
import heapq

from backend.coordinator.core.integrity import CHECK, CONTROL, FILTER, LOST_STATE, RETRY
from edge.core.codec import NO_VALUE

UP = -1         # the coordinator's event order of uplinks within one timestamp


class Resync:
    def _admit(self, now, device, kind, m, rx):
        """Admit an uplink (``m["t"]`` in device seconds): its event time (at least the clock), or None
        for a duplicate. Sets ``m["t"]`` to the event time and, for reports, replies and births,
        ``m["hull"]`` (the latest instant it can have happened) and the boot it belongs to."""
        ig = self.integrity
        ok = ig.accept(now, device, m["boot"] if kind == "birth" else rx[0], m["seq"], m["t"], birth=kind == "birth")
        if device in ig.revokes:
            self._suspect(device, ig.revokes.pop(device))
        if not ok:
            return None
        self.rx[device] = (m["boot"] if kind == "birth" else rx[0], m["seq"])
        if ig.check_clock(device, m["t"], now):
            self._suspect(device, self.t0)
        if kind in ("report", "reply", "line", "rsegs", "birth"):
            m["hull"] = ig.cover(device, m["t"])
        m.setdefault("boot", rx[0] if rx else None)     # (the boot it is counted under: the final mirror's)
        t = m["t"] = ig.event(m["t"])
        if t < self.clock:
            self.stats["late"] += 1     # applied now; later than λ (not covered by a protocol's
            if now - t > self.tolerance:    # padding either): the answers meanwhile are revoked
                self._revoke(device, t)
            t = self.clock
        return t

    def _fresh_report(self, device, key, m):
        """Check a report or reply before it is applied: False when superseded (reordered behind a
        newer one or a birth). An epoch older than one the device stated, or than a control sent
        long enough before, flags the device; a report from a skewed clock holds the prior bound."""
        ig = self.integrity
        if ig.superseded(device, m["boot"], m["src"], m["seq"]):
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
        if ig.regressed(device, m["src"], m["epoch"], self.wall):
            self._suspect(device, last)     # it lost its state after that report
        if m["v"] != NO_VALUE and m["hull"] > self.clock:     # it may have happened as late as that
            self.cache.hold(key, m["hull"])
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
        ok = self.integrity.trusted(device, self.clock)
        self._set_online(device, ok)
        if settle is not None and not ok and device not in self.integrity.suspect:
            self._later(settle, device, "settled", {})

    def _integrity(self, now):
        """Degrade devices with a lost uplink or silence; ask suspects for a birth; send again what
        was not answered."""
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
        """Send ``key``'s filter again under a new epoch, to be confirmed (``confirm``: see ``_sent``)."""
        s = self.cache.sources[key]
        if s.filt.cons:
            self.assign_filter(key, s.filt.width, list(s.filt.cons), ack=1, confirm=confirm)
        else:
            self.assign_width(key, s.filt.width, confirm=confirm)
