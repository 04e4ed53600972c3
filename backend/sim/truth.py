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


class _Track:
    __slots__ = ("q", "idx", "w", "wvec", "sum", "scale", "known", "n", "since", "timeline")

    def __init__(self, q, index):
        self.q = q
        self.idx = [index[s] for s in q.sources]
        self.w = [q.weights[s] for s in q.sources]
        self.wvec = np.zeros(len(index))          # dense weights, 0 outside the query set
        self.wvec[self.idx] = self.w
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

    def update_many(self, idx, vals):
        """Vectorised ``update`` for readings of distinct sources ``idx`` (numpy arrays) at one instant."""
        if self.entity.tracks:              # entity truth is kept per reading
            for i, v in zip(idx.tolist(), vals.tolist()):
                self.update(i, v)
            return
        old = np.array([self.values[i] for i in idx.tolist()], dtype=float)
        fresh = np.isnan(old)
        for i, v in zip(idx.tolist(), vals.tolist()):
            self.values[i] = v
            if self.summary.hist:
                self.summary.update(i, v)
        for tr in self.tracks.values():
            w = tr.wvec[idx]
            hit = w != 0
            if not hit.any():
                continue
            if tr.q.kind in ("sum", "avg"):
                tr.known += int((fresh & hit).sum())
                tr.sum += float(np.dot(w, vals - np.where(fresh, 0.0, old)))
                tr.scale += float(np.abs(w * vals).sum() - np.abs(w * np.where(fresh, 0.0, old)).sum())
                tr.since += int(hit.sum())
                if tr.since >= tr.n:
                    self._resum(tr)
            else:
                tr.known += int((fresh & hit).sum())
            self.dirty.add(tr.q.id)

    def update(self, i, v):
        old = self.values[i]
        self.values[i] = v
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


def _contains(ans, tr):
    """Whether answer ``(t, lo, hi, degraded)`` contains truth ``(t, exact, scale)`` up to float tolerance."""
    _, x, scale = tr
    tol = TOL * (1.0 + scale + abs(x))
    return ans[1] - tol <= x <= ans[2] + tol


def _instants(truth, answers):
    """Merge two step functions: per distinct time t, after every change at t, yield
    ``(t, truth now, answer before t, answer now, answer changed at t, next time or None)``."""
    events = sorted([(t, 0, k) for k, (t, _, _) in enumerate(truth)] + [(t, 1, k) for k, (t, _, _, _) in enumerate(answers)])
    cur_truth = cur_ans = None
    i = 0
    while i < len(events):
        t = events[i][0]
        prev, changed = cur_ans, False
        while i < len(events) and events[i][0] == t:
            _, kind, k = events[i]
            if kind == 0:
                cur_truth = truth[k]
            else:
                cur_ans, changed = answers[k], True
            i += 1
        yield t, cur_truth, prev, cur_ans, changed, events[i][0] if i < len(events) else None


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


def check(truth, answers, precision, end):
    """Merge the truth and answer step functions of one query.

    ``truth``: [(t, exact, scale)], ``answers``: [(t, lo, hi, degraded)], both in time order;
    ``precision``: δ, or [(t, δ)] when it changes while running.
    Returns (violations, violation_time, precision_misses, degraded_time).
    """
    steps = [(-math.inf, precision)] if isinstance(precision, (int, float)) else list(precision)
    p = 0
    violations = misses = 0
    vtime = dtime = 0.0
    bad_since = deg_since = None
    for t, cur_truth, _, cur_ans, _, _ in _instants(truth, answers):
        while p + 1 < len(steps) and steps[p + 1][0] <= t:
            p += 1
        precision = steps[p][1]
        bad = deg = False
        if cur_truth is not None and cur_ans is not None:
            _, x, scale = cur_truth
            _, lo, hi, degraded = cur_ans
            if degraded:
                deg = True
            elif not _contains(cur_ans, cur_truth):
                bad = True
                violations += 1
            if not degraded and hi - lo > precision + TOL * (1.0 + scale + abs(x)) and math.isfinite(hi - lo):
                misses += 1
        if bad and bad_since is None:
            bad_since = t
        elif not bad and bad_since is not None:
            vtime += t - bad_since
            bad_since = None
        if deg and deg_since is None:
            deg_since = t
        elif not deg and deg_since is not None:
            dtime += t - deg_since
            deg_since = None
    if bad_since is not None:
        vtime += max(0.0, end - bad_since)
    if deg_since is not None:
        dtime += max(0.0, end - deg_since)
    return violations, vtime, misses, dtime


def fidelity(truth, answers, end):
    """Zhu §6.1 fidelity of one query's answers: how often they contain the exact value.

    ``fidelity``: fraction of the non-degraded time (where truth and an answer exist) the answer
    contains the truth; ``check_fidelity``: at each answer change, whether the answer being replaced
    still contained the truth at that instant (the paper's per-evaluation check), over ``checks``;
    ``degraded_fidelity``: the time fraction over degraded answers. None where nothing was measured.
    """
    span = {False: 0.0, True: 0.0}
    inside = {False: 0.0, True: 0.0}
    checks = hits = 0
    for t, cur_truth, prev, cur_ans, changed, nxt in _instants(truth, answers):
        if changed and prev is not None and cur_truth is not None and not prev[3]:
            checks += 1
            hits += _contains(prev, cur_truth)
        nxt = end if nxt is None else nxt
        if cur_truth is not None and cur_ans is not None and nxt > t:
            d = min(nxt, end) - t
            if d > 0:
                span[cur_ans[3]] += d
                if _contains(cur_ans, cur_truth):
                    inside[cur_ans[3]] += d
    return {"fidelity": inside[False] / span[False] if span[False] > 0 else None,
            "checks": checks, "check_fidelity": hits / checks if checks else None,
            "degraded_fidelity": inside[True] / span[True] if span[True] > 0 else None}
