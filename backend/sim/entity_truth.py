"""Ground truth and checker for entity queries (Cheng et al. 2005 §3.2-3.3): range and k-NN sets over time.

``EntityTruth`` maintains every entity query's exact answer incrementally per reading: the set of
sources inside [l, u], or the k nearest (and, with a rank tolerance r, the k+r nearest) kept in a
sorted list of (score, source index), where one update swaps at most one member in or out. It
records the membership changes per instant. ``check`` merges them with the answers and measures, at
every instant where either changes, the false-positive fraction F+ = E+/|A|, the false-negative
fraction F− = E−/|true answer| (Eqs. 1, 2), the members ranked below k (rank misses) and whether
every member ranks k+r or better with |A| = k (Definition 1). An instant whose non-degraded answer
exceeds the query's tolerance (the rank tolerance when the query states one, else ε+ and ε−) is a
violation.
"""
import bisect

from backend.coordinator.core.queries import ENTITIES as KINDS
from backend.coordinator.tolerance.entity import keyfn, tolerances

TOL = 1e-9


class _Track:
    def __init__(self, q, index):
        self.q = q
        self.idx = [index[s] for s in q.sources]
        self.name = {index[s]: s for s in q.sources}
        self.timeline = []          # [(t, [(level, source index, +1 | -1), ...])]
        self.deltas = []
        if q.kind == "knn":
            k = q.extra["k"]
            self.levels = [k] + ([k + q.extra["rank_tolerance"]] if "rank_tolerance" in q.extra else [])
            self.score = keyfn(q.extra["point"])
            self.order = []         # sorted [(score, index)] of sources with a value
            self.scores = {}
        else:
            self.levels = [None]

    def update(self, i, old, v):
        if self.q.kind == "range":
            l, u = self.q.range
            was = old is not None and l <= old <= u
            now = l <= v <= u
            if was != now:
                self.deltas.append((0, i, 1 if now else -1))
            return
        order = self.order
        p_old = None
        if i in self.scores:
            p_old = bisect.bisect_left(order, (self.scores[i], i))
            del order[p_old]
        s = self.scores[i] = self.score(v)
        p_new = bisect.bisect_left(order, (s, i))
        order.insert(p_new, (s, i))
        for lv, m in enumerate(self.levels):
            was = p_old is not None and p_old < m
            now = p_new < m
            if was and not now:
                self.deltas.append((lv, i, -1))
                self.deltas.append((lv, order[m - 1][1], 1))
            elif now and not was:
                self.deltas.append((lv, i, 1))
                if len(order) > m:
                    self.deltas.append((lv, order[m][1], -1))


class EntityTruth:
    """Exact range / k-NN answers of the simulator's true values, as membership changes over time."""

    def __init__(self, index):
        self.index = index
        self.tracks = {}
        self.by_src = {}

    def add_query(self, q, values, t):
        tr = self.tracks[q.id] = _Track(q, self.index)
        for i in tr.idx:
            self.by_src.setdefault(i, []).append(tr)
            if values[i] is not None:
                tr.update(i, None, values[i])
        self.flush(t)

    def update(self, i, old, v):
        for tr in self.by_src.get(i, ()):
            tr.update(i, old, v)

    def flush(self, t):
        for tr in self.tracks.values():
            if tr.deltas:
                tr.timeline.append((t, tr.deltas))
                tr.deltas = []


def check(track, answers, end):
    """Measure one entity query's answers ``[(t, members, degraded)]`` against ``track``.

    Returns the per-query figures: answers, violations (instants out of tolerance), violation and
    degraded time, max and time-mean F+ and F−, max rank misses and rank violations.
    """
    q = track.q
    ep, en = tolerances(q)
    rank = q.kind == "knn" and "rank_tolerance" in q.extra
    k = q.extra.get("k")
    index = {s: i for i, s in track.name.items()}
    truth = [set() for _ in track.levels]
    A = set()
    cnt = [0] * len(track.levels)
    ans_deg = None
    ev = [(t, 0, j) for j, (t, _) in enumerate(track.timeline)] + [(t, 1, j) for j, (t, _, _) in enumerate(answers)]
    ev.sort()
    out = {"answers": len(answers), "violations": 0, "violation_time": 0.0, "degraded_time": 0.0,
           "max_fp": 0.0, "max_fn": 0.0, "mean_fp": 0.0, "mean_fn": 0.0, "max_fp_degraded": 0.0,
           "max_fn_degraded": 0.0, "rank_violations": 0, "max_rank_misses": 0, "mean_size": 0.0,
           "fp_tolerance": ep, "fn_tolerance": en}
    if rank:
        out["rank_tolerance"] = q.extra["rank_tolerance"]
    prev_t = None
    prev = None                     # (fp, fn, bad, degraded, size) holding since prev_t
    covered = 0.0
    j = 0
    while j <= len(ev):
        t = ev[j][0] if j < len(ev) else end
        if prev is not None and prev_t is not None:
            dt = max(0.0, min(t, end) - prev_t)
            fp, fn, bad, deg, size = prev
            covered += dt
            out["mean_fp"] += fp * dt
            out["mean_fn"] += fn * dt
            out["mean_size"] += size * dt
            if bad:
                out["violation_time"] += dt
            if deg:
                out["degraded_time"] += dt
        if j == len(ev) or t > end:
            break
        while j < len(ev) and ev[j][0] == t:
            _, kind, n = ev[j]
            if kind == 0:
                for lv, i, sign in track.timeline[n][1]:
                    if sign > 0:
                        truth[lv].add(i)
                        cnt[lv] += i in A
                    else:
                        truth[lv].discard(i)
                        cnt[lv] -= i in A
            else:
                _, members, ans_deg = answers[n]
                A = {index[s] for s in members}
                cnt = [len(A & T) for T in truth]
            j += 1
        prev_t = t
        if ans_deg is None:
            prev = None
            continue
        size = len(A)
        fp = (size - cnt[0]) / size if size else 0.0
        true_n = k if q.kind == "knn" else len(truth[0])
        fn = (true_n - cnt[0]) / true_n if true_n else 0.0
        rank_bad = rank and (size != k or cnt[1] < size)
        if ans_deg:
            out["max_fp_degraded"] = max(out["max_fp_degraded"], fp)
            out["max_fn_degraded"] = max(out["max_fn_degraded"], fn)
            bad = False
        else:
            out["max_fp"] = max(out["max_fp"], fp)
            out["max_fn"] = max(out["max_fn"], fn)
            if q.kind == "knn":
                out["max_rank_misses"] = max(out["max_rank_misses"], size - cnt[0])
            bad = rank_bad if rank else fp > ep + TOL or fn > en + TOL
            if bad:
                out["violations"] += 1
                out["rank_violations"] += bool(rank_bad)
        prev = (fp, fn, bad, ans_deg, size)
    if covered > 0:
        for f in ("mean_fp", "mean_fn", "mean_size"):
            out[f] /= covered
    return out


def is_entity(q):
    return q.kind in KINDS
