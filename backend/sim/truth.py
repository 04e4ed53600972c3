"""Ground truth for the simulator (DESIGN.md §4): exact answers over time, and the violation checker.

``Truth`` keeps every query's exact answer as a step function of time, updated incrementally per
reading and re-summed exactly every |S| updates so floating drift stays far below the tolerance.
``check`` merges that step function with the answers' and counts every instant at which a
non-degraded answer does not contain the exact value.
"""
import math

import numpy as np

from backend.coordinator.core import aggregate
from backend.sim import entity_truth, summary_truth

TOL = 1e-9   # relative tolerance for float summation in the checker
SMALL = 24   # fewer readings than this are cheaper one by one than in numpy
CELLS = 1 << 20     # values of a MIN/MAX/COUNT query's sources held at once by the bulk truth


class _Track:
    __slots__ = ("q", "idx", "w", "wvec", "mvec", "col", "sum", "scale", "known", "n", "since", "timeline")

    def __init__(self, q, index):
        self.q = q
        self.idx = [index[s] for s in q.sources]
        self.w = [q.weights[s] for s in q.sources]
        self.wvec = np.zeros(len(index))          # dense weights, 0 outside the query set
        self.wvec[self.idx] = self.w
        self.mvec = np.zeros(len(index), dtype=bool)    # membership (a weight may be 0)
        self.mvec[self.idx] = True
        self.col = np.full(len(index), -1)              # source index -> its position in idx
        self.col[self.idx] = np.arange(len(self.idx))
        self.sum = 0.0
        self.scale = 0.0
        self.known = 0
        self.n = len(self.idx)
        self.since = 0
        self.timeline = []      # [(t, exact, scale)]


class Truth:
    def __init__(self, source_ids):
        self.index = {s: i for i, s in enumerate(source_ids)}
        self.values = [None] * len(source_ids)
        self.cur = np.full(len(source_ids), np.nan)     # the same values, NaN for None
        self.tracks = {}
        self.by_src = [[] for _ in source_ids]
        self.dirty = set()
        self.entity = entity_truth.EntityTruth(self.index)
        self.summary = summary_truth.SummaryTruth(self.index)

    def add_query(self, q, t):
        if entity_truth.is_entity(q):
            self.entity.add_query(q, self.values, t)
            return
        if q.kind == "summary":
            self.summary.add_query(q)
            return
        tr = _Track(q, self.index)
        self.tracks[q.id] = tr
        for pos, i in enumerate(tr.idx):
            self.by_src[i].append((tr, pos))
        self._resum(tr)
        self.dirty.add(q.id)
        self.flush(t)

    def remove_query(self, qid):
        if qid in self.summary.tracks:      # kept: its answers before the removal are still checked
            return
        tr = self.tracks.pop(qid)
        for i in tr.idx:
            self.by_src[i] = [p for p in self.by_src[i] if p[0] is not tr]

    def _resum(self, tr):
        vals = [self.values[i] for i in tr.idx]
        tr.known = sum(1 for v in vals if v is not None)
        terms = [w * v for w, v in zip(tr.w, vals) if v is not None]
        tr.sum = math.fsum(terms)
        tr.scale = math.fsum(abs(x) for x in terms)
        tr.since = 0

    def update_range(self, s, v, t):
        """Readings ``s``/``v`` at times ``t`` (numpy arrays in time order, ending with a whole instant), in
        bulk: each instant is flushed as ``flush`` would after its readings."""
        m = len(s)
        if m < SMALL or self.entity.tracks or self.summary.hist:
            tl = t.tolist()
            for k, (i, x) in enumerate(zip(s.tolist(), v.tolist())):
                self.update(i, x)
                if k + 1 == m or tl[k + 1] != tl[k]:
                    self.flush(tl[k])
            return
        order = np.argsort(s, kind="stable")
        so = s[order]
        first = np.ones(m, dtype=bool)
        first[1:] = so[1:] != so[:-1]
        prev = np.empty(m)
        prev[1:] = v[order][:-1]
        prev[first] = self.cur[so[first]]
        old = np.empty(m)
        old[order] = prev                           # each reading's source value before it
        fresh = np.isnan(old)
        old[fresh] = 0.0
        ends = np.append(np.flatnonzero(t[1:] != t[:-1]), m - 1)
        for tr in self.tracks.values():
            mem = tr.mvec[s]
            hits = np.cumsum(mem)
            if not hits[-1]:
                continue
            known = tr.known + np.cumsum(fresh & mem)
            touched = np.diff(hits[ends], prepend=0) > 0
            e = ends[touched & (known[ends] >= tr.n)]       # the instants flush would evaluate tr at
            if tr.q.kind in ("sum", "avg"):
                w = np.where(mem, tr.wvec[s], 0.0)
                sums = tr.sum + np.cumsum(w * (v - old))
                scales = tr.scale + np.cumsum(np.abs(w * v) - np.abs(w * old))
                div = tr.n if tr.q.kind == "avg" else 1
                self._append(tr, t[e], sums[e] / div, scales[e] / div)
                tr.sum, tr.scale = float(sums[-1]), float(scales[-1])
                tr.since += int(hits[-1])
            elif len(e):
                self._append(tr, t[e], self._exact_rows(tr, self._rows(tr, s, v, mem, e)), np.full(len(e), tr.scale))
            tr.known = int(known[-1])
        last = np.unique(s[::-1], return_index=True)
        for i, k in zip(last[0].tolist(), (m - 1 - last[1]).tolist()):
            self.values[i] = float(v[k])
        self.cur[last[0]] = v[m - 1 - last[1]]
        for tr in self.tracks.values():
            if tr.since >= tr.n:
                self._resum(tr)

    def _rows(self, tr, s, v, mem, e):
        """The values of ``tr``'s sources right after each reading index in ``e``, one row each (in chunks
        of ``CELLS`` values, forward-filled from the previous row)."""
        n = tr.n
        hit = np.flatnonzero(mem)
        col = tr.col[s[hit]]
        out = np.empty((len(e), n))
        base = self.cur[tr.idx]
        h0 = 0
        step = max(1, CELLS // n)
        for c0 in range(0, len(e), step):
            ec = e[c0:c0 + step]
            h1 = int(np.searchsorted(hit, ec[-1], "right"))
            row = np.searchsorted(ec, hit[h0:h1])            # first row at or after each reading
            uniq, back = np.unique((row * n + col[h0:h1])[::-1], return_index=True)    # last reading per cell
            src = np.full(len(ec) * n, -1)
            src[uniq] = h0 + (h1 - h0 - 1 - back)
            src = np.maximum.accumulate(src.reshape(len(ec), n), axis=0)
            vals = np.where(src >= 0, v[hit[np.maximum(src, 0)]], base)
            out[c0:c0 + len(ec)] = vals
            base, h0 = vals[-1], h1
        return out

    @staticmethod
    def _exact_rows(tr, rows):
        """``aggregate.exact`` of a MIN, MAX or COUNT query on each row of its sources' values."""
        k = tr.q.kind
        if k == "min":
            return rows.min(axis=1)
        if k == "max":
            return rows.max(axis=1)
        if tr.q.range is None:
            return np.full(len(rows), float(tr.n))
        a, b = tr.q.range
        return ((rows >= a) & (rows <= b)).sum(axis=1).astype(float)

    def _append(self, tr, t, x, scale):
        """Append to ``tr``'s timeline the instants at which its exact value ``x`` changes, as ``flush`` does."""
        keep = np.ones(len(x), dtype=bool)
        keep[1:] = x[1:] != x[:-1]
        if len(x) and tr.timeline and tr.timeline[-1][1] == x[0]:
            keep[0] = False
        tr.timeline.extend(zip(t[keep].tolist(), x[keep].tolist(), scale[keep].tolist()))

    def update(self, i, v):
        old = self.values[i]
        self.values[i] = v
        self.cur[i] = v
        if self.entity.tracks:
            self.entity.update(i, old, v)
        if self.summary.hist:
            self.summary.update(i, v)
        for tr, pos in self.by_src[i]:
            if tr.q.kind in ("sum", "avg"):
                w = tr.w[pos]
                if old is None:
                    tr.known += 1
                    tr.sum += w * v
                    tr.scale += abs(w * v)
                else:
                    tr.sum += w * (v - old)
                    tr.scale += abs(w * v) - abs(w * old)
                tr.since += 1
                if tr.since >= tr.n:
                    self._resum(tr)
            elif old is None:
                tr.known += 1
            self.dirty.add(tr.q.id)

    def exact(self, tr):
        if tr.known < tr.n:
            return None
        k = tr.q.kind
        if k == "sum":
            return tr.sum
        if k == "avg":
            return tr.sum / tr.n
        return aggregate.exact(tr.q, lambda s: self.values[self.index[s]])

    def flush(self, t):
        if self.entity.tracks:
            self.entity.flush(t)
        if self.summary.touched:
            self.summary.flush(t)
        for qid in self.dirty:
            tr = self.tracks.get(qid)
            if tr is None:
                continue
            x = self.exact(tr)
            if x is None:
                continue
            scale = tr.scale / tr.n if tr.q.kind == "avg" else tr.scale
            if not tr.timeline or tr.timeline[-1][1] != x:
                tr.timeline.append((t, x, scale))
        self.dirty.clear()


def _merge(truth, answers):
    """Merge two step functions (later entries win at one time) at every distinct time ``T``: arrays of the
    truth then (``x``, ``scale``, ``has_t``) and the answer then (``lo``, ``hi``, ``deg``, ``has_a``), whether
    an answer changed at ``T`` and the index of the answer before ``T`` (-1: none)."""
    tv = np.array(truth, dtype=float).reshape(-1, 3)
    av = np.array(answers, dtype=float).reshape(-1, 4)       # degraded as 0/1
    tt, at = tv[:, 0], av[:, 0]
    T = np.unique(np.concatenate((tt, at)))
    tord = np.argsort(tt, kind="stable")
    aord = np.argsort(at, kind="stable")
    ti = np.searchsorted(tt[tord], T, "right") - 1
    ai = np.searchsorted(at[aord], T, "right") - 1
    before = np.searchsorted(at[aord], T, "left") - 1
    tv, av = tv[tord][:, 1:], av[aord][:, 1:]
    has_t, has_a = ti >= 0, ai >= 0
    tv = np.vstack((tv, np.zeros((1, 2))))[ti]      # index -1 (none yet) reads the padding row
    av = np.vstack((av, np.zeros((1, 3))))
    pv, av = av[before], av[ai]
    return T, tv[:, 0], tv[:, 1], has_t, av[:, 0], av[:, 1], av[:, 2] != 0, has_a, ai != before, before, pv


def _inside(lo, hi, x, scale):
    """Whether answers ``[lo, hi]`` contain truths ``x`` (of ``scale``) up to float tolerance."""
    tol = TOL * (1.0 + scale + np.abs(x))
    return (lo - tol <= x) & (x <= hi + tol)


def _runs(T, flag, end):
    """Total time during which ``flag`` holds at the instants ``T`` (each lasts until the next; the last to ``end``)."""
    total, since = 0.0, None
    for k in np.flatnonzero(np.diff(flag.astype(np.int8), prepend=0, append=0)).tolist():
        if since is None:
            since = k
        else:
            total += (T[k] if k < len(T) else max(end, T[since])) - T[since]
            since = None
    return float(total)


def revoke(answers, windows):
    """``answers`` (time-ordered tuples ending in ``degraded``) with every revoked window
    ``[t_from, t_to]`` (an answer change's ``revoked``, issue #20) marked degraded."""
    if not windows:
        return answers
    answers = sorted(answers, key=lambda a: a[0])      # stable: same-time changes keep their order
    cuts = sorted({a[0] for a in answers} | {w[0] for w in windows} | {w[1] for w in windows if w[1] < math.inf})
    out, i, cur = [], 0, None
    for t in cuts:
        while i < len(answers) and answers[i][0] <= t:
            cur = answers[i]
            i += 1
        if cur is None:
            continue
        deg = cur[-1] or any(a <= t < b for a, b in windows)
        out.append((t,) + tuple(cur[1:-1]) + (deg,))
    return out


def check(truth, answers, precision, end, wrong=None):
    """Merge the truth and answer step functions of one query.

    ``truth``: [(t, exact, scale)], ``answers``: [(t, lo, hi, degraded)], both in time order;
    ``precision``: δ, or [(t, δ)] when it changes while running; ``wrong``: a list that gets
    (t, lo, hi, exact) of every violating instant.
    Returns (violations, violation_time, precision_misses, degraded_time).
    """
    if not truth and not answers:
        return 0, 0.0, 0, 0.0
    T, x, scale, has_t, lo, hi, deg, has_a, _, _, _ = _merge(truth, answers)
    steps = [(-math.inf, precision)] if isinstance(precision, (int, float)) else list(precision)
    p = np.maximum(np.searchsorted(np.array([s[0] for s in steps], dtype=float), T, "right") - 1, 0)
    prec = np.array([s[1] for s in steps], dtype=float)[p]
    both = has_t & has_a
    deg = both & deg
    ok = both & ~deg
    bad = ok & ~_inside(lo, hi, x, scale)
    if wrong is not None:
        wrong += [(float(T[k]), float(lo[k]), float(hi[k]), float(x[k])) for k in np.flatnonzero(bad)]
    with np.errstate(invalid="ignore"):
        width = hi - lo
        miss = ok & (width > prec + TOL * (1.0 + scale + np.abs(x))) & np.isfinite(width)
    return int(bad.sum()), _runs(T, bad, end), int(miss.sum()), _runs(T, deg, end)


def fidelity(truth, answers, end):
    """Zhu §6.1 fidelity of one query's answers: how often they contain the exact value.

    ``fidelity``: fraction of the non-degraded time (where truth and an answer exist) the answer
    contains the truth; ``check_fidelity``: at each answer change, whether the answer being replaced
    still contained the truth at that instant (the paper's per-evaluation check), over ``checks``;
    ``degraded_fidelity``: the time fraction over degraded answers. None where nothing was measured.
    """
    if not truth or not answers:
        return {"fidelity": None, "checks": 0, "check_fidelity": None, "degraded_fidelity": None}
    T, x, scale, has_t, lo, hi, deg, has_a, changed, before, pv = _merge(truth, answers)
    chk = changed & (before >= 0) & has_t & (pv[:, 2] == 0)
    checks = int(chk.sum())
    hits = int((chk & _inside(pv[:, 0], pv[:, 1], x, scale)).sum())
    d = np.maximum(np.minimum(np.append(T[1:], end), end) - T, 0.0)
    live = has_t & has_a
    inside = _inside(lo, hi, x, scale)
    span = {b: float(d[live & (deg == b)].sum()) for b in (False, True)}
    ins = {b: float(d[live & (deg == b) & inside].sum()) for b in (False, True)}
    return {"fidelity": ins[False] / span[False] if span[False] > 0 else None,
            "checks": checks, "check_fidelity": hits / checks if checks else None,
            "degraded_fidelity": ins[True] / span[True] if span[True] > 0 else None}
