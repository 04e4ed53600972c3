"""Sans-IO stream coordinator (Olston et al. 2003 §1.2.3, §4): uplink in, control and answers out.

Uplink messages enter a serialising queue ordered by their device timestamp and are released once
``now >= t + λ`` (the latency tolerance), so the bound cache and the answers advance in event time.
Each release of one timestamp is atomic; the answers it changes are returned with that logical time.
Every call returns a list of actions: ``("down", device, payload)`` or ``("answer", change)``.

Devices (DESIGN.md §2, §3): times of a device whose birth says CAP_MS are integer milliseconds and are
read as seconds here; a CAP_F32 device is mirrored in float32. Adjustment ticks fall at
``(t0_ms + k·T_ms) / 1000``, the expression a device computes in integers, so both agree to the bit.
Every downlink carries the backend's ``incarnation`` and the token of the device birth it answers; after
the adapter sets a new incarnation (a new backend run), a device gets a config of it before its next control.
Filter models (edge.core.predict): ``models`` is the mask of models devices may use, told to a device
whose birth says CAP_LINE in a ``setup`` (a config with that mask) instead of a ``config``; a line
source's statement changes with time, so it is restated at its refresh times.
Downlinks (controls, configs, probes and the waits for their effect) are made in ``downlink.py``, uplinks
and births handled in ``uplink.py``, integrity findings in ``resync.py`` (mixins of this class).
"""
import heapq
import math

from backend.coordinator.core import aggregate
from backend.coordinator.core.acks import Acks
from backend.coordinator.core.admission import RATE, Admission
from backend.coordinator.brownian.interruption import Models
from backend.coordinator.core.boundcache import BoundCache
from backend.coordinator.core.downlink import Downlink
from backend.coordinator.core.finals import FINALS, Finals
from backend.coordinator.core.integrity import Integrity
from backend.coordinator.core.resync import Resync
from backend.coordinator.core.queries import QueryError, parse_query
from backend.coordinator.core.reserve import Reserve
from backend.coordinator.core.segments import Mirror, segmented
from backend.coordinator.core.uplink import Uplink
from backend.coordinator.core.vouch import Vouch


class _Known:
    """Membership of the sources a query may name (born or declared), in O(1)."""
    __slots__ = ("coord",)

    def __init__(self, coord):
        self.coord = coord

    def __contains__(self, key):
        return key in self.coord.cache.sources or key in self.coord.declared_set


class Coordinator(Downlink, Resync, Uplink, Vouch):
    def __init__(self, protocol, period=10.0, shrink=0.0, latency=0.0, beat=None, t0=0.0, lazy=True, incarnation=0,
                 models=1, skew=0.0, echo=False, owners=None, rate=RATE, ack_delay=0.0):
        if period < 0.001 or not (0 <= shrink < 1) or latency < 0 or (beat or 0) < 0 or skew < 0:
            raise ValueError("need period >= 1 ms, 0 <= shrink < 1, latency >= 0, beat >= 0, skew >= 0")
        self.protocol = protocol
        if beat is None and not protocol.marks:
            beat = 0.0                  # (no marks and no watchdog: the protocol's probes find a silent device)
        self.period = period            # T, the adjustment period
        self.shrink = shrink            # S, the shrink fraction (0 for static protocols)
        # λ (0 when the protocol pads instead), plus 2σ: a report stamped t by a clock within ±σ is
        # applied at t − σ and arrives by t + σ + λ (integrity.py)
        self.tolerance = latency + 2 * skew
        self.latency = protocol.queue_latency(self.tolerance)
        self.beat = beat                # the heartbeat B of every device (None: per device, heartbeat.py)
        # echo: downlinks leave when the driver says (the Spark job publishes a batch's controls after
        # it), seen as ``handle_echo``; round-trip waits start there, not when a control was made
        self.echo = echo
        self.t0 = t0
        self.lazy = lazy                # skip idle ticks in O(1); False ticks every period (the test oracle)
        self.inc = incarnation & 0xFFFFFFFF     # this backend run, stamped on every downlink
        # filter models devices may use (edge.core.predict bits); a line's statement is a function of
        # time, so only devices on our clock may use lines: with a skew σ to cover, constant only
        self.allow = models if skew == 0 else 1
        self.wall = 0.0                 # the adapter's clock at the current call (a config's "now")
        self.cache = BoundCache()
        self.queries = {}
        self.by_source = {}             # key -> {query id: None} (an ordered set)
        self.devices = {}               # device -> {"boot", "seq", "down", "keys", "online", "to", "single",
        #                                 "inc": the incarnation of its latest config}
        self.unit = {}                  # device -> 1000 when its times are integer milliseconds
        self.queue = []                 # (t, order, n, device, kind, fields)
        self.n = 0
        self.tick = 1                   # index of the next adjustment tick t0 + tick·T
        self.clock = -math.inf          # logical (event) time reached
        # Ordered sets (dicts): their order reaches float sums and output (DESIGN.md §2 determinism)
        self.dirty = {}                 # queries whose answer may have changed
        self.dirty_src = {}             # sources whose known bound may have changed, in touch order
        self.running = {}               # query id -> aggregate.Running
        self.last = {}                  # query id -> last emitted answer fields
        self.out = []
        self.rx = {}                    # device -> (boot, last uplink seq) for duplicate suppression
        self.early = {}                 # device -> uplinks heard before its first birth (uplink.py), oldest first
        # DBM models of every source, for the interruption model (Zhu §4.5); a protocol may bring its own
        self.models = getattr(protocol, "models", None) or Models()
        self.segments = Mirror()        # segment mode of lag queries' sources
        self.finals = Finals(self)      # the final mirror and every query's final answers
        self.stats = {"bad_messages": 0, "duplicates": 0, "late": 0, "conflicts": 0, "unknown_device": 0}
        self.integrity = Integrity(self.latency, beat, skew, net=latency, delay=ack_delay)  # gaps, silence, clocks
        self.acks = Acks(ack_delay)     # ack mode's acks and nacks (issue #20, #30)
        self.unclocked = {}             # source keys whose device clock is known less well than ±σ (degraded)
        # who may claim a source, floods, implausible stamps and values (DESIGN.md §10): counters in stats
        self.admission = Admission(owners, skew, rate, self.stats)
        self.revoked = {}               # query id -> [t_from, t_to] of answers found wrong, for the next change
        self.beats = {}                 # query id -> {heartbeat B: sources of the query at it} (vouch.py)
        self.reserve = Reserve()        # the precision each query keeps off its widths for clock skew
        self.replan = {}                # queries whose reserve moved: their widths are planned again

    # -- queries ----------------------------------------------------------------
    def add_query(self, spec, now=None):
        """Register a query; a ``QueryError`` (from the spec or the protocol) leaves nothing behind
        (what the protocol queued before refusing goes out with the next output)."""
        self._catch_up(now)
        q = self._parse(spec)
        if q.id in self.queries:
            raise QueryError("query %s is registered already" % q.id)
        return self._register(q, now, None)

    def replace_query(self, spec, now=None):
        """Register ``spec`` in place of the query with its id (an ``"all"`` query taking newborn sources
        in). A protocol that rebuilds its per-query state from the queries (``Protocol.replaces``) gets
        one update over both source sets, so a source whose filter stays the same hears nothing (a
        removal and an addition send two messages to every source); any other gets the removal and the
        addition. A ``QueryError`` from the spec leaves the old query in place; one from the protocol
        removes it."""
        self._catch_up(now)
        q = self._parse(spec)
        old = self.queries.get(q.id)
        if old is None:
            raise QueryError("query %s is not registered" % q.id)
        if self.protocol.replaces:
            return self._register(q, now, old)
        self._unregister(q.id, now, segments=False)    # the segment mirror changes once, with the addition
        return self._register(q, now, None, old)

    def _parse(self, spec):
        q = parse_query(spec, self.all_sources, self.protocol.kinds, _Known(self))
        self.reserve.begin(q, self.integrity.sigma > 0 and self.protocol.finals and q.kind in FINALS)
        q.reserve = self.reserve.get(q.id)
        self.segments.check(self, q)
        return q

    def _register(self, q, now, old, was=None):
        """``q`` replaces ``old`` in the protocol's state (None: new to it; ``was``: the query it replaces,
        unregistered already)."""
        if old is not None:
            for s in old.sources:
                self.by_source[s].pop(q.id, None)
            self.running.pop(q.id, None)
        self.queries[q.id] = q
        for s in q.sources:
            self.by_source.setdefault(s, {})[q.id] = None
        self._requeried(q, old)
        self.dirty[q.id] = None
        self.restate_models()           # (before the query's controls: a lead the models no longer allow)
        try:
            self._changed(q, now, old)
        except QueryError:
            self._unregister(q.id, now, old)
            raise
        self.segments.queries_changed(self, (q, old or was))
        self.finals.queries_changed(self._now(now), (q.id,))
        return self._flush(now)

    def remove_query(self, qid, now=None):
        self._catch_up(now)
        self._unregister(qid, now)
        self.reserve.drop(qid)
        return self._flush(now)

    def _unregister(self, qid, now, old=None, segments=True):
        """Drop query ``qid`` and revisit its sources (and ``old``'s, a query it was replacing); the
        protocol's messages stay queued for the caller's flush (``drain`` after a refusal)."""
        q = self.queries.pop(qid)
        for s in q.sources:
            self.by_source[s].pop(qid, None)
        self.dirty.pop(qid, None)
        self.beats.pop(qid, None)
        self.last.pop(qid, None)
        self.running.pop(qid, None)
        self.restate_models()
        self._changed(q, now, old)
        if segments:
            self.segments.queries_changed(self, (q, old))
            self.finals.queries_changed(self._now(now), (qid,))

    def drain(self):
        """The messages queued and not returned yet: a refused query change returns none."""
        return self._flush(None)

    def set_precision(self, qid, precision, now=None):
        self._catch_up(now)
        spec = self.queries[qid].spec()
        spec["precision"] = precision
        self.queries[qid] = parse_query(spec, self.all_sources, self.protocol.kinds, _Known(self))
        self.queries[qid].reserve = self.reserve.get(qid)
        self.dirty[qid] = None
        self._changed(self.queries[qid], now)
        self.segments.queries_changed(self, (self.queries[qid],))     # segment widths follow the precision
        self.finals.queries_changed(self._now(now), (qid,))
        return self._flush(now)

    changed = None      # while a query changes: its sources (a local protocol revisits only them)

    def _changed(self, q, now, old=None):
        self.changed = q.sources if old is None else q.sources + [s for s in old.sources if s not in q.weights]
        try:
            self.protocol.queries_changed(self, self._now(now))
        finally:
            self.changed = None

    declared = ()
    declared_set = frozenset()

    def declare_sources(self, keys):
        """Sources (in order) that queries may name before their devices have been born."""
        self.declared = tuple(keys)
        self.declared_set = frozenset(self.declared)

    def all_sources(self):
        """Declared sources in their order, then any other born source in birth order."""
        declared = set(self.declared)
        return list(self.declared) + [k for k in self.cache.sources if k not in declared]

    def _catch_up(self, now):
        """Before a query change at ``now``: the idle ticks a per-period coordinator would have run."""
        if now is not None and self.idle():
            self._release(now)

    def _now(self, now):
        return self.clock if now is None else now

    def schedule_ms(self):
        """``(t0, T)`` in integer ms, from ``t0`` and ``period`` as they are now (an adapter or a
        protocol may change them): what devices are told and what ticks are computed from."""
        return round(self.t0 * 1000), round(self.period * 1000)

    _ticks = (None, None, 0, 0)     # (t0, period) and their ``schedule_ms``, recomputed when either changes

    def tick_time(self, k):
        """Event time of adjustment tick ``k``."""
        m = self._ticks
        if m[0] != self.t0 or m[1] != self.period:
            m = self._ticks = (self.t0, self.period) + self.schedule_ms()
        return (m[2] + k * m[3]) / 1000

    # -- time -------------------------------------------------------------------------
    def idle(self):
        """Whether an adjustment tick with nothing due changes nothing: no shrink, a protocol whose
        ``quiet`` says so, no offline source (its widening grows tick by tick), nothing dirty. Idle
        ticks are not waited for and are skipped in O(1) (``lazy``); the result is the same as ticking."""
        return (self.lazy and not self.shrink and not self.models.off_since and not self.dirty
                and not self.dirty_src and self.protocol.quiet(self))

    def next_deadline(self):
        head = min(self.queue[0][0] if self.queue else math.inf, self.cache.next_due())
        t = head if self.idle() else min(head, self.tick_time(self.tick))
        return min(t + self.latency, self.integrity.next_deadline(), self.acks.next_deadline())

    def handle_timer(self, now):
        return self._advance(now)

    def _skip(self, limit):
        """Jump over the idle ticks strictly before ``limit`` but the last, which then runs as usual."""
        self.tick_time(0)           # ``tick_time`` inlined: (t0 + k·T) / 1000 in integer ms
        a, p = self._ticks[2:]
        tick = self.tick
        k = max(tick, int((limit - self.t0) // self.period))
        while k > tick and (a + k * p) / 1000 >= limit:
            k -= 1
        while (a + (k + 1) * p) / 1000 < limit:
            k += 1
        if k > tick:
            self.tick = k
            self.cache.new_period()
            self.models.new_tick()

    def _advance(self, now):
        self.wall = now
        self._release(now)
        self._integrity(now)
        self._answers(self.clock)
        self.out += self.finals.answers(max(self.clock, now - self.latency))    # (every uplink stamped by then is in)
        for qid in self.replan:         # a reserve moved (reserve.py): plan the query's widths again
            q = self.queries.get(qid)
            if q is not None:
                q.reserve = self.reserve.get(qid)
                self._changed(q, None)
        self.replan.clear()
        return self._flush(None)

    def _release(self, now):
        """Apply every uplink and tick due by ``now`` (time ``t`` is due at ``t + λ``)."""
        queue, cache, latency = self.queue, self.cache, self.latency
        while True:
            tick_t = self.tick_time(self.tick)
            head = queue[0][0] if queue else math.inf
            due = cache.next_due() if cache.due else math.inf
            if due < head:
                head = due
            if tick_t < head and tick_t + latency <= now and self.idle():   # (a tick not due yet: none to skip)
                self._skip(min(head, now - latency))
                tick_t = self.tick_time(self.tick)
            t = head if head <= tick_t else tick_t
            if t + latency > now:       # the same expression as next_deadline, so timers land
                break
            self.clock = self.cache.now = t
            while self.queue and self.queue[0][0] == t:
                _, _, _, device, kind, m = heapq.heappop(self.queue)
                self._apply(device, kind, m)
            for key in cache.refreshes(t) if cache.due else ():     # lines move: restate them
                self._touch(key)
            if tick_t == t:
                self.tick += 1
                if self.shrink:
                    self.cache.shrink(self.shrink, self._shrink_hold(t))
                    self.finals.replay.shrink(t, self.shrink)
                    self.dirty_src.update(dict.fromkeys(self.cache.sources))
                self.protocol.period(self, t)
                for key in self.models.off_since:    # offline widening grows with time
                    self._touch(key)
                self.cache.new_period()
                self.models.new_tick()
            self._answers(t)

    def _flush(self, now):
        if now is not None:
            self._answers(self._now(now))
        out, self.out = self.out, []
        return out

    # -- answers ----------------------------------------------------------------------
    def degraded(self, q):
        """Whether a source of ``q`` is offline, waits for a filter the protocol counts on, has a clock known less
        well than ±σ, or is contested."""
        return q.meets(self.models.off_since) or q.meets(self.integrity.unsure) or q.meets(self.unclocked) \
            or q.meets(self.admission.contested)

    def _answers(self, t):
        self.cache.now = t
        if not self.dirty_src and not self.dirty:
            return
        for key in self.dirty_src:
            qids = self.by_source.get(key)
            if qids:
                bound = self.cache.known(key)
                for qid in qids:
                    r = self.running.get(qid)
                    if r is not None:
                        r.update(key, bound)
                self.dirty.update(qids)     # qids is an ordered set too
        self.dirty_src.clear()
        for qid in sorted(self.dirty):
            q = self.queries.get(qid)
            if q is None:
                continue
            fields = self.finals.realtime(q, t) if segmented(q) else self.protocol.answer(self, q)
            offline = self.degraded(q)
            fields["degraded"] = bool(fields.get("degraded")) or offline
            if offline:
                why = self.integrity.why(q, self.cache.sources, self.unclocked) + self.admission.why(q, self.cache.sources)
                if q.meets(self.models.off_since) or q.meets(self.integrity.unsure):
                    why += self.models.reason(q, self)
                fields["reason"] = why.rstrip("; ")
            self._vouch(q, fields, t)
            revoked = self.revoked.pop(qid, None)
            if self.last.get(qid) != fields or revoked:
                self.last[qid] = fields
                change = {"time": t, "query": qid}
                change.update(fields)
                change["watermark"] = self.finals.horizon(qid)      # through when its final answers go
                if revoked:         # up to this change, which replaces them
                    change["revoked"] = [revoked[0], max(revoked[1], t)]
                self.out.append(("answer", change))
        self.dirty.clear()

    def interval(self, q):
        """Guaranteed interval for ``q`` from the bound cache, maintained incrementally; while a
        source is offline, from bounds widened by the interruption model (Zhu §4.5)."""
        wide = self.models.widening(self, q) if self.models.off_since and self.degraded(q) else None
        if wide is not None and q.kind not in ("sum", "avg"):
            return aggregate.answer(q, wide.widened(self.cache.known))
        r = self.running.get(q.id)
        if r is None or r.q is not q:
            r = self.running[q.id] = aggregate.Running(q, self.cache.known, self.cache.member)
        return r.interval(wide)
