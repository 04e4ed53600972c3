"""Sliding-window B-bucket histograms, the Histogram baseline of Bulut & Singh 2003 §2.7 (Guha & Koudas 2002).

The window keeps sums and squared sums per arrival; at query time a V-optimal histogram with B
buckets is built by dynamic programming. With ``eps`` > 0 the DP considers only the breakpoints
where the (B-1)-bucket error grows by a factor (1 + eps/(2B)) — the (1+eps)-approximation of
Guha, Koudas & Shim; eps = 0 is the exact O(B N^2) DP.
"""
import numpy as np


def _sse(p1, p2, i, j):
    """Squared error of one bucket over [i, j) for arrays of i (or j) via prefix sums."""
    n = j - i
    s = p1[j] - p1[i]
    return (p2[j] - p2[i]) - s * s / np.maximum(n, 1)


def vopt(values, buckets, eps=0.0):
    """Bucket boundaries [0 = b_0 < ... < b_B = N] of a (1+eps)-approximate V-optimal histogram."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0 or buckets < 1:
        raise ValueError("need values and at least one bucket")
    buckets = min(buckets, n)
    p1 = np.concatenate(([0.0], np.cumsum(x)))
    p2 = np.concatenate(([0.0], np.cumsum(x * x)))
    j = np.arange(n + 1)
    err = _sse(p1, p2, np.zeros_like(j), j)         # one bucket over [0, j)
    err[0] = 0.0
    back = np.zeros((buckets + 1, n + 1), dtype=np.int64)
    delta = eps / (2 * buckets)
    for b in range(2, buckets + 1):
        if eps > 0:
            cand = [b - 1]
            anchor = err[b - 1]
            for i in range(b, n):
                if err[i] > (1 + delta) * anchor + 1e-12:
                    if cand[-1] != i - 1:
                        cand.append(i - 1)
                    cand.append(i)
                    anchor = err[i]
            if cand[-1] != n - 1:
                cand.append(n - 1)
            cand = np.asarray(cand)
        else:
            cand = np.arange(b - 1, n)
        ii = cand[:, None]
        jj = j[None, :]
        cost = err[cand][:, None] + _sse(p1, p2, ii, jj)
        cost = np.where(ii < jj, cost, np.inf)
        arg = np.argmin(cost, axis=0)
        new = cost[arg, j]
        new[:b] = np.inf
        back[b] = cand[arg]
        err = new
    bounds = [n]
    for b in range(buckets, 1, -1):
        bounds.append(int(back[b][bounds[-1]]))
    bounds.append(0)
    return bounds[::-1]


def approximate(values, buckets, eps=0.0):
    """The histogram's reconstruction of ``values`` (bucket means) as a numpy array."""
    x = np.asarray(values, dtype=float)
    bounds = vopt(x, buckets, eps)
    out = np.empty_like(x)
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = x[a:b].mean()
    return out
