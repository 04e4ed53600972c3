"""The §5 site tree of Bulut & Singh 2003 in one process: SWAT-ASR over client sites and the per-reading baselines.

The coordinator protocols (backend/coordinator/swat/replication.py) replicate between the device and
the backend only; the paper's experiments (§5.1, Fig. 9-10) also put client sites below the backend
(a binary tree, heap order) and charge every approximation shipped 1 and every control message
(forwarded request, decache notice) w = 1, per tree hop (§4.1). ``SwatAsr`` runs that tree with the
rules of backend/coordinator/swat/asr.py on the device's real SWAT tree (edge/core/swat.py);
``DivergenceCaching`` (§4.1) and ``AdaptivePrecision`` (§4.2) cache every reading of the window per
client, as the paper's baselines do. ``SYSTEMS`` names them for summary workloads
(backend/sim/summary.py). Sans-IO and numpy-free.
"""
import math

from backend.coordinator.core.queries import finite
from backend.coordinator.swat.asr import (Site, aps_narrow, aps_snap, aps_widen, combine, dc_event, divergence_width,
                                          need_of, resolve)
from edge.core import codec
from edge.core.swat import Swat
from edge.core.swat_asr import TAG, pack_segments


def parent(site):
    return (site - 1) // 2


def depth(site):
    d = 0
    while site > 0:
        site = parent(site)
        d += 1
    return d


def _encloses(old, new):
    return old is not None and old[0] <= new[0] and new[1] <= old[1]


class SwatAsr:
    """The whole replication tree (§3.2, Fig. 8) for one stream: the device's SWAT tree plus ``sites - 1`` caches."""
    name = "swat-asr"

    def __init__(self, window, sites=2, k=1):
        if sites < 2:
            raise ValueError("SWAT-ASR needs the device and at least one client site")
        self.tree = Swat(window, k)
        self.nseg = self.tree.n
        self.sites = sites
        self.site = [Site() for _ in range(sites)]          # site 0's rows stay empty: it has ``cur``
        self.cur = [None] * self.nseg                       # the device's current segment ranges
        self.msgs = 0
        self.uplink = 0                                     # messages on the device-backend hop
        self.bytes_up = 0
        self.seq = 0

    # -- messaging ----------------------------------------------------------------
    def _ship(self, src, dst, entries):
        """Approximations from ``src`` to a child ``dst``: cost 1 each; device ones go as a blob."""
        self.msgs += len(entries)
        if src == 0:
            self.uplink += len(entries)
            self.seq += 1
            blob = codec.encode("blob", {"src": 0, "seq": self.seq, "t": float(self.tree.count), "tag": TAG,
                                         "data": pack_segments(self.tree.count, entries)})
            self.bytes_up += len(blob)

    def _control(self, src, dst):
        self.msgs += 1
        if 0 in (src, dst):
            self.uplink += 1

    def _push(self, u, v, s, row):
        self.site[v].rows[s] = row
        self._ship(u, v, [(s,) + tuple(row)])

    # -- writes ---------------------------------------------------------------------
    def on_data(self, now, value):
        self.tree.update(value)
        segs = self.tree.segments()
        for s, row in enumerate(segs):
            if row is None:
                continue
            self.cur[s] = row
            self._write(0, s, row)

    def _write(self, u, s, row):
        subs = self.site[u].subscribed.get(s)
        if not subs:
            return
        pushed = False
        for v in sorted(subs):
            if not _encloses(self.site[v].rows.get(s), row):
                pushed = True
                self._push(u, v, s, row)
                self._received(v, s, row)
        if pushed and u == 0:
            self.site[0].wrote(s)

    def _received(self, v, s, row):
        self.site[v].wrote(s)
        self._write(v, s, row)

    # -- reads ----------------------------------------------------------------------------
    def _row(self, u, s):
        return self.cur[s] if u == 0 else self.site[u].rows.get(s)

    def on_query(self, now, client, positions, weights, precision):
        """Answer sum w_i d_i at ``client``: dict(estimate, lo, hi, error, local)."""
        if not 1 <= client < self.sites:
            raise ValueError("client must be a site in 1..%d" % (self.sites - 1))
        need = need_of(positions, weights)
        rows = self._resolve(client, need, precision, -1)
        if rows is None:
            return None
        est, lo, hi = combine(positions, weights, rows)
        return {"estimate": est, "lo": lo, "hi": hi, "error_bound": max(est - lo, hi - est), "local": self._local}

    def _resolve(self, u, need, precision, who):
        rows = resolve(lambda s: self._row(u, s), need, math.inf if u == 0 else precision)
        if u == 0 and rows is None:
            return None                 # not summarised yet
        if rows is not None:
            self._local = who == -1
            self.site[u].read(need, who)
            return rows
        p = parent(u)
        self._control(u, p)
        got = self._resolve(p, need, precision, u)
        if got is not None:
            self.msgs += len(got)                 # the reply carries one approximation per segment
            if p == 0:
                self.uplink += len(got)
                self._ship_bytes(got)
            self._local = False
        return got

    def _ship_bytes(self, rows):
        self.seq += 1
        entries = [(s,) + tuple(r) for s, r in sorted(rows.items())]
        self.bytes_up += len(codec.encode("blob", {"src": 0, "seq": self.seq, "t": float(self.tree.count),
                                                   "tag": TAG, "data": pack_segments(self.tree.count, entries)}))

    # -- phase end (Fig. 8b) ------------------------------------------------------------------
    def on_phase(self, now):
        for u in range(self.sites):
            for s in range(self.nseg):
                self._phase(u, s)
        for site in self.site:
            site.new_phase()

    def _phase(self, u, s):
        site = self.site[u]
        if u != 0 and s not in site.rows:
            return
        mine = self._row(u, s)
        decache, refresh, insert = site.tests(s, u == 0, lambda v: self.site[v].rows.get(s) != mine)
        if decache:
            del site.rows[s]                                # contraction at an R-fringe site
            self.site[parent(u)].subscribed.get(s, set()).discard(u)
            self._control(u, parent(u))
            return
        site.interested.pop(s, None)
        for v in refresh:
            self._push(u, v, s, mine)                       # subscribed, but its copy was too coarse
        for v in insert:
            site.subscribed.setdefault(s, set()).add(v)     # expansion towards the reading child
            self._push(u, v, s, mine)

    def cached(self):
        """Approximations held by client sites (the O(M log N) of §5.1)."""
        return sum(len(site.rows) for site in self.site[1:])


class _PerItem:
    """Shared part of the per-reading baselines: the device keeps the raw window, every client a
    cache per position, messages routed over the tree path (``depth`` hops)."""

    def __init__(self, window, sites=2):
        if sites < 2:
            raise ValueError("needs the device and at least one client site")
        self.window = window
        self.sites = sites
        self.values = []                    # newest first
        self.msgs = 0
        self.uplink = 0
        self.hops = [depth(c) for c in range(sites)]

    def _cost(self, client, n):
        self.msgs += n * self.hops[client]
        self.uplink += n

    def on_data(self, now, value):
        self.values.insert(0, value)
        if len(self.values) > self.window:
            self.values.pop()
        for c in range(1, self.sites):
            for i in range(len(self.values)):
                self._write(now, c, i, self.values[i])

    def on_phase(self, now):
        pass

    def on_query(self, now, client, positions, weights, precision):
        if not 1 <= client < self.sites:
            raise ValueError("client must be a site in 1..%d" % (self.sites - 1))
        if max(positions) >= len(self.values):
            return None
        tol = precision / max(sum(abs(w) for w in weights), 1e-300)
        est = lo = hi = 0.0
        missed = 0
        for i, w in zip(positions, weights):
            a, b, hit = self._read(now, client, i, tol)
            if not hit:
                missed += 1
                a = b = self.values[i]
            m = (a + b) / 2
            est += w * m
            lo += w * (a if w >= 0 else b)
            hi += w * (b if w >= 0 else a)
        if missed:
            self._cost(client, 1 + missed)      # one request, one approximation per refreshed reading
        return {"estimate": est, "lo": lo, "hi": hi, "error_bound": max(est - lo, hi - est), "local": not missed}



class AdaptivePrecision(_PerItem):
    """Olston, Widom & Loo 2001 (§4.2): widen by (1+α) on a value-initiated refresh, narrow by
    (1+α) on a query-initiated one; τ0 snaps to exact caching, τ∞ drops the copy (p = 1)."""
    name = "aps"

    def __init__(self, window, sites=2, alpha=1.0, tau0=2.0, tau_inf=math.inf, width0=1.0):
        _PerItem.__init__(self, window, sites)
        for name, v in (("alpha", alpha), ("tau0", tau0), ("tau_inf", tau_inf), ("width0", width0)):
            if not (finite(v) or (name == "tau_inf" and v == math.inf)) or v < 0:
                raise ValueError("%s must be a number >= 0, got %r" % (name, v))
        self.alpha, self.tau0, self.tau_inf, self.width0 = alpha, tau0, tau_inf, width0
        self.cache = [dict() for _ in range(sites)]     # client -> position -> [lo, hi, width]

    def _set(self, c, i, v, w):
        if w > self.tau_inf:
            self.cache[c].pop(i, None)
            return
        self.cache[c][i] = [v - w / 2, v + w / 2, w]

    def _write(self, now, c, i, v):
        e = self.cache[c].get(i)
        if e is not None and not e[0] <= v <= e[1]:
            self._set(c, i, v, aps_widen(e[2], self.alpha, self.tau0))
            self._cost(c, 1)

    def _read(self, now, c, i, tol):
        e = self.cache[c].get(i)
        if e is not None and e[2] <= tol:
            return e[0], e[1], True
        w = aps_snap(self.width0, self.tau0) if e is None else aps_narrow(e[2], self.alpha, self.tau0)
        self._set(c, i, self.values[i], w)
        return None, None, False


class DivergenceCaching(_PerItem):
    """Huang, Sloan & Wolfson 1994 adapted to precision (§4.1): the server picks the width k in
    0..M minimising the expected cost from a window of the last 23 reads (with tolerances) and
    writes per object; k = M means not cached."""
    name = "dc"

    def __init__(self, window, sites=2, value_range=100.0, unit=1.0, history=23, w=1.0):
        _PerItem.__init__(self, window, sites)
        if not (finite(value_range) and finite(unit) and value_range > 0 and unit > 0 and finite(w) and w >= 0):
            raise ValueError("value_range and unit must be numbers > 0 and w a number >= 0, got %r, %r, %r"
                             % (value_range, unit, w))
        if not isinstance(history, int) or isinstance(history, bool) or history < 1:
            raise ValueError("history must be an integer >= 1, got %r" % (history,))
        self.M = max(1, int(math.ceil(value_range / unit)))
        self.unit, self.history, self.w = unit, history, w
        self.state = [dict() for _ in range(sites)]     # client -> position -> [centre, k, events]

    def _obj(self, c, i):
        o = self.state[c].get(i)
        if o is None:
            o = self.state[c][i] = [None, self.M, []]
        return o

    def _choose(self, o, now):
        o[1] = divergence_width(o[2], now, self.M, self.w)

    def _write(self, now, c, i, v):
        o = self.state[c].get(i)
        if o is None:
            return
        dc_event(o[2], now, None, self.history)
        if o[1] < self.M and abs(v - o[0]) > o[1] * self.unit / 2:
            o[0] = v
            self._choose(o, now)
            self._cost(c, 1)                            # unsolicited refresh

    def _read(self, now, c, i, tol):
        o = self._obj(c, i)
        t = int(tol / self.unit)
        dc_event(o[2], now, t, self.history)
        if o[1] < self.M and o[1] <= t:
            h = o[1] * self.unit / 2
            return o[0] - h, o[0] + h, True
        o[0] = self.values[i]
        self._choose(o, now)
        return None, None, False


SYSTEMS = {"swat-asr": SwatAsr, "dc": DivergenceCaching, "aps": AdaptivePrecision}
