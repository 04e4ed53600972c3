"""Ground truth for final answers of segment mode (our extension of Olston et al. 2003 §1.2 after
Elmeleegy et al. 2009; backend/coordinator/core/segments.py): every final answer against the exact step
function.

A final answer ``(t, lo, hi, dlo, dhi, degraded)`` states that from ``t`` until the next final answer of
its query (the last one: until the query's final horizon) the exact aggregate lies in
[lo + dlo·(τ−t), hi + dhi·(τ−t)]. The truth is constant between its changes and the bounds are linear, so
containment over an overlap [u, v) holds iff it holds at u and at v (as a limit); both ends are checked.
Parts of a final answer inside a revoked window (an answer change's ``revoked``: late news showed the
answers over it may be wrong, issue #20) count as degraded.
"""
from backend.sim.truth import TOL


def _outside(u, v, revoked):
    """The parts of [u, v) outside every revoked window [a, b]."""
    parts = [(u, v)]
    for a, b in revoked:
        parts = [p for x, y in parts for p in ((x, min(y, a)), (max(x, b), y)) if p[1] > p[0]]
    return parts


def check_final(truth, finals, horizon, precision, revoked=()):
    """``truth``: [(t, exact, scale)]; ``finals``: [(t, lo, hi, dlo, dhi, degraded)] in time order;
    ``horizon``: the time through which the finals hold; ``precision``: [(t, δ)] in time order;
    ``revoked``: [[a, b]] windows where answers count as degraded.
    Returns {"finals", "final_violations", "final_precision_misses", "final_from", "final_through"}."""
    bad = misses = 0
    j = 0
    for k, (t, lo, hi, dlo, dhi, degraded) in enumerate(finals):
        end = finals[k + 1][0] if k + 1 < len(finals) else horizon
        if end <= t or degraded:
            continue
        delta = [d for at, d in precision if at <= t][-1:] or [precision[0][1]]
        while j + 1 < len(truth) and truth[j + 1][0] <= t:
            j += 1
        i = j
        while i < len(truth) and truth[i][0] < end:
            u = max(t, truth[i][0])
            v = min(end, truth[i + 1][0]) if i + 1 < len(truth) else end
            _, x, scale = truth[i]
            tol = TOL * (1.0 + scale + abs(x))
            for u, v in _outside(u, v, revoked):
                ends = [(lo + dlo * (tau - t), hi + dhi * (tau - t)) for tau in (u, v)]
                bad += any(not a - tol <= x <= b + tol for a, b in ends)
                misses += any(b - a > delta[0] + tol for a, b in ends)
            i += 1
    return {"finals": len(finals), "final_violations": bad, "final_precision_misses": misses,
            "final_from": finals[0][0] if finals else None, "final_through": horizon if finals else None}
