"""SWAT-ASR as a coordinator protocol (Bulut & Singh 2003 §3, Fig. 8) and its §4 baselines on the same device.

Every source named by a ``summary`` query carries a SWAT tree on its own device (edge/core/swat_asr.py
``Replicator``, allocated by a ``summary`` control). The backend is the client site right below the
device: it keeps a replica row per subscribed segment (pushed by the device whenever its shipped
range no longer encloses the new one), answers a read locally when its rows meet the precision, and
otherwise forwards the read to the device, whose reply answers it. At each phase end the tests of
Fig. 8b run for both sites (the device's on its behalf, from the reads forwarded and the pushes
received), each a ``Site`` of backend/coordinator/swat/asr.py as in the multi-site ``SwatAsr`` of
backend/sim/sites.py, and the device is sent the new subscription mask.

Query (kind "summary", one source): ``type`` point | inner | range, ``window`` [first, last]
positions (0 = newest reading) or "random" (drawn per read), ``weights`` linear | exponential |
uniform or a list, ``precision`` δ (maximum hi - lo; for range, the summed widths of the segment
ranges used), range ``value`` and ``radius``, ``every`` (read every n coordinator ticks). Each read
yields an answer {"estimate", "lo", "hi", "error_bound", "read", "first", "last", "local"} whose
[lo, hi] holds the exact value of the window at the answer's time (range: the count of readings within
value ± radius). Baselines: ``swat-aps`` (Adaptive Precision Setting, §4.2) and ``swat-dc``
(Divergence Caching adapted to precision, §4.1), both replicating every queried segment with a
cache width (pad) they adapt, instead of per reading as in the paper.
"""
import math
import random

from backend.coordinator.core.admission import BAD
from backend.coordinator.core.protocol import Protocol
from backend.coordinator.core.queries import finite
from backend.coordinator.swat.asr import (Site, aps_narrow, aps_widen, combine, dc_event, divergence_width, need_of,
                                          resolve, segment_of, weights_for)
from edge.core.swat_asr import TAG, unpack_segments

INF = float("inf")


def positions(q, first, last):
    """(positions, weights) a read of ``q`` over [first, last] asks for."""
    t = q.extra.get("type", "inner")
    if t == "point":
        return [first], [1.0]
    pos = list(range(first, last + 1))
    ws = q.extra.get("weights", "linear")
    if t == "range":
        return pos, [1.0] * len(pos)
    return pos, [float(v) for v in ws] if isinstance(ws, list) else weights_for(ws, len(pos))


def evaluate(q, pos, ws, row):
    """(estimate, lo, hi) of a read from per-position rows ``row(i)`` = (lo, hi, mean) or exact values."""
    if q.extra.get("type", "inner") != "range":
        return combine(pos, ws, {i: row(i) for i in pos}, lambda i: i)
    a = q.extra["value"] - q.extra.get("radius", 1.0)
    b = q.extra["value"] + q.extra.get("radius", 1.0)
    est = lo = hi = 0
    for i in pos:
        r = row(i)
        est += a <= r[2] <= b
        lo += a <= r[0] and r[1] <= b
        hi += r[0] <= b and r[1] >= a
    return float(est), float(lo), float(hi)


class _Source:
    """Backend-side state of one summarised source: the backend's site (1, holding the replica) and,
    kept on the device's behalf, the device's site (0, whose only child is the backend)."""

    def __init__(self):
        self.device, self.backend = Site(), Site()
        self.rows = self.backend.rows           # segment -> (lo, hi, mean), the replica
        self.fresh, self.fresh_t = {}, None     # rows received at logical time fresh_t
        self.expect = set()         # segments whose next row answers a read or an insert, not a write
        self.waiting = []           # forwarded reads: (qid, info, segments)
        self.pads = {}
        self.events = {}            # segment -> [(t, tolerance units | None)] (divergence caching)

    def replicated(self, g):
        """Whether the backend subscribes to segment ``g`` (the device pushes its writes)."""
        return bool(self.device.subscribed.get(g))

    def subscribe(self, g, on=True):
        if on:
            self.device.subscribed[g] = {1}
        else:
            self.device.subscribed.pop(g, None)

    @property
    def subs(self):
        """The subscription as the device's bit mask."""
        mask = 0
        for g, children in self.device.subscribed.items():
            if children:
                mask |= 1 << g
        return mask


class SwatReplication(Protocol):
    """SWAT-ASR: reads expand the replication towards the backend, writes contract it (Fig. 8)."""
    name = "swat"
    kinds = ("summary",)

    def __init__(self, window=32, k=1, phase=10.0, seed=0):
        if not isinstance(window, int) or isinstance(window, bool) or window < 4 or window & (window - 1) or window > 32768:
            raise ValueError("protocol %s: window must be a power of two in 4..32768, got %r" % (self.name, window))
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or k & (k - 1) or k > 128:
            raise ValueError("protocol %s: k must be a power of two in 1..128, got %r" % (self.name, k))
        if not finite(phase) or phase <= 0:
            raise ValueError("protocol %s: phase must be a positive number of seconds" % self.name)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("protocol %s: seed must be an integer, got %r" % (self.name, seed))
        self.window, self.k, self.phase = window, k, float(phase)
        self.nseg = window.bit_length() - 1
        self.src = {}
        self.live = {}              # qid -> the read being answered (dict)
        self.results = {}           # qid -> last answer fields
        self.nread = {}
        self.ticks = 0
        self.next_phase = None
        self.rng = random.Random(seed)
        self.stats = {"reads": 0, "local": 0, "forwarded": 0, "pushes": 0, "bad_blobs": 0}

    # -- filters and configuration --------------------------------------------------------
    def target(self, coord, key):
        return INF, []              # the interval filter stays silent; the summary speaks

    def _summarised(self, coord, key):
        return any(coord.queries[qid].kind == "summary" for qid in coord.by_source.get(key, ()))

    def _control(self, coord, key, read=0, window=None):
        st = self.src[key]
        s = coord.cache.sources[key]
        coord.send(s.device, "summary", {"src": s.index, "window": self.window if window is None else window,
                                         "k": self.k, "subs": st.subs, "read": read,
                                         "pad": [{"seg": g, "w": p} for g, p in sorted(st.pads.items())
                                                 if st.replicated(g)]})

    def _sync(self, coord, key):
        on = self._summarised(coord, key)
        if on and key not in self.src:
            self.src[key] = _Source()
            self.initial(coord, key)
            self._control(coord, key)
        elif not on and key in self.src:
            del self.src[key]
            self._control_off(coord, key)

    def _control_off(self, coord, key):
        s = coord.cache.sources[key]
        coord.send(s.device, "summary", {"src": s.index, "window": 0, "k": self.k, "subs": 0, "read": 0, "pad": []})

    def initial(self, coord, key):
        """Replication before any read: none (SWAT-ASR expands on demand)."""

    def source_added(self, coord, key):
        self.apply(coord, key)
        self._sync(coord, key)

    def queries_changed(self, coord, now):
        for qid in list(self.live):
            if qid not in coord.queries:
                del self.live[qid]
        for key in sorted(coord.cache.sources):
            self._sync(coord, key)

    def resync(self, coord, key, want):
        self.apply(coord, key, force=True)
        if key in self.src:         # the device restarted: its tree and shipped ranges are gone
            del self.src[key]
        self._sync(coord, key)

    # -- reads --------------------------------------------------------------------------------
    def period(self, coord, t):
        if self.next_phase is None:
            self.next_phase = t + self.phase
        self.ticks += 1
        for qid in sorted(coord.queries):
            q = coord.queries[qid]
            if q.kind == "summary" and q.sources[0] in self.src and self.ticks % q.extra.get("every", 1) == 0:
                self._read(coord, q, t)
        if t >= self.next_phase:
            self.next_phase += self.phase
            for key in sorted(self.src):
                self._phase_end(coord, key, t)

    def _read(self, coord, q, t):
        key = q.sources[0]
        st = self.src[key]
        w = q.extra.get("window", "random")
        if w == "random":
            first = self.rng.randrange(self.window)
            last = self.rng.randrange(first, self.window)
        else:
            first, last = min(w[0], self.window - 1), min(w[1], self.window - 1)
        pos, ws = positions(q, first, last)
        need = need_of(pos, ws) if q.extra.get("type", "inner") != "range" else {s: 1.0 for s in need_of(pos, ws)}
        self.nread[q.id] = self.nread.get(q.id, 0) + 1
        info = {"t": t, "key": key, "pos": pos, "ws": ws, "first": first, "last": last,
                "read": self.nread[q.id], "need": need}
        self.stats["reads"] += 1
        self.note_read(st, need, q, ws, t)
        if self.resolve(st, need, q.precision) is not None:
            self.stats["local"] += 1
            st.backend.read(need, -1)
            info["local"] = True
            self.live[q.id] = info
            coord.dirty[q.id] = None
            return
        self.stats["forwarded"] += 1
        st.device.read(need, 1)
        self.forwarded(st, need)
        info["local"] = False
        st.waiting.append((q.id, info, set(need)))
        st.expect.update(need)
        mask = 0
        for g in need:
            mask |= 1 << g
        self._control(coord, key, read=mask)

    def resolve(self, st, need, precision):
        return resolve(st.rows.get, need, precision)

    # policy hooks of the baselines
    def note_read(self, st, need, q, ws, t):
        pass

    def forwarded(self, st, need):
        pass

    def pushed(self, coord, key, st, segs, t):
        pass

    # -- uplink: replica pushes and read replies --------------------------------------------------
    def blob(self, coord, device, m):
        keys = coord.devices[device]["keys"]
        key = keys[m["src"]] if m["src"] < len(keys) else None
        st = self.src.get(key)
        try:
            if m["tag"] != TAG or st is None:
                raise ValueError("not a SWAT segment blob of a summarised source")
            _, entries = unpack_segments(m["data"])
            if any(e[0] >= self.nseg for e in entries):
                raise ValueError("segment beyond the window")
        except ValueError:
            self.stats["bad_blobs"] += 1
            coord.admission.note(coord.wall, device, BAD, "a blob that does not decode")
            return
        t = coord.clock
        if st.fresh_t != t:
            st.fresh, st.fresh_t = {}, t
        writes = []
        for g, lo, hi, mean in entries:
            row = (lo, hi, mean)
            st.fresh[g] = row
            if st.replicated(g):
                st.rows[g] = row
                if g in st.expect:
                    st.expect.discard(g)
                else:
                    writes.append(g)
                    st.device.wrote(g)
                    st.backend.wrote(g)
            else:
                st.expect.discard(g)
        self.stats["pushes"] += len(writes)
        if writes:
            self.pushed(coord, key, st, writes, t)
        still = []
        for qid, info, segs in st.waiting:
            if segs <= set(st.fresh):
                info["t"] = t
                self.live[qid] = info
            else:
                still.append((qid, info, segs))
        st.waiting = still
        coord.dirty.update(coord.by_source.get(key, {}))

    # -- answers ------------------------------------------------------------------------------
    def answer(self, coord, q):
        info = self.live.get(q.id)
        if info is not None and info["t"] == coord.clock:
            st = self.src.get(info["key"])
            if st is not None:
                fresh = st.fresh if st.fresh_t == coord.clock else {}
                rows = {g: fresh.get(g, st.rows.get(g)) for g in info["need"]}
                if None not in rows.values():
                    est, lo, hi = evaluate(q, info["pos"], info["ws"], lambda i: rows[segment_of(i)])
                    self.results[q.id] = {"estimate": est, "lo": lo, "hi": hi,
                                          "error_bound": max(est - lo, hi - est),
                                          "read": info["read"], "first": info["first"], "last": info["last"],
                                          "local": info["local"]}
        got = self.results.get(q.id)
        if got is None:
            return {"estimate": None, "lo": -INF, "hi": INF, "error_bound": INF, "read": 0, "first": 0, "last": 0,
                    "local": False, "degraded": True, "reason": "no read answered yet"}
        return dict(got)

    # -- phase end (Fig. 8b) ----------------------------------------------------------------------
    def _phase_end(self, coord, key, t):
        st = self.src[key]
        before, read = st.subs, 0
        for g in range(self.nseg):
            if st.replicated(g) and st.backend.tests(g, False, None)[0]:    # contraction at the backend
                st.subscribe(g, False)
                st.rows.pop(g, None)
                continue
            _, refresh, insert = st.device.tests(g, True, lambda v: True)
            if insert:                                          # expansion towards the backend
                st.subscribe(g)
                st.expect.add(g)
            if refresh:                                         # subscribed, but the copy was too coarse
                read |= 1 << g
                st.expect.add(g)
        st.device.new_phase()
        st.device.interested.clear()
        st.backend.new_phase()
        if st.subs != before or read:
            self._control(coord, key, read=read)


class SwatAps(SwatReplication):
    """Adaptive Precision Setting (Olston et al. 2001, §4.2) over segments: every queried segment is
    cached with a pad that grows by (1+α) on a value-initiated refresh and shrinks by (1+α) on a
    query-initiated one (below τ0: exact)."""
    name = "swat-aps"

    def __init__(self, alpha=1.0, tau0=0.5, width0=1.0, **kw):
        SwatReplication.__init__(self, **kw)
        if not all(finite(v) and v >= 0 for v in (alpha, tau0, width0)):
            raise ValueError("protocol %s: alpha, tau0 and width0 must be numbers >= 0" % self.name)
        self.alpha, self.tau0, self.width0 = alpha, tau0, width0

    def initial(self, coord, key):
        st = self.src[key]
        for qid in coord.by_source.get(key, ()):
            q = coord.queries[qid]
            w = q.extra.get("window", "random")
            segs = range(self.nseg) if w == "random" else {segment_of(min(i, self.window - 1)) for i in range(w[0], w[1] + 1)}
            for g in segs:
                st.subscribe(g)
                st.pads[g] = self.width0 / 2
                st.expect.add(g)

    def _phase_end(self, coord, key, t):
        pass                                        # no replication tests: APS caches everything

    def forwarded(self, st, need):
        for g in need:                              # pads are half widths
            st.pads[g] = aps_narrow(st.pads.get(g, self.width0 / 2), self.alpha, self.tau0 / 2)

    def pushed(self, coord, key, st, segs, t):
        for g in segs:
            st.pads[g] = aps_widen(st.pads.get(g, 0.0), self.alpha, self.tau0 / 2)
        self._control(coord, key)


class SwatDc(SwatReplication):
    """Divergence Caching adapted to precision (Huang et al., §4.1) over segments: per segment the
    cache width k in 0..M (M: not cached) of least expected cost from the last ``history`` reads
    (tolerance = precision per unit weight) and writes; re-chosen on every refresh."""
    name = "swat-dc"

    def __init__(self, value_range=100.0, unit=1.0, history=23, w=1.0, **kw):
        SwatReplication.__init__(self, **kw)
        if not (finite(value_range) and finite(unit) and value_range > 0 and unit > 0 and finite(w) and w >= 0):
            raise ValueError("protocol %s: value_range and unit must be > 0, w >= 0" % self.name)
        if not isinstance(history, int) or isinstance(history, bool) or history < 1:
            raise ValueError("protocol %s: history must be an integer >= 1" % self.name)
        self.M = max(1, int(math.ceil(value_range / unit)))
        self.unit, self.history, self.w = unit, history, w

    def _phase_end(self, coord, key, t):
        pass

    def _choose(self, st, g, t):
        k = divergence_width(st.events.get(g, []), t, self.M, self.w)
        if k >= self.M:
            st.subscribe(g, False)
            st.rows.pop(g, None)
        else:
            if not st.replicated(g):
                st.expect.add(g)
            st.subscribe(g)
            st.pads[g] = k * self.unit / 2

    def note_read(self, st, need, q, ws, t):
        tol = int(q.precision / max(sum(abs(x) for x in ws), 1e-300) / self.unit)
        for g in need:
            dc_event(st.events.setdefault(g, []), t, tol, self.history)
        self._t = t

    def forwarded(self, st, need):
        for g in need:
            self._choose(st, g, self._t)

    def pushed(self, coord, key, st, segs, t):
        for g in segs:
            dc_event(st.events.setdefault(g, []), t, None, self.history)
            self._choose(st, g, t)
        self._control(coord, key)


PROTOCOLS = {"swat": SwatReplication, "swat-aps": SwatAps, "swat-dc": SwatDc}
