"""Ground truth and checker for summary queries (Bulut & Singh 2003 §2.4): the exact window at each read.

``SummaryTruth`` keeps the full reading history of every source a summary query reads, with the
reading count reached at every instant; ``check`` takes each instant's last answer of a query,
recomputes the exact value of the positions that read asked for (the window as of that instant) and
counts every non-degraded answer whose [lo, hi] misses it as a violation.
"""
import bisect

from backend.coordinator.swat.replication import evaluate, positions

TOL = 1e-6      # segment ranges travel as float32 rounded outward; sums are compared with this slack


class SummaryTruth:
    def __init__(self, index):
        self.index = index
        self.tracks = {}            # qid -> (query, source index)
        self.hist = {}              # source index -> readings in order
        self.marks = {}             # source index -> ([t], [count])
        self.touched = set()

    def add_query(self, q):
        i = self.index[q.sources[0]]
        self.tracks[q.id] = (q, i)
        self.hist.setdefault(i, [])
        self.marks.setdefault(i, ([], []))

    def update(self, i, v):
        h = self.hist.get(i)
        if h is not None:
            h.append(v)
            self.touched.add(i)

    def flush(self, t):
        for i in self.touched:
            ts, cs = self.marks[i]
            ts.append(t)
            cs.append(len(self.hist[i]))
        self.touched.clear()

    def exact(self, qid, t, first, last):
        """The exact answer of a read of ``qid`` over [first, last] at time t; None if too early."""
        q, i = self.tracks[qid]
        ts, cs = self.marks[i]
        j = bisect.bisect_right(ts, t) - 1
        if j < 0:
            return None
        c = cs[j]
        pos, ws = positions(q, first, last)
        if c - 1 - max(pos) < 0:
            return None
        h = self.hist[i]
        return evaluate(q, pos, ws, lambda p: (h[c - 1 - p],) * 3)[0]


def check(truth, qid, answers, end):
    """Per-query figures for summary answers [dict] (time order): violations, precision misses, widths."""
    q = truth.tracks[qid][0]
    last = {}
    for a in answers:
        if a["time"] <= end:
            last[a["time"]] = a
    out = {"answers": len(last), "checked": 0, "violations": 0, "precision_misses": 0, "degraded": 0,
           "local": 0, "mean_width": None, "mean_abs_error": None}
    width = err = 0.0
    for t in sorted(last):
        a = last[t]
        if a["degraded"]:
            out["degraded"] += 1
            continue
        x = truth.exact(qid, t, a["first"], a["last"])
        if x is None:
            continue
        out["checked"] += 1
        out["local"] += bool(a.get("local"))
        tol = TOL * (1.0 + abs(x) + abs(a["lo"]) + abs(a["hi"]))
        if not a["lo"] - tol <= x <= a["hi"] + tol:
            out["violations"] += 1
        if a["hi"] - a["lo"] > q.precision + tol:
            out["precision_misses"] += 1
        width += a["hi"] - a["lo"]
        err += abs(a["estimate"] - x)
    if out["checked"]:
        out["mean_width"] = width / out["checked"]
        out["mean_abs_error"] = err / out["checked"]
    return out
