"""SWAT-ASR's rules (Bulut & Singh 2003 §3.2, Fig. 8) and its §4 baselines' rules, as pure functions.

One home for the logic that the coordinator protocols (``backend/coordinator/swat/replication.py``:
SWAT-ASR, APS and DC between the device and the backend) and the simulator's multi-site tree
(``backend/sim/sites.py``: the §5 setup with client sites) both run. Sites form a tree: site 0 is
the device holding the SWAT tree (edge/core/swat.py), site 1 the backend, further sites are clients
below it (heap order, parent (i-1)//2). The replicated objects are the window segments [0,1], [2,3],
[4,7], ..., [N/2, N-1] (Table 1); a site's row for a segment is a range (lo, hi, mean) valid for
every reading at those positions. A read that a site cannot answer within its precision goes to the
parent; at each phase end R-fringe sites run the contraction test and R-neighbours the expansion
test (reads vs writes), as in Wolfson et al.'s ADR. Baselines: Divergence Caching adapted to
precision (Huang et al., §4.1) and Adaptive Precision Setting (Olston et al. 2001, §4.2).
"""
from edge.core.swat import weighted


def segment_of(i):
    """Index of the replication segment holding window position i."""
    return 0 if i < 2 else i.bit_length() - 1


def weights_for(kind, m):
    """The §2.7 query weights over m positions: linear, exponential (2^-j) or uniform."""
    if kind == "linear":
        return [(m - j) / m for j in range(m)]
    if kind == "exponential":
        return [2.0 ** -j for j in range(m)]
    return [1.0] * m


def need_of(positions, weights):
    """Per replication segment, the total |weight| a query puts on it."""
    need = {}
    for i, w in zip(positions, weights):
        s = segment_of(i)
        need[s] = need.get(s, 0.0) + abs(w)
    return need


def resolve(row, need, precision):
    """Fig. 8a's local test: the rows (segment -> (lo, hi, mean)) answering a query within
    ``precision`` (sum over segments of |weight| x range width), or None (forward to the parent)."""
    rows = {}
    width = 0.0
    for s, w in need.items():
        r = row(s)
        if r is None:
            return None
        rows[s] = r
        width += w * (r[1] - r[0])
    return rows if width <= precision else None


class Site:
    """One site's replication state (Fig. 8): per segment, the row it holds, the children subscribed
    to it (pushed every write) or interested in it (reading it through this site), and the reads
    (by child, -1 = local) and writes of the current phase."""

    def __init__(self):
        self.rows = {}              # segment -> (lo, hi, mean)
        self.subscribed = {}        # segment -> set(children)
        self.interested = {}        # segment -> set(children)
        self.reads = {}             # segment -> {who: count}
        self.writes = {}            # segment -> count

    def read(self, segs, who):
        """Count a read of ``segs`` from ``who`` (-1 local); an unsubscribed child becomes interested."""
        for s in segs:
            cnt = self.reads.setdefault(s, {})
            cnt[who] = cnt.get(who, 0) + 1
            if who >= 0 and who not in self.subscribed.get(s, ()):
                self.interested.setdefault(s, set()).add(who)

    def wrote(self, s):
        self.writes[s] = self.writes.get(s, 0) + 1

    def tests(self, s, source, stale):
        """Fig. 8b for segment ``s``: (decache, refresh, insert). A non-source R-fringe site (no
        subscribed child) decaches when its reads fall below the writes; otherwise subscribed children
        that read more than the writes and hold a ``stale(v)`` copy are refreshed, interested ones that
        did are inserted."""
        reads, writes = self.reads.get(s, {}), self.writes.get(s, 0)
        subs = self.subscribed.get(s, ())
        if not source and not subs and sum(reads.values()) < writes:
            return True, [], []
        refresh = [v for v in sorted(subs) if writes < reads.get(v, 0) and stale(v)]
        insert = [v for v in sorted(self.interested.get(s, ())) if writes < reads.get(v, 0) and v not in subs]
        return False, refresh, insert

    def new_phase(self):
        self.reads.clear()
        self.writes.clear()


def combine(positions, weights, rows, seg_of=segment_of):
    """(estimate, lo, hi) of sum w_i d_i from per-segment rows (lo, hi, mean)."""
    return weighted(weights, [(r[2], r[0], r[1]) for r in (rows[seg_of(i)] for i in positions)])


def divergence_width(events, now, M, w):
    """§4.1: the width k in 0..M (M: not cached) of least expected cost per unit time, from a
    window of events (time, read tolerance in units, or None for a write)."""
    span = max(now - events[0][0], 1e-9) if events else 1.0
    lw = sum(1 for _, t in events if t is None) / span
    rt = {}
    for _, t in events:
        if t is not None:
            rt[t] = rt.get(t, 0.0) + 1.0 / span
    total_r = sum(rt.values())
    best, best_k = lw, 0
    for k in sorted(set(t for t in rt if 0 < t < M)) + [M]:
        r = sum(v for t, v in rt.items() if t < k)
        cost = (w + 1) * total_r if k == M else r * (1 + w) + (M - k) / M * (lw + r)
        if cost < best:
            best, best_k = cost, k
    return best_k


def dc_event(events, t, tol, history):
    """§4.1: record a read with tolerance ``tol`` in units (None: a write) in the last ``history`` events."""
    events.append((t, tol))
    if len(events) > history:
        events.pop(0)


def aps_snap(w, tau0):
    """§4.2: a width below τ0 snaps to exact caching."""
    return 0.0 if w < tau0 else w


def aps_narrow(w, alpha, tau0):
    """§4.2: a query-initiated refresh narrows the width by (1 + α)."""
    return aps_snap(w / (1 + alpha), tau0)


def aps_widen(w, alpha, tau0):
    """§4.2: a value-initiated refresh widens the width (at least τ0) by (1 + α)."""
    return max(w, tau0) * (1 + alpha)
