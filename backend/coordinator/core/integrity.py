"""Delivery integrity per device (DESIGN.md §3 sequence numbers, heartbeat and event time; issue #20).

Sans-IO: every call takes ``now`` (the adapter's arrival clock); the coordinator asks ``due(now)`` for
what has become suspect and ``next_deadline()`` for when to ask again. Work is per uplink and per
due deadline (a heap, one entry per device and kind), never per device per call.

* **Gaps.** Uplink sequence numbers are tracked per device and boot (serial order mod 2**32). A number
  above the highest seen opens a gap for every number skipped; one inside a gap fills it (reordering
  is not loss); anything else is a duplicate. A gap still open λ after it was noticed is a lost uplink.
* **Silence.** With a heartbeat ``beat``, a device that sends nothing accepted for beat + λ + margin
  is silent (a lost last report, a partition, a reboot whose birth was lost).
* **Clock skew.** Device clocks may be off by up to ``skew`` (σ, a setting). A report stamped ``t``
  happened at a true time in [t − σ, t − lo], where ``lo = max(−σ, −min(arrival − t))`` is the
  estimated lower bound of the clock's lead: the coordinator applies it at ``t − σ`` and keeps the
  bound from before the report in the hull until ``t − lo`` (``cover``), and waits λ + 2σ so such a
  report is not late. A device seen leading by more than σ (arrival before ``t − σ``) is flagged.

* **Controls and probes.** An acknowledged control (a narrowing, a Cheng filter under a heartbeat, a
  control sent again) is ``expect``-ed back as a report carrying its epoch within 2λ + margin, a probe as
  its reply; unanswered (``due``), a probe is asked again and a control sent again to its source alone,
  waits doubling. A filter the protocol counts on (FILTER) keeps its source ``unsure`` (answers degraded)
  until answered, and a miss makes the device suspect ("control lost", revoked from when it left) until
  a report shows it in force. A report still carrying an epoch older than a control sent long before
  (``unconfirmed``) shows it lost, or the device's state lost: it is sent again (CHECK); unanswered
  twice, the device is suspect ("lost state") and asked for a birth.

A lost uplink, silence or a skewed clock makes the device *suspect*: the coordinator revokes the
answers over its sources since its last trusted uplink (``since``, event time) and degrades them with
the reason until a birth resynchronises it; a suspect device is asked for a birth at once, again on
its first uplink heard, and then with a backoff (``retry`` doubling up to an hour). A clock found
skewed stays suspect: a birth does not fix it.
"""
import heapq
import math

from edge.core.codec import newer as epoch_newer

WINDOW = 256            # sequence numbers below the highest seen that may still arrive
_HALF = 0x80000000
BACKOFF = 3600.0        # the longest wait between two requests for a birth (s); hearing it asks at once
SEEN = 32               # recent sequence numbers remembered with their time (a duplicate has the same)
RESOLUTION = 0.001      # device times are whole milliseconds on a board: a lead this small is rounding
SKEWED = "clock skew"
REBOOTED = "rebooted"
CONTROL = "control lost"
LOST_STATE = "lost state"
# what a control that is never confirmed does (``expect``): RETRY sends it again (the mirror covers its
# loss); FILTER (the protocol counts on it) degrades the device, revokes, sends it again as CHECK; CHECK
# (sent again after a stale report or a FILTER miss) once more, then degrades, revokes and asks for a birth
RETRY, FILTER, CHECK = 0, 1, 2


def newer(a, b):
    """Serial order of 32-bit sequence numbers: ``a`` after ``b``."""
    return 0 < (a - b) & 0xFFFFFFFF < _HALF


class Integrity:
    def __init__(self, latency, beat=0.0, skew=0.0, margin=None):
        self.latency = latency          # λ as the coordinator waits it (λ + 2σ)
        self.beat = beat
        self.sigma = skew
        self.margin = max(0.5, latency) if margin is None else margin
        self.retry = 2 * latency + self.margin
        self.dev = {}           # device -> per-device state (see _state)
        self.suspect = {}       # device -> reason, in the order they became suspect
        self.revokes = {}       # device -> since when its answers are revoked (a reboot or gap a birth shows)
        self.unknown = {}       # device -> seqs dropped before its first birth
        self.ctl = {}           # source key -> (epoch, when) of the latest control with an epoch
        self.need = {}          # device -> the highest uplink seq when it became suspect
        self.awaiting = {}      # devices suspect until the birth just accepted is applied
        self.settle = {}        # device -> event time its latest birth has surely happened by
        self.applied = {}       # device -> [boot, latest birth seq, {src: latest report seq}, {src: epoch}] applied
        self.waits = {}         # device -> {key or ("probe", key): (epoch or probe id, sent, since, stage, tries, unsafe)}
        self.unsure = {}        # source keys waiting for a filter the protocol counts on (answers degraded)
        self.heap = []          # (time, n, device, kind): "gap", "beat", "ask", "wait"
        self.n = 0
        self.stats = {"gaps": 0, "filled": 0, "lost": 0, "silent": 0, "skewed": 0, "asked": 0, "resent": 0}

    def _state(self, device, boot, seq, first_t):
        old = self.dev.get(device)
        d = self.dev[device] = {"boot": boot, "high": seq, "high_t": first_t, "missing": {}, "last": None,
                                "birth": (seq - 1) & 0xFFFFFFFF, "seen": {}, "birth_t": old["birth_t"] if old else -math.inf,
                                "last_t": first_t, "lead": -math.inf, "armed": old["armed"] if old else {},
                                "asked": old["asked"] if old else None, "wait": old["wait"] if old else 0.0}
        return d

    def _arm(self, device, kind, t):
        armed = self.dev[device]["armed"]
        if armed.get(kind, math.inf) > t:
            armed[kind] = t
            self.n += 1
            heapq.heappush(self.heap, (t, self.n, device, kind))

    # -- uplinks ---------------------------------------------------------------------------
    def accept(self, now, device, boot, seq, t, birth=False):
        """Record an uplink stamped ``t`` (device seconds); False for a duplicate."""
        d = self.dev.get(device)
        if d is not None and not birth and t < d["birth_t"]:
            return False        # sent before the latest birth (perhaps by a past boot): superseded by it
        since = reason = None
        if d is None or d["boot"] != boot:
            if d is not None and birth:     # rebooted: since its last birth (what followed may have been
                # the new boot's, numbered like the old one's), what it sent may be lost
                since = min([self.event(d["last_t"] if d["birth_t"] == -math.inf else d["birth_t"])]
                            + [at[1] for at in d["missing"].values()])
                reason = REBOOTED
            d = self._state(device, boot, seq, t)
            for s in self.unknown.pop(device, ()):  # dropped before this birth, but sent after it
                if newer(s, seq) and birth:
                    d["missing"][s] = (now, self.event(t))
                    self._arm(device, "gap", now + self.latency)
        else:
            ahead = (seq - d["high"]) & 0xFFFFFFFF
            if 0 < ahead < _HALF:
                if ahead > 1:
                    after = self.event(d["high_t"])       # what is missing was sent after this
                    for k in range(max(1, ahead - WINDOW), ahead):
                        d["missing"][(d["high"] + k) & 0xFFFFFFFF] = (now, after)
                        self.stats["gaps"] += 1
                d["high"], d["high_t"] = seq, t
                if len(d["missing"]) > WINDOW:
                    for s in [s for s in d["missing"] if (d["high"] - s) & 0xFFFFFFFF > WINDOW]:
                        del d["missing"][s]
                if d["missing"]:
                    self._arm(device, "gap", min(at for at, _ in d["missing"].values()) + self.latency)
            elif d["missing"].pop(seq, None) is not None:
                self.stats["filled"] += 1
            elif birth and (d["high"] - seq) & 0xFFFFFFFF > WINDOW and newer(seq, d["birth"]):
                d["high"], d["high_t"], d["missing"] = seq, t, {}    # seq rewound (stale uplinks of a past boot)
            else:
                if d["seen"].get(seq, t) != t and self.suspect.get(device) != SKEWED:
                    # the number again with another time: the device restarted its numbering (a
                    # reboot whose birth was lost); what it sent since is unknown
                    self.revokes[device] = self.event(d["last_t"])
                    self.suspect[device] = LOST_STATE
                    self.need[device] = d["high"]
                    self._arm(device, "ask", now)
                return False
        if birth:               # a birth carries the whole state: what it skipped is no longer missing,
            d["birth_t"] = t    # but the answers until it is applied may have been wrong
            if newer(seq, d["birth"]):
                d["birth"] = seq
            keep = {s: at for s, at in d["missing"].items() if newer(s, seq)}
            if len(keep) < len(d["missing"]):
                gone = min(at[1] for s, at in d["missing"].items() if s not in keep)
                since, reason = gone if since is None else min(since, gone), reason or "lost uplink"
            d["missing"] = keep
        if since is not None:
            self.revokes[device] = since
            self.suspect.setdefault(device, reason)
            self.need[device] = d["high"]
            self.awaiting[device] = None        # its birth is on the way: no need to ask
        d["seen"][seq] = t
        if len(d["seen"]) > SEEN:
            del d["seen"][next(iter(d["seen"]))]
        d["last"] = now
        d["last_t"] = max(d["last_t"], t)
        if t - now > d["lead"]:
            d["lead"] = t - now
        if self.beat > 0:
            self._arm(device, "beat", now + self.beat + self.latency + self.margin)
        if device in self.suspect and self.suspect[device] != SKEWED and d["asked"] is not None \
                and now >= d["asked"] + self.retry:
            self._arm(device, "ask", now)       # heard again (a partition ended): ask at once
        return True

    def dropped(self, device, seq):
        """An uplink numbered ``seq`` from a device without a birth yet was dropped: if the birth
        that comes turns out to be older, it is missing."""
        self.unknown.setdefault(device, []).append(seq)
        del self.unknown[device][:-WINDOW]

    # -- applying in sequence order -----------------------------------------------------------
    def fresh_birth(self, device, boot, seq):
        """Whether a birth (part) numbered ``seq`` of ``boot`` is not older than the latest birth
        applied; records it. A reordered older birth would hand the device's token and state back."""
        a = self.applied.get(device)
        if a is not None and a[0] == boot and newer(a[1], seq):
            return False
        if a is None or a[0] != boot:
            a = self.applied[device] = [boot, seq, {}, {}]
        a[1] = seq
        return True

    def superseded(self, device, boot, src, seq):
        """Whether a report or reply of source ``src`` numbered ``seq`` of ``boot`` is older than what
        was applied for it already (a later report, a later birth, a later boot); else records it."""
        a = self.applied.get(device)
        if a is None or a[0] != boot:
            return a is not None
        if newer(a[1], seq) or (src in a[2] and newer(a[2][src], seq)):
            return True
        a[2][src] = seq
        return False

    def regressed(self, device, src, epoch, now, birth=False):
        """Whether source ``src`` reports an epoch older than one its device already stated since its
        latest birth: it lost its state (a reboot whose birth was lost). Flags it (asked for a birth)."""
        a = self.applied[device]
        top = a[3].get(src)
        if not birth and top is not None and epoch_newer(top, epoch):
            self.flag(device, LOST_STATE, now)
            return True
        if birth or top is None or epoch_newer(epoch, top):
            a[3][src] = epoch
        return False

    def sent(self, key, epoch, clock, unsafe=False):
        """A control carrying ``epoch`` left for ``key``'s device once event time reached ``clock``;
        ``unsafe``: the protocol counts on it (answers are wrong while the device has not applied it)."""
        self.ctl[key] = (epoch, clock, unsafe)

    def unconfirmed(self, key, epoch, t):
        """Whether a report of ``key`` stamped ``t`` (event time) still carries an epoch older than a
        control sent long enough before it to have arrived: the control was lost, or the device lost its
        state (a reboot whose birth was lost, which nothing else may show). Returns (the event time the
        control was sent, unsafe), else None; the coordinator sends it again (``expect`` CHECK)."""
        c = self.ctl.get(key)
        if c is None or not epoch_newer(c[0], epoch) or t <= c[1] + 2 * self.latency + self.margin:
            return None     # (it leaves λ after its event time at the latest, and arrives λ later)
        del self.ctl[key]
        return c[1], c[2]

    def flag(self, device, reason, now, ask=True):
        """``device`` is out of sync for ``reason`` (a skewed clock stays the reason); ``ask``: for a birth."""
        if self.suspect.get(device) != SKEWED:
            if self.suspect.get(device, CONTROL) == CONTROL:
                self.suspect[device] = reason       # (a lost control gives way to what needs a birth)
            self.need[device] = self.dev[device]["high"]
            self.awaiting.pop(device, None)
            if ask:
                self._arm(device, "ask", now)

    # -- controls and probes awaiting an answer ------------------------------------------------
    def expect(self, device, what, token, now, since=None, stage=RETRY, tries=0, unsafe=False):
        """``what`` left for ``device`` at ``now``: a source key's control under epoch ``token`` (answered
        by a report carrying it) or ``("probe", key)`` with probe id ``token`` (by its reply). Unanswered
        after 2λ + margin (doubling with ``tries``) it is ``due``; ``since``: from when answers are revoked
        then; ``stage``: what that does (RETRY, FILTER, CHECK); ``unsafe``: the key is ``unsure`` meanwhile
        (a filter the protocol counts on)."""
        if device in self.dev:
            self.waits.setdefault(device, {})[what] = (token, now, since, stage, tries, unsafe)
            self._arm(device, "wait", now + self._wait(tries))
            if unsafe:
                self.unsure[what] = None

    def _wait(self, tries):
        return min(self.retry * (1 << min(tries, 12)), BACKOFF)

    def answered(self, device, what, token):
        """An answer to ``what`` (``expect``); True when it ends the device's "control lost" suspicion."""
        waits = self.waits.get(device)
        w = waits.get(what) if waits else None
        if w is None or (w[0] != token if type(what) is tuple else epoch_newer(w[0], token)):
            return False
        del waits[what]
        self.unsure.pop(what, None)
        if self.suspect.get(device) == CONTROL and all(x[3] == RETRY for x in waits.values()):
            del self.suspect[device]
            self.need.pop(device, None)
            return True
        return False

    def forget(self, device, key):
        """A birth voids the controls sent to ``key`` before it (probes are asked again)."""
        self.ctl.pop(key, None)
        self.waits.get(device, {}).pop(key, None)
        self.unsure.pop(key, None)

    def newest(self, device, src, seq):
        """Whether no report of ``src`` newer than a birth numbered ``seq`` was applied yet."""
        done = self.applied[device][2].get(src)
        return done is None or not newer(done, seq)

    def event(self, t):
        """The earliest true time of something a device stamped ``t`` (its event time)."""
        return t - self.sigma

    def cover(self, device, t):
        """Until when (event time) the bound from before a report stamped ``t`` stays in the hull."""
        d = self.dev.get(device)
        lead = d["lead"] if d is not None else -math.inf
        return t + min(self.sigma, -lead)

    def trusted(self, device, clock):
        """Whether ``device``'s sources may be answered from (not suspect, not settling)."""
        return device not in self.suspect and clock >= self.settle.get(device, -math.inf)

    def skew(self, device):
        """The estimated range (lo, hi) of ``device``'s clock lead over true time, in seconds."""
        d = self.dev.get(device)
        lo = max(-self.sigma, d["lead"]) if d is not None else -self.sigma
        return lo, max(lo, self.sigma)

    def resynced(self, device, settle, seq):
        """A birth was applied: the device's state is the backend's again (a skewed clock is not),
        once event time reaches ``settle`` (the latest instant the birth can have been sent), unless
        the birth (numbered ``seq``) is older than the uplink that made it suspect."""
        need = self.need.get(device)
        if need is not None and newer(need, seq):     # older than what the suspicion waits for (a reordered
            self.awaiting.pop(device, None)             # birth): ask for a newer one, no longer awaited
            self._arm(device, "ask", self.dev[device]["last"] or 0.0)
            return False
        if self.suspect.get(device, SKEWED) != SKEWED:
            del self.suspect[device]
        self.awaiting.pop(device, None)
        self.need.pop(device, None)
        self.settle[device] = settle
        d = self.dev.get(device)
        if d is not None:
            d["asked"], d["wait"] = None, 0.0
        return True

    # -- deadlines -------------------------------------------------------------------------
    def due(self, now):
        """What became due by ``now``: ([(device, reason, since)] newly suspect, with the event time
        from which its answers are revoked; [device] to ask for a birth; [(device, what, wait)] controls
        and probes unanswered, see ``expect``)."""
        new, ask, missed = [], [], []
        heap = self.heap
        while heap and heap[0][0] <= now:
            t, _, device, kind = heapq.heappop(heap)
            d = self.dev[device]
            if d["armed"].get(kind) != t:
                continue                # superseded by an earlier arming
            del d["armed"][kind]
            if kind == "wait":
                waits = self.waits.get(device, {})
                for what, w in [(what, w) for what, w in waits.items() if w[1] + self._wait(w[4]) <= now]:
                    del waits[what]
                    self.unsure.pop(what, None)
                    missed.append((device, what, w))
                if waits:
                    self._arm(device, "wait", min(w[1] + self._wait(w[4]) for w in waits.values()))
                continue
            if kind == "ask":
                if self.suspect.get(device, SKEWED) != SKEWED and device not in self.awaiting:
                    ask.append(device)
                    self.stats["asked"] += 1
                    d["asked"] = now
                    d["wait"] = min(2 * d["wait"], BACKOFF) if d["wait"] else self.retry
                    self._arm(device, "ask", now + d["wait"])
                continue
            if kind == "gap":
                if not d["missing"]:
                    continue
                first = min(at for at, _ in d["missing"].values())
                if first + self.latency > now:
                    self._arm(device, "gap", first + self.latency)
                    continue
                reason, since = "lost uplink", min(s for _, s in d["missing"].values())
                self.stats["lost"] += 1
            else:
                if d["last"] is None or d["last"] + self.beat + self.latency + self.margin > now:
                    if d["last"] is not None:
                        self._arm(device, "beat", d["last"] + self.beat + self.latency + self.margin)
                    continue
                reason, since = "silent", self.event(d["last_t"])
                self.stats["silent"] += 1
            if self.suspect.get(device, CONTROL) == CONTROL:
                self.suspect[device] = reason
                self.need[device] = d["high"]
                new.append((device, reason, since))
                self._arm(device, "ask", now)
        return new, ask, missed

    def check_clock(self, device, t, now):
        """True when ``device`` just showed a clock leading by more than σ (flag it)."""
        if t - now > self.sigma + RESOLUTION and self.suspect.get(device) != SKEWED:
            self.suspect.pop(device, None)
            self.suspect[device] = SKEWED
            self.stats["skewed"] += 1
            return True
        return False

    def horizon(self):
        """How long after an uplink was due the answers it affects may still be revoked."""
        return self.latency + (self.beat + self.latency + self.margin if self.beat > 0 else 0.0)

    def next_deadline(self):
        return self.heap[0][0] if self.heap else math.inf

    def why(self, q, sources):
        """The integrity reasons among ``q``'s sources' devices, as a prefix of the degraded reason."""
        if not self.suspect and not self.unsure:
            return ""
        out = {}
        for key in q.sources:
            s = sources.get(key)
            r = None if s is None else self.suspect.get(s.device)
            if r is not None:
                out.setdefault(r, {})[s.device] = None
            if key in self.unsure:
                out.setdefault("filter not confirmed", {})[key] = None
        return "".join("%s: %s; " % (r, ", ".join(devs)) for r, devs in out.items())
