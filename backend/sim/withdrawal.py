"""How provisional answers fared (DESIGN.md §4 bounded withdrawal): per query, checked against ground truth at
every instant, before and after the withdrawals.

An *instant* is a time at which the query's exact value or its answer changes (within the run, both
known). At each, the answer as it was published is *degraded* (it said so), or *withdrawn* later (a
``revoked`` window of a later change covers it), or neither; a *wrong provisional* answer is one that
was neither degraded nor containing the truth when published — it must be withdrawn, and its
*withdrawal delay* is the event time from the instant to the change that withdrew it (never withdrawn:
the checker counts it as a violation); *withdrawn late* counts those withdrawn later than the
``withdraw_within`` the wrong answer stated (README: a consumer undoes what it did at most that much later;
target 0). The shares are of instants and of time.
"""
import math

import numpy as np

from backend.sim import truth as truth_mod


def provisional(truth, answers, revocations, end, stated=None):
    """``truth``: [(t, exact, scale)]; ``answers``: [(t, lo, hi, degraded)] as published, in time order;
    ``revocations``: [(t_from, t_to, t_published)]; ``end``: the run's end; ``stated``: each answer's
    ``withdraw_within`` (None: not checked). Returns the figures (see the module)."""
    out = {"instants": 0, "degraded_share": None, "withdrawn_share": None, "withdrawn_time_share": None,
           "wrong_provisional": 0, "withdraw_delay_max": None, "withdraw_delay_p99": None, "withdrawn_late": 0}
    if not truth or not answers:
        return out
    T, x, scale, has_t, lo, hi, deg, has_a, _, _, _ = truth_mod._merge(truth, answers)
    both = has_t & has_a & (T <= end)
    n = int(both.sum())
    if not n:
        return out
    withdrawn = np.zeros(len(T), dtype=bool)
    delay = np.full(len(T), math.inf)
    for a, b, at in revocations:
        m = (T >= a) & (T < b)
        withdrawn |= m
        delay = np.where(m, np.minimum(delay, at - T), delay)
    live = both & ~deg
    wrong = live & ~truth_mod._inside(lo, hi, x, scale)
    if stated is not None:
        at = np.searchsorted(np.array([a[0] for a in answers], dtype=float), T, "right") - 1
        bound = np.array(list(stated) + [math.inf], dtype=float)[np.where(at >= 0, at, len(stated))]
        out["withdrawn_late"] = int((wrong & np.isfinite(delay) & (delay > bound + 1e-9)).sum())
    d = delay[wrong]
    d = d[np.isfinite(d)]
    span = np.maximum(np.minimum(np.append(T[1:], end), end) - T, 0.0)
    total = float(span[both].sum())
    out.update(instants=n, degraded_share=float((both & deg).sum()) / n,
               withdrawn_share=float((live & withdrawn).sum()) / n,
               withdrawn_time_share=float(span[live & withdrawn].sum()) / total if total > 0 else None,
               wrong_provisional=int(wrong.sum()),
               withdraw_delay_max=float(d.max()) if len(d) else None,
               withdraw_delay_p99=float(np.percentile(d, 99)) if len(d) else None)
    return out
