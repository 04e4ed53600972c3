"""Bounded input at the coordinator (DESIGN.md §10 operating it): who may claim a source, how fast a device
may talk, which stamps and values can be true, and what an operator is told while it happens.

Sans-IO, one object per coordinator; every call takes ``now`` (the adapter's arrival clock).

* **Ownership.** ``owners`` (source -> device: the fleet registry written by ``quietfleet broker`` and
  ``quietfleet fleet``) says who may name a source in a birth: a foreign claim, or a provisioned device
  naming a source not provisioned for it, is *refused* (counted, warned) and never displaces the owner.
  Without a registry the first device to name a source owns it, as before, and a later claim by another
  device makes the source *contested*: queries over it are degraded with the reason ("contested: t1
  claimed by dev2 and dev1") until the claimant's next birth no longer names it.
* **Flood.** A token bucket per device (``rate`` messages/s, by default ``RATE``, and 2 s of it deep, far
  above what a filtered device sends; 0 turns it off). A device that empties it is *quarantined* for ``QUARANTINE`` s: its messages are dropped
  uncounted by the rest of the coordinator, and the coordinator degrades it until its next birth after
  the quarantine (its dropped reports are lost uplinks).
* **Plausibility.** A stamp more than ``ahead`` s after the receive time (σ, the clock skew the coordinator
  covers, plus ``AHEAD``) or more than ``BEHIND`` s behind the device's clock as its last plausible stamp
  showed it, and a value that is not finite (the birth's "no value yet" +inf excepted), cannot be true: that message alone is dropped and counted, before delivery
  integrity sees it, so no single message moves a device's clock estimate or state for good (its sequence
  number is a lost uplink: the device is degraded until its next birth). ``STREAK`` such stamps in a row
  are the device's clock: they go on to integrity, which flags a clock that leads by more than σ.
* **Alerts.** Each finding is a line (device, reason, detail) in ``alerts`` for the driver to log, at most
  one per device and reason every ``WARN_EVERY`` s (the next one says how many were held back), and a
  counter per device in ``devices`` and in total in ``stats``.
"""
import math

from edge.core.predict import GAPS   # s: a line's gap (time between its source's readings) lies in here

RATE = 500.0            # messages/s a device may send on average (a filtered device sends a few per minute)
BURST = 1000.0          # messages a device may send at once
QUARANTINE = 30.0       # s a flooding device's messages are dropped
AHEAD = 5.0             # s past σ a stamp may lead the receive time (RESOLUTION-sized rounding is far below)
BEHIND = 600.0          # s a stamp may lag the device's last one (a report held through a broker outage is late)
STREAK = 3              # stamps ahead in a row that are a leading clock, not a lie
WARN_EVERY = 10.0       # s between two warnings of one device and reason
KEEP = 100              # undrained alerts kept
REFUSED, CONFLICT, BAD, FLOOD, STAMP, VALUE = ("refused source", "conflict", "bad message", "flood",
                                              "implausible time", "non-finite value")
COUNTERS = {REFUSED: "refused", CONFLICT: "conflicts", BAD: "bad_messages", FLOOD: "quarantined",
            STAMP: "stamps", VALUE: "values"}


def registry_owners(sources):
    """``{device: [source, ...]}`` (a registry's ``sources``) -> ``{source: device}``; a source provisioned
    for two devices is an error."""
    owners = {}
    for device in sorted(sources or {}):
        for key in sources[device]:
            if owners.setdefault(key, device) != device:
                raise ValueError("source %s is provisioned for both %s and %s" % (key, owners[key], device))
    return owners


class Admission:
    def __init__(self, owners=None, sigma=0.0, rate=RATE, stats=None):
        self.owners = dict(owners or {})
        self.provisioned = frozenset(self.owners.values())     # devices whose sources the registry lists
        self.ahead = sigma + AHEAD
        self.rate, self.burst = rate, BURST * rate / RATE    # rate 0: no limit
        self.buckets = {}       # device -> [tokens, time]
        self.until = {}         # device -> end of its quarantine
        self.streak = {}        # device -> implausible stamps in a row
        self.lead = {}          # device -> lead of its last plausible stamp over its arrival (its clock)
        self.boots = {}         # device -> the boot of its latest birth seen here
        self.contested = {}     # source -> {claimant device: None}, in claim order
        self.claims = {}        # device -> {source it contests: None}
        self.devices = {}       # device -> {counter: n} (only devices with a finding)
        self.alerts = []        # (now, device, reason, detail, held back since the last one)
        self._warned = {}       # (device, reason) -> [time of the last line, held back since]
        self.stats = {} if stats is None else stats     # (the coordinator's counters: one place)
        for name in sorted(COUNTERS.values()) + ["flooded"]:
            self.stats.setdefault(name, 0)

    # -- findings -------------------------------------------------------------------------------
    def note(self, now, device, reason, detail=""):
        """Count a finding for ``device`` and warn (rate-limited)."""
        name = COUNTERS[reason]
        self.stats[name] += 1
        per = self.devices.setdefault(device, {})
        per[name] = per.get(name, 0) + 1
        w = self._warned.get((device, reason))
        if w is not None and now < w[0] + WARN_EVERY:
            w[1] += 1
            return
        self.alerts.append((now, device, reason, detail, w[1] if w else 0))
        del self.alerts[:-KEEP]             # a driver that never drains (the simulator) keeps the newest
        self._warned[(device, reason)] = [now, 0]

    def drain(self):
        """The alerts since the last call, as log lines."""
        out, self.alerts = self.alerts, []
        return ["device %s: %s%s%s" % (device, reason, ": " + detail if detail else "",
                                      " (%d more since the last warning)" % held if held else "")
                for _, device, reason, detail, held in out]

    # -- flood ----------------------------------------------------------------------------------
    def take(self, now, device):
        """Whether a message from ``device`` at ``now`` passes its token bucket; False while quarantined.
        Returns "quarantine" for the message that starts a quarantine (the coordinator degrades it)."""
        if not self.rate:
            return True
        until = self.until.get(device)
        if until is not None:
            if now < until:
                self.stats["flooded"] += 1
                return False
            del self.until[device]
        b = self.buckets.get(device)
        if b is None:
            b = self.buckets[device] = [self.burst, now]
        b[0] = min(self.burst, b[0] + max(0.0, now - b[1]) * self.rate)
        b[1] = now
        if b[0] >= 1.0:
            b[0] -= 1.0
            return True
        self.until[device] = now + QUARANTINE
        self.stats["flooded"] += 1
        self.note(now, device, FLOOD, "more than %d messages at once or %g/s: quarantined for %gs"
                  % (self.burst, self.rate, QUARANTINE))
        b[0] = self.burst
        return "quarantine"

    # -- plausibility ---------------------------------------------------------------------------
    def stamp(self, now, device, t, boot=None):
        """Whether an uplink stamped ``t`` (device seconds) received at ``now`` can be true: not more than
        ``ahead`` s after its arrival, nor ``BEHIND`` s behind the device's own clock as its last plausible
        stamp showed it (a birth of a new ``boot`` starts the estimate afresh: an unsynced board may start
        anywhere in the past). ``STREAK`` such stamps in a row are the device's clock, not a lie."""
        if boot is not None and self.boots.get(device) != boot:
            self.boots[device] = boot
            self.lead.pop(device, None)
        lead = t - now
        ref = self.lead.get(device)
        if not math.isfinite(lead):
            what = "stamped %r" % t
        elif lead > self.ahead:
            what = "stamped %.3fs after its arrival" % lead
        elif ref is not None and ref - lead > BEHIND:
            what = "stamped %.3fs behind its clock" % (ref - lead)
        else:
            self.streak.pop(device, None)
            self.lead[device] = lead
            return True
        if math.isfinite(lead):
            n = self.streak[device] = self.streak.get(device, 0) + 1
            if n >= STREAK:             # the device's clock: integrity judges it (a lead beyond σ: skewed)
                self.streak.pop(device)
                self.lead[device] = lead
                return True
        self.note(now, device, STAMP, what)
        return False

    def plausible(self, now, device, kind, m, unit=1):
        """Whether a decoded uplink's stamp and values can be true (``stamp``, ``values``); ``unit``: the
        device's time unit per second (1000: integer milliseconds)."""
        if kind == "mark":      # stamped through when its data is sent (edge.core.segment.complete: a segment
            lead = m["t"] - now     # source's data may be pending for up to its lag): only never ahead
            if lead <= self.ahead:
                return True
            self.note(now, device, STAMP, "stamped %r s after its arrival" % lead)
            return False
        return self.stamp(now, device, m["t"], m.get("boot") if kind == "birth" else None) and \
            self.values(now, device, kind, m, unit)

    def values(self, now, device, kind, m, unit=1):
        """Whether every number of an uplink is finite (a value may be +inf: "none yet") and a line's gap
        (the time between its readings) is none or from ``GAPS[0]`` to ``GAPS[1]`` s."""
        bad = None
        if kind in ("report", "reply", "line", "rsegs"):
            bad = not (math.isfinite(m["v"]) or m["v"] == math.inf) or (
                kind == "line" and not (math.isfinite(m["slope"]) and math.isfinite(m.get("o", 0.0))
                                        and (m["gap"] <= 0 or GAPS[0] <= m["gap"] / unit <= GAPS[1])))
        elif kind == "birth":
            bad = any(not (math.isfinite(r["v"]) or r["v"] == math.inf) or not r["width"] >= 0 for r in m["sources"])
        if kind in ("segs", "rsegs") and not bad:      # (rsegs: a report with segment records riding along)
            bad = any(not all(math.isfinite(r[f]) for f in ("a", "e", "v", "s", "w")) for r in m["segs"])
        if bad:
            self.note(now, device, VALUE, "a %s with a value that is not a finite number (or a line's gap out of range)" % kind)
        return not bad

    # -- ownership ------------------------------------------------------------------------------
    def born(self, device):
        """A new birth of ``device`` starts: the sources it contested are released until it names them
        again; returns them."""
        keys = list(self.claims.pop(device, ()))
        for key in keys:
            c = self.contested.get(key)
            if c is not None:
                c.pop(device, None)
                if not c:
                    del self.contested[key]
        return keys

    def claim(self, now, device, key, holder):
        """Whether ``device`` may take source ``key`` (born already by ``holder``, or None)."""
        owner = self.owners.get(key)
        if (owner is not None and owner != device) or (owner is None and device in self.provisioned):
            self.note(now, device, REFUSED, "birth names %s, %s" % (
                key, "provisioned for %s" % owner if owner else "not provisioned for it"))
            return False
        if holder is not None and holder != device:
            self.contested.setdefault(key, {})[device] = None
            self.claims.setdefault(device, {})[key] = None
            self.note(now, device, CONFLICT, "birth names %s, which %s owns" % (key, holder))
            return False
        return True

    def why(self, q, sources):
        """The contested sources of query ``q``, as a prefix of its degraded reason."""
        if not self.contested:
            return ""
        out = []
        for key in q.among(self.contested):
            holder = sources[key].device if key in sources else "?"
            out.append("%s claimed by %s" % (key, " and ".join([holder] + list(self.contested[key]))))
        return "contested: %s; " % ", ".join(out) if out else ""
