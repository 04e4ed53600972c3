"""Ground truth for final answers (DESIGN.md §4; backend/coordinator/core/finals.py): every final answer of every
aggregate kind against the exact step function, without exception.

A final answer ``(t, lo, hi, dlo, dhi, degraded)`` states that from ``t`` until the next final answer of its
query (the last one: until the query's final horizon) the exact aggregate lies in [lo + dlo·(τ−t),
hi + dhi·(τ−t)]. The truth is constant between its changes and the bounds are linear, so containment over an
overlap [u, v) holds iff it holds at u and at v (as a limit): both ends are checked, as is the width against
the precision in force. Nothing exempts a final answer: a revoked window withdraws provisional answers only.
A final answer is never withdrawn nor restated either: one starting before the horizon an earlier final answer
of its query reached counts as ``final_revoked``.
"""
from backend.sim.truth import TOL


def _pct(xs, p):
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None


def check_final(truth, finals, horizon, precision, emitted=(), wrong=None):
    """``truth``: [(t, exact, scale)]; ``finals``: [(t, lo, hi, dlo, dhi, degraded, watermark)] in issue order;
    ``horizon``: the time through which the finals hold; ``precision``: [(t, δ)] in time order; ``emitted``: the
    clock each final answer was issued at (for its latency); ``wrong``: a list that gets (k, τ, exact, lo, hi) of
    every final answer ``finals[k]`` that misses the truth at τ.
    Returns {"finals", "final_violations", "final_precision_misses", "final_revoked", "final_degraded",
    "final_from", "final_through", "final_latency": {"p50", "p99", "max"}}."""
    bad = misses = revoked = degraded = 0
    reached, batch = -float("inf"), None      # the horizon before the batch a final answer was issued in
    for f in finals:
        if f[6] != batch:
            reached, batch = max(reached, batch if batch is not None else reached), f[6]
        revoked += f[0] < reached
    j = 0
    for k, (t, lo, hi, dlo, dhi, deg, _) in enumerate(finals):
        end = finals[k + 1][0] if k + 1 < len(finals) else horizon
        degraded += bool(deg)
        if end <= t or deg:
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
            ends = [(lo + dlo * (tau - t), hi + dhi * (tau - t)) for tau in (u, v)]
            miss = [(tau, a, b) for tau, (a, b) in zip((u, v), ends) if not a - tol <= x <= b + tol]
            bad += bool(miss)
            if miss and wrong is not None:
                wrong.append((k, miss[0][0], x, miss[0][1], miss[0][2]))
            misses += any(b - a > delta[0] + tol for a, b in ends)
            i += 1
    late = sorted(at - f[0] for f, at in zip(finals, emitted))
    return {"finals": len(finals), "final_violations": bad, "final_precision_misses": misses,
            "final_revoked": revoked, "final_degraded": degraded,
            "final_from": finals[0][0] if finals else None, "final_through": horizon if finals else None,
            "final_latency": {"p50": _pct(late, 0.5), "p99": _pct(late, 0.99), "max": late[-1] if late else None}}


def wider(finals, horizon, precision):
    """Final answers of one query (records, time order) wider than the precision in force at their time
    (``precision``: [(from, δ)]): (those answers, the time all of them stand, the time the wide ones stand).
    A final stands until the query's next one, the last to ``horizon``; one of infinite width (a source's
    value unknown, said so) is not counted as wide."""
    if not finals:
        return [], 0.0, 0.0
    ends = [a["time"] for a in finals[1:]] + [max(finals[-1]["time"], horizon or finals[-1]["time"])]
    wide, span, wide_span = [], 0.0, 0.0
    for a, end in zip(finals, ends):
        d = ([x for at, x in precision if at <= a["time"]][-1:] or [precision[0][1]])[0]
        span += end - a["time"]
        if d * (1 + 1e-9) < a["hi"] - a["lo"] < float("inf"):
            wide.append(a)
            wide_span += end - a["time"]
    return wide, span, wide_span


def unsaid(wide):
    """Of final answers wider than their precision (``wider``'s), those that do not say so: not degraded, or
    degraded for another reason without the width they give (issue #30 item 3: flagged with the reason and the
    width it could give)."""
    return [a for a in wide if not (a.get("degraded") and "wider than precision: width %.6g" % (a["hi"] - a["lo"])
                                    in (a.get("reason") or ""))]
