"""Per-device delivery integrity (DESIGN.md §3 sequence numbers and heartbeat; issue #20): gaps, late reports, silence, skew.

Sans-IO: every call takes ``now`` (the adapter's arrival clock). Uplink sequence numbers are tracked
per device and boot: a number above the highest seen opens a gap for every number skipped, a number
inside a gap fills it (reordering is not loss), anything else is a duplicate. A gap still open λ
after it was noticed is a lost uplink; a device with a heartbeat that sends nothing for
beat + λ + margin is silent; a device whose timestamps run ahead of their arrival (the minimum of
arrival - t over a window of recent uplinks is below zero) or behind it by more than λ has a
skewed clock. Each makes the device *suspect* (its sources degraded, with the reason, and the
answers since its last trusted uplink revoked) until a birth resynchronises it; while suspect the
coordinator asks for a birth every ``retry`` seconds. A skewed clock stays suspect (a birth does
not fix it) and is not asked for births.
"""
import math

WINDOW = 256            # sequence numbers below the highest seen that may still arrive
SKEW_WINDOW = 32        # recent uplinks the clock-skew estimate looks at


class Integrity:
    def __init__(self, latency, beat=0.0, margin=None):
        self.latency = latency
        self.beat = beat
        self.margin = max(0.5, latency) if margin is None else margin
        self.retry = 2 * latency + self.margin
        self.dev = {}           # device -> state dict (see _state)
        self.suspect = {}       # device -> reason, in the order they became suspect
        self.asked = {}         # device -> when a resync was last requested
        self.stats = {"gaps": 0, "filled": 0, "lost": 0, "silent": 0, "skewed": 0}

    def _state(self, device, boot, seq):
        d = self.dev[device] = {"boot": boot, "high": seq, "high_t": None, "missing": {}, "last": None,
                                "last_t": None, "lag": []}
        return d

    def accept(self, now, device, boot, seq, t, birth=False):
        """Record an uplink; False for a duplicate (already seen, or too old to tell)."""
        d = self.dev.get(device)
        if d is None or d["boot"] != boot:
            d = self._state(device, boot, seq)
        elif seq > d["high"]:
            for s in range(max(d["high"] + 1, seq - WINDOW), seq):
                d["missing"][s] = (now, d["high_t"] if d["high_t"] is not None else t)
                self.stats["gaps"] += 1
            d["high"], d["high_t"] = seq, t
        elif d["missing"].pop(seq, None) is not None:
            self.stats["filled"] += 1
        else:
            return False
        for s in [s for s in d["missing"] if s < d["high"] - WINDOW]:
            del d["missing"][s]
        if birth:               # a birth carries the whole state: what it skipped is no longer missing
            d["missing"] = {s: at for s, at in d["missing"].items() if s > seq}
        d["last"] = now
        lag = d["lag"]
        lag.append(now - t)
        if len(lag) > SKEW_WINDOW:
            del lag[0]
        if d["high_t"] is None:
            d["high_t"] = t
        d["last_t"] = t
        return True

    def resynced(self, device):
        """A birth was applied: the device's state is the backend's again (a skewed clock is not)."""
        if self.suspect.get(device) != "clock skew":
            self.suspect.pop(device, None)
        self.asked.pop(device, None)

    def why(self, q, sources):
        """The integrity reasons among ``q``'s sources' devices, as a prefix of the degraded reason."""
        out = {}
        for key in q.sources:
            s = sources.get(key)
            r = None if s is None else self.suspect.get(s.device)
            if r is not None:
                out.setdefault(r, []).append(s.device)
        return "".join("%s: %s; " % (r, ", ".join(dict.fromkeys(devs))) for r, devs in out.items())

    def skew(self, device):
        """Lower bound of the device clock's lead over arrival time (s): -min(arrival - t)."""
        lag = self.dev[device]["lag"] if device in self.dev else ()
        return -min(lag) if lag else 0.0

    def check(self, now):
        """Devices newly suspect at ``now``: [(device, reason, device time from which the answers
        are revoked)], and [device] to ask for a birth."""
        new = []
        for device, d in self.dev.items():
            if device in self.suspect:
                continue
            reason = None
            if d["missing"] and min(at for at, _ in d["missing"].values()) + self.latency <= now:
                reason, key, since = "lost uplink", "lost", min(t for _, t in d["missing"].values())
            elif self.beat > 0 and d["last"] is not None and now > d["last"] + self.beat + self.latency + self.margin:
                reason, key, since = "silent", "silent", d["last_t"]
            elif d["lag"] and (min(d["lag"]) < 0 or min(d["lag"]) > self.latency):
                reason, key, since = "clock skew", "skewed", now - max(d["lag"]) - self.latency
            if reason is not None:
                self.suspect[device] = reason
                self.stats[key] += 1
                new.append((device, reason, since))
        ask = []
        for device, reason in self.suspect.items():
            if reason == "clock skew":
                continue
            if now >= self.asked.get(device, -math.inf) + self.retry:
                self.asked[device] = now
                ask.append(device)
        return new, ask

    def next_deadline(self):
        t = math.inf
        for device, d in self.dev.items():
            if device in self.suspect:
                if self.suspect[device] != "clock skew":
                    t = min(t, self.asked.get(device, -math.inf) + self.retry)
                continue
            if d["missing"]:
                t = min(t, min(at for at, _ in d["missing"].values()) + self.latency)
            if self.beat > 0 and d["last"] is not None:
                t = min(t, d["last"] + self.beat + self.latency + self.margin + 1e-9)
        return t
