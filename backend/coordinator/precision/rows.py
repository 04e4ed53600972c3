"""The width constraints queries impose, their optimum and the burden-target system (Olston et al. 2003 App. A, B, D, F).

``Rows``: per query row j, Σ_i |K_ij|·W_i ≤ b_j (a weighted AVG: b_j = δ_j·|S_j|, a SUM: δ_j, a MIN/MAX:
one single-object row W_i ≤ δ_j per object; padding φ_i taken off the budget), the uniform share of each
row (§1.2) and ``fit`` (scale a violated row's members down). ``allocate``: the widths minimising
Σ weight_i·W_i^(−α) under the rows (App. F). ``burden_targets``: App. B's linear system for the burden
targets T_j, solved by LSMR. Shared by the shrink rule (``adaptive.py``), the estimated rule
(``estimate.py``) and the static optimum (``optimal.py``); ``_per_key`` validates per-source parameters.
"""
import math

import numpy as np
from scipy.sparse import csr_matrix

from backend.coordinator.precision.lsmr import lsmr

INF = math.inf
_MARGIN = 1e-9          # growth is applied with this relative margin so float sums stay within δ
_ROUNDING = 1e-12       # a row over its budget by no more than its sum's rounding fits (uniform shares)


class _PerKey:
    """A per-source lookup that pickles (the Spark job keeps protocols in its state store)."""
    __slots__ = ("table", "default")

    def __init__(self, table, default):
        self.table, self.default = table, default

    def __call__(self, key):
        return self.table.get(key, self.default)


def _per_key(value, what):
    """A number or {key: number} parameter, validated; returns a lookup function."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError("%s[%r] must be a finite number >= 0, got %r" % (what, k, v))
        return _PerKey({k: float(v) for k, v in value.items()}, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError("%s must be a finite number >= 0 or {source: number}, got %r" % (what, value))
    return _PerKey({}, float(value))


class Rows:
    """The linear width constraints Σ_i |K_ij|·W_i ≤ b_j that the queries impose (App. A, B, D)."""

    def __init__(self, queries, phi=lambda key: 0.0):
        self.coef = []          # row j -> {key: |K_ij|}
        self.budget = []        # row j -> b_j (never negative)
        self.share = []         # row j -> the equal width b_j/Σ_i|K_ij|
        self.query = []         # row j -> query id
        for qid in sorted(queries):
            q = queries[qid]
            if q.kind in ("avg", "sum"):
                c = {s: abs(q.weights[s]) for s in q.sources}
                m, norm = (len(q.sources) if q.kind == "avg" else 1), q.norm()
                pad = math.fsum(c[s] * phi(s) for s in c)
                # δ·(m/Σ|K|): exactly δ for an AVG of unit weights, whatever n (δ·n/n is an ulp off at
                # some n, and a share that flips by an ulp between births re-sends every unconfirmed width)
                self._add(qid, c, q.budget() * m - pad, q.budget() * (m / norm) - pad / norm)
            elif q.kind in ("min", "max"):
                for s in q.sources:
                    self._add(qid, {s: 1.0}, q.budget() - phi(s), q.budget() - phi(s))
        self.of = {}            # key -> [(row, |K|)]
        for j, c in enumerate(self.coef):
            for s, k in c.items():
                self.of.setdefault(s, []).append((j, k))

    def _add(self, qid, coef, budget, share):
        self.coef.append(coef)
        self.budget.append(max(0.0, budget))
        self.share.append(max(0.0, share))
        self.query.append(qid)

    def uniform(self, key):
        """Uniform allocation (§1.2): the smallest equal share b_j/Σ_i|K_ij| over key's rows."""
        return min(self.share[j] for j, _ in self.of[key])

    def used(self, widths):
        return [math.fsum(k * widths.get(s, 0.0) for s, k in c.items()) for c in self.coef]

    def fit(self, widths, rows=None):
        """Scale down the members of every violated row (all rows, or those in ``rows``) to fit; a
        member without a width (declared, not born yet) takes up nothing."""
        factor = {}
        for j, u in enumerate(self.used(widths)):
            b = self.budget[j]
            if (rows is None or j in rows) and u > b * (1 + _ROUNDING):
                f = b / u * (1 - _MARGIN) if u > 0 else 0.0
                for s in self.coef[j]:
                    if s in widths:
                        factor[s] = min(factor.get(s, 1.0), f)
        for s, f in factor.items():
            widths[s] = widths[s] * f
        return widths


def allocate(rows, weight, alpha, lam=None, iters=20, tol=1e-4):
    """Widths minimising Σ weight_i·W_i^(−α) under ``rows`` (App. F), and the row multipliers λ.

    KKT: W_i = (α·weight_i / Σ_j λ_j·|K_ij|)^(1/(α+1)); λ_j is scaled by (used_j/b_j)^((α+1)/2) per pass
    (exact in one pass for a single row) until no width moves by more than ``tol`` (the caller warm-starts
    λ, so successive calls keep converging). Rows with no budget pin their sources at width 0. Plain
    Python floats in a fixed order: the same widths in every process.
    """
    keys = sorted(rows.of)
    m = len(rows.coef)
    lam = list(lam) if lam is not None and len(lam) == m else [1.0] * m
    zero = {s for j, c in enumerate(rows.coef) if rows.budget[j] <= 0 for s in c}
    p = 1.0 / (alpha + 1.0)
    step = (alpha + 1.0) / 2.0
    widths, last = {}, {}
    for it in range(iters):
        moved = 0.0
        for key in keys:
            if key in zero:
                widths[key] = 0.0
                continue
            d = math.fsum(lam[j] * k for j, k in rows.of[key])
            w = widths[key] = (alpha * weight[key] / d) ** p if d > 0 else INF
            w0 = last.get(key, 0.0)
            moved = max(moved, abs(w - w0) / w if 0 < w < INF else (0.0 if w == w0 else 1.0))
        if it == iters - 1 or moved < tol:
            break
        last = dict(widths)
        for j, used in enumerate(rows.used(widths)):
            b = rows.budget[j]
            if b > 0:
                r = used / b if used < INF else 1e6
                lam[j] = min(max(lam[j] * max(r, 1e-6) ** step, 1e-300), 1e300)
    for key in keys:
        if widths[key] == INF:
            widths[key] = rows.uniform(key)
    return rows.fit(widths), lam


def burden_targets(rows, burden, x0=None, eps=1e-8):
    """Solve App. B's system for the targets T_j with a sparse iterative least-squares solver (LSMR).

    T_j·|S_j| + Σ_{i∈S_j} Σ_{k≠j} (|K_ik|/|K_ij|)·T_k = Σ_{i∈S_j} B_i/|K_ij|, i.e. Kinvᵀ·(K·T − B) = 0
    with K_ij = |K_ij| and Kinv_ij = 1/|K_ij| on the query sets. ``burden`` maps key -> B_i.
    LSMR gives the minimum-norm solution when overlapping queries make the system singular; ours
    (``lsmr.py``) gives the same bits in every process.
    """
    keys = sorted(rows.of)
    pos = {s: i for i, s in enumerate(keys)}
    r, c, k = [], [], []
    for j, coef in enumerate(rows.coef):
        for s, w in coef.items():
            r.append(pos[s])
            c.append(j)
            k.append(w)
    shape = (len(keys), len(rows.coef))
    K = csr_matrix((k, (r, c)), shape=shape)
    Kinv = csr_matrix((1.0 / np.asarray(k), (r, c)), shape=shape)
    M = (Kinv.T @ K).tocsr()
    rhs = Kinv.T @ np.asarray([burden[s] for s in keys])
    if x0 is not None and len(x0) != shape[1]:
        x0 = None
    return lsmr(M, rhs, atol=eps, btol=eps, x0=x0, maxiter=max(100, 20 * shape[1]))
