"""Delivery integrity per device (DESIGN.md §3 sequence numbers, heartbeat and event time; §4 bounded withdrawal).

Sans-IO: every call takes ``now`` (the adapter's arrival clock); the coordinator asks ``due(now)`` for what has
become suspect and ``next_deadline()`` for when to ask again. Work is per uplink and per due deadline (a heap, one
entry per device and kind), never per device per call.

* **Gaps.** Uplink sequence numbers are tracked per device and boot (serial order mod 2**32). A number above the
  highest seen opens a gap for every number skipped (and a heartbeat ``mark``, which repeats the latest number used,
  for its own number too); one inside a gap fills it (reordering, a resend); anything else is a duplicate. A gap
  still open after its wait (λ; λ + 3·rto for an uplink the device keeps in ack mode, ``heartbeat``) is a lost
  uplink; one admission refused, after λ (``refused``: the ack passes it, so the device does not resend it for
  ever). The first gap seen turns ack mode on. A report or mark numbered more than WINDOW ahead, or as far behind
  and before the boot's latest birth, is of a boot whose birth is lost (each boot numbers from its own start,
  ``edge.core.delivery``): the device rebooted.
* **Silence.** With a heartbeat (B per device, ``heartbeat``), a device that sends nothing for B + λ + margin is
  silent (a lost last report whose mark was lost too, a partition, a lost birth).
* **Event time.** A report stamped ``t`` happened at a true time in [t − hi, t − lo], the bounds of the device
  clock's lead (``offsets``): the coordinator applies it at ``event`` t − hi and keeps the bound from before it in
  the hull until ``cover`` t − lo. A stamp the clock cannot have made is dropped for that message (it is placed by
  its arrival); a clock known less well than ±σ degrades its device as "clock skew" (never "offline") until a
  downlink's echo bounds it.
* **Watermark.** ``watermark(device)``: the event time through which every uplink of the device is in (the latest
  stamp, a mark's included, with no number missing before it); ``marked(device)``: the latest mark's stamp with no
  number missing before it (a mark also proves the device's segment data complete through its stamp). The final
  mirror (``replay.py``) reads both; it keeps no sequence tracking of its own.

A lost uplink or silence makes the device *suspect*: the coordinator revokes the answers over its sources since its
last trusted uplink (``since``, event time) and degrades them with the reason until a birth resynchronises it; a
suspect device is asked for a birth at once, again on its first uplink heard, and then with a backoff (``retry``
doubling up to an hour). Controls and probes awaiting their effect are ``waits.py``.
"""
import heapq
import math

from backend.coordinator.core.clocks import Clocks
from backend.coordinator.core.heartbeat import Heartbeats, TRIES
from backend.coordinator.core.offsets import Offsets
from backend.coordinator.core.waits import BACKOFF, CHECK, CONTROL, FILTER, LOST_STATE, RETRY, Waits  # noqa: F401
from edge.core.codec import newer as epoch_newer

WINDOW = 256            # sequence numbers below the highest seen that may still arrive
_HALF = 0x80000000
SEEN = 32               # recent sequence numbers remembered with their time (a duplicate has the same)
SKEWED = "clock skew"
REBOOTED = "rebooted"
LOST = "lost uplink"


def newer(a, b):
    """Serial order of 32-bit sequence numbers: ``a`` after ``b``."""
    return 0 < (a - b) & 0xFFFFFFFF < _HALF


class Integrity(Waits, Clocks):
    def __init__(self, latency, beat=None, skew=0.0, margin=None, net=None, delay=0.0):
        self.latency = latency          # λ as the coordinator waits it (λ + 2σ)
        self.margin = max(0.5, latency) if margin is None else margin
        self.retry = 2 * latency + self.margin
        self.offsets = Offsets(skew)
        self.links = Heartbeats(beat, latency, latency - 2 * skew if net is None else net, self.margin, delay)
        self.now, self.dev = -math.inf, {}     # dev: device -> per-device state (see _state)
        self.suspect = {}       # device -> reason, in the order they became suspect
        self.revokes = {}       # device -> since when its answers are revoked (a reboot or gap a birth shows)
        self.unknown = {}       # device -> seqs dropped before its first birth
        self.ctl = {}           # source key -> (epoch, when) of the latest control with an epoch
        self.left = {}          # source key or ("probe", key) -> (epoch or probe id, adapter time it left)
        self.need = {}          # device -> the highest uplink seq when it became suspect
        self.awaiting = {}      # devices suspect until the birth just accepted is applied
        self.skipped = {}       # device -> (boot, seq) of the latest birth that made missing numbers no longer missing, or a reboot's
        self.settle = {}        # device -> event time its latest birth has surely happened by
        self.applied = {}       # device -> [boot, latest birth seq, {src: latest report seq}, {src: epoch}] applied
        self.waits = {}         # device -> {key or ("probe", key): (epoch or probe id, sent, since, stage, tries, unsafe)}
        self.unsure = {}        # source keys waiting for a filter the protocol counts on (answers degraded)
        self.news = {"link": [], "beat": [], "moved": []}   # to switch to ack mode, to tell B; (device, B before) moved
        self.unseen = {}        # device -> numbers gone missing less those filled since asked (precision.regret)
        self.heap, self.n = [], 0   # (time, n, device, kind): "gap", "beat", "ask", "wait"
        self.stats = {"gaps": 0, "filled": 0, "lost": 0, "silent": 0, "skewed": 0, "asked": 0, "resent": 0, "refused": 0}

    def _state(self, device, boot, seq, first_t):
        old = self.dev.get(device)
        d = self.dev[device] = {"boot": boot, "high": seq, "high_t": first_t, "missing": {}, "last": None,
                                "birth": (seq - 1) & 0xFFFFFFFF, "seen": {}, "birth_t": old["birth_t"] if old else -math.inf,
                                "last_t": first_t, "wm": -math.inf, "mark_t": -math.inf, "mk": -math.inf, "refused": {},
                                "armed": old["armed"] if old else {},
                                "asked": old["asked"] if old else None, "wait": old["wait"] if old else 0.0}
        return d

    def _arm(self, device, kind, t):
        armed = self.dev[device]["armed"]
        if armed.get(kind, math.inf) > t:
            armed[kind] = t
            self.n += 1
            heapq.heappush(self.heap, (t, self.n, device, kind))

    def _gap(self, d, device, now, k0, k1):
        """Numbers high + k0 .. high + k1 - 1 are missing, noticed ``now``: each waited for (``heartbeat``)."""
        after = self.event(device, d["high_t"])       # what is missing was sent after this
        wait = self.links.wait(device, after)
        for k in range(max(k0, k1 - WINDOW), k1):
            d["missing"][(d["high"] + k) & 0xFFFFFFFF] = (now + wait, after)
            self.stats["gaps"] += 1
            self.unseen[device] = self.unseen.get(device, 0) + 1
        self.news["link"] += self.links.switch_on(device, now)

    # -- uplinks ---------------------------------------------------------------------------
    def accept(self, now, device, boot, seq, t, birth=False, mark=False):
        """Record an uplink stamped ``t`` (device seconds); False for a duplicate. A ``mark`` (True: heard)
        is never queued: it advances the watermark and shows what is missing."""
        self.now = now
        d = self.dev.get(device)
        if d is not None and not birth and t < d["birth_t"]:
            return False        # sent before the latest birth (perhaps by a past boot): superseded by it
        since = reason = None
        if d is None or d["boot"] != boot:
            if d is not None and birth:     # rebooted: what the old boot sent after its latest uplink heard
                # (and in its gaps) may be lost; what it was heard to send is its own (a boot's numbers start
                # far from any other's, ``edge.core.delivery``), so answers before that stand
                since = min([self.event(device, d["last_t"])] + [at[1] for at in d["missing"].values()])
                reason, self.skipped[device] = REBOOTED, (boot, seq)    # (the old boot's tail may be lost: the final
            d = self._state(device, boot, seq, t)       # mirror's watermark waits at its latest uplink until it takes this)
            for s in self.unknown.pop(device, ()):  # dropped before this birth, but sent after it
                if 0 < (s - seq) & 0xFFFFFFFF <= WINDOW and birth:
                    d["missing"][s] = (now + self.latency, self.event(device, t))
                    self.unseen[device] = self.unseen.get(device, 0) + 1
                    self._arm(device, "gap", now + self.latency)
        else:
            ahead = (seq - d["high"]) & 0xFFFFFFFF
            if not birth and (WINDOW < ahead < _HALF or ahead >= _HALF and (d["high"] - seq) & 0xFFFFFFFF > WINDOW
                              and not newer(seq, d["birth"])):
                return self._restarted(d, device, now, seq)
            if 0 < ahead < _HALF:
                if ahead > 1 or mark:
                    self._gap(d, device, now, 1, ahead + mark)
                d["high"] = seq
                if not mark:
                    d["high_t"] = t
                if len(d["missing"]) > WINDOW:
                    for s in [s for s in d["missing"] if (d["high"] - s) & 0xFFFFFFFF > WINDOW]:
                        del d["missing"][s]
                if d["missing"]:
                    self._arm(device, "gap", min(at for at, _ in d["missing"].values()))
            elif mark:      # behind the latest number: an old mark reordered, or numbers started again by a
                if seq != d["high"]:    # reboot whose birth is unseen; it proves nothing (heard all the same)
                    t = -math.inf
            elif d["missing"].pop(seq, None) is not None:
                self.stats["filled"], self.unseen[device] = self.stats["filled"] + 1, self.unseen.get(device, 0) - 1
            elif birth and (d["high"] - seq) & 0xFFFFFFFF > WINDOW and newer(seq, d["birth"]):
                d["high"], d["high_t"], d["missing"] = seq, t, {}    # seq rewound (stale uplinks of a past boot)
            else:
                if d["seen"].get(seq, t) != t:
                    # the number again with another time: the device restarted its numbering (a
                    # reboot whose birth was lost); what it sent since is unknown
                    self.revokes[device] = self.event(device, d["last_t"])
                    self.suspect[device] = LOST_STATE
                    self.need[device] = d["high"]
                    self._arm(device, "ask", now)
                self._heard(d, device, now, -math.inf, True)    # (heard; its stamp proves nothing new)
                return False
        if birth:               # a birth carries the whole state: what it skipped is no longer missing,
            d["birth_t"] = t    # but the answers until it is applied may have been wrong
            if newer(seq, d["birth"]):
                d["birth"] = seq
            keep = {s: at for s, at in d["missing"].items() if newer(s, seq)}
            if len(keep) < len(d["missing"]):
                gone = min(at[1] for s, at in d["missing"].items() if s not in keep)
                self.skipped[device] = (boot, seq)      # (its watermark jumps the gap: the final mirror's does not)
                since, reason = gone if since is None else min(since, gone), reason or LOST
            d["missing"] = keep
        if since is not None:
            self.revokes[device] = since
            self.suspect.setdefault(device, reason)
            self.need[device] = d["high"]
            self.awaiting[device] = None        # its birth is on the way: no need to ask
        if mark:
            d["mark_t"] = max(d["mark_t"], t)
        else:
            d["seen"][seq] = t
            if len(d["seen"]) > SEEN:
                del d["seen"][next(iter(d["seen"]))]
        self._heard(d, device, now, t, mark)
        if device in self.suspect and d["asked"] is not None and now >= d["asked"] + self.retry:
            self._arm(device, "ask", now)       # heard again (a partition ended): ask at once
        return True

    def _restarted(self, d, device, now, seq):
        """A report or mark numbered ``seq`` far outside ``device``'s window: a boot numbers from its own start (``edge.
        core.delivery``), so the device rebooted and its birth is lost (or a past boot's uplink came very late). It is
        dropped (missing if the next birth numbered it after itself, ``dropped``); the device's state is unknown since
        its last trusted uplink until a birth after ``seq``. False (not accepted)."""
        self.dropped(device, seq)
        if self.suspect.get(device, CONTROL) in (CONTROL, LOST):
            self.suspect[device] = REBOOTED
            self.revokes[device] = self.event(device, d["last_t"])
            self.need[device] = seq
            self.awaiting.pop(device, None)
            self._arm(device, "ask", now)
        self._heard(d, device, now, -math.inf, True)    # (heard: not silent)
        return False

    def _heard(self, d, device, now, t, again):
        """``device`` was heard (``again``: a mark or a duplicate, not a new numbered uplink)."""
        d["last"] = now
        if t > d["last_t"]:
            d["last_t"] = t
        if not d["missing"]:
            d["wm"], d["mk"] = d["last_t"], d["mark_t"]
        was, tell = self.links.heard(device, now, not again)
        if tell:
            self.news["beat"].append(device)
        if self.links.beat(device) != was:
            self.news["moved"].append((device, was))
        b = self.links.beat(device)
        if b > 0:
            self._arm(device, "beat", now + b + self.latency + self.margin)

    def marked(self, device):
        """Event time of ``device``'s latest mark with no number missing before it (-inf: none yet)."""
        d = self.dev.get(device)
        return -math.inf if d is None or d["mk"] == -math.inf else self.event(device, d["mk"])

    def dropped(self, device, seq):
        """An uplink numbered ``seq`` from a device without a birth yet was dropped: missing if the birth that comes is older."""
        self.unknown.setdefault(device, []).append(seq)
        del self.unknown[device][:-WINDOW]

    def refused(self, now, device, seq):
        """Uplink ``seq`` was refused by admission (a stamp or value that cannot be true): missing for good, lost after
        λ like any gap (no resend wait) and passed by the ack (``upto``); False over WINDOW ahead (not acknowledged)."""
        d = self.dev.get(device)
        ahead = WINDOW + 1 if d is None else (seq - d["high"]) & 0xFFFFFFFF
        if WINDOW < ahead < _HALF:
            return False
        self.now, self.stats["refused"] = now, self.stats["refused"] + 1
        if 1 < ahead <= WINDOW:
            self._gap(d, device, now, 1, ahead)
        if 0 < ahead <= WINDOW:
            d["high"] = seq
        elif seq not in d["missing"]:
            return True         # in already, or long lost: acknowledged again
        due, after = d["missing"].get(seq, (math.inf, self.event(device, d["high_t"])))
        self.unseen[device] = self.unseen.get(device, 0) + (seq not in d["missing"])
        d["missing"][seq] = (min(due, now + self.latency), after)
        d["refused"] = dict.fromkeys([s for s in d["refused"] if s in d["missing"]] + [seq])
        self._arm(device, "gap", now + self.latency)
        return True

    def upto(self, device):
        """The highest number through which every uplink of ``device``'s boot is in or refused (an ``ack``'s)."""
        d = self.dev[device]
        holes = [s for s in d["missing"] if s not in d["refused"]]
        if not holes:
            return d["high"]
        return (max(holes, key=lambda s: (d["high"] - s) & 0xFFFFFFFF) - 1) & 0xFFFFFFFF

    def watermark(self, device):
        """Event time through which every uplink of ``device`` has been received (-inf: none yet)."""
        d = self.dev.get(device)
        return -math.inf if d is None or d["wm"] == -math.inf else self.event(device, d["wm"])

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

    def flag(self, device, reason, now, ask=True):
        """``device`` is out of sync for ``reason``; ``ask``: for a birth."""
        if self.suspect.get(device, CONTROL) == CONTROL:
            self.suspect[device] = reason       # (a lost control gives way to what needs a birth)
        self.need[device] = self.dev[device]["high"]
        self.awaiting.pop(device, None)
        if ask:
            self._arm(device, "ask", now)

    def newest(self, device, src, seq):
        """Whether no report of ``src`` newer than a birth numbered ``seq`` was applied yet."""
        done = self.applied[device][2].get(src)
        return done is None or not newer(done, seq)

    def resynced(self, device, settle, seq, boot):
        """A birth was applied: the device's state is the backend's again, once event time reaches ``settle`` (the
        latest instant the birth can have been sent), unless the birth (``seq``) is older than the uplink that made
        it suspect, or of an earlier ``boot`` than the one heard last (what that boot sent after it may be lost)."""
        d = self.dev.get(device)
        if d is not None and d["boot"] != boot:
            return False
        need = self.need.get(device)
        if need is not None and newer(need, seq):     # older than what the suspicion waits for (a reordered
            self.awaiting.pop(device, None)             # birth): ask for a newer one, no longer awaited
            self._arm(device, "ask", self.dev[device]["last"] or 0.0)
            return False
        self.suspect.pop(device, None)
        self.awaiting.pop(device, None)
        self.need.pop(device, None)
        self.settle[device] = settle
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
                missed += self._missed(device, now)
                continue
            if kind == "ask":
                if device in self.suspect and device not in self.awaiting:
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
                if first > now:
                    self._arm(device, "gap", first)
                    continue
                reason, since = LOST, min(s for _, s in d["missing"].values())
                self.stats["lost"] += 1
            else:
                b = self.links.beat(device)
                if d["last"] is None or b <= 0 or d["last"] + b + self.latency + self.margin > now:
                    if d["last"] is not None and b > 0:
                        self._arm(device, "beat", d["last"] + b + self.latency + self.margin)
                    continue
                reason, since = "silent", self.event(device, d["last_t"])
                self.stats["silent"] += 1
            if self.suspect.get(device, CONTROL) == CONTROL:
                self.suspect[device] = reason
                self.need[device] = d["high"]
                new.append((device, reason, since))
                self._arm(device, "ask", now)
        return new, ask, missed

    def horizon(self):
        """How long after an uplink was due the answers it affects may still be revoked (before any device
        has been timed)."""
        b = self.links.first()
        return self.latency + TRIES * self.links.rto + (b + self.latency + self.margin if b > 0 else 0.0)

    def next_deadline(self):
        return self.heap[0][0] if self.heap else math.inf

    def why(self, q, sources, unclocked):
        """The integrity reasons among ``q``'s sources' devices, as a prefix of the degraded reason."""
        if not self.suspect and not self.unsure and not unclocked:
            return ""
        out = {}
        for key in q.sources:
            s = sources.get(key)
            if s is None:
                continue
            r = self.suspect.get(s.device) or (SKEWED if key in unclocked else None)
            if r is not None:
                out.setdefault(r, {})[s.device] = None
            if key in self.unsure:
                out.setdefault("filter not confirmed", {})[key] = None
        return "".join("%s: %s; " % (r, ", ".join(devs)) for r, devs in out.items())
