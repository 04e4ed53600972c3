"""Evaluation scheduling: EDF, and Zhu's penalty order under overload (Zhu & Ravishankar 2004 §5, Eq. 18).

A task is one query refresh: probing its sources costs ``cost`` probes (the processing time p_i)
and it should complete by ``deadline``. When everything due fits the budget, tasks run in EDF
order. Under overload the tasks that must wait are chosen to minimise Σ P_i: tasks are sequenced
by non-increasing (|μ_A| + σ_A/sqrt(L)) / p_i, where L is the lateness a task would incur by
waiting one more quantum (|s_i| of the paper).
"""
import math

ORDERS = ("penalty", "edf")


def penalty(mu, sigma, late):
    """Eq. 18: the extra error expected of a task completed ``late`` seconds after its deadline."""
    if late <= 0:
        return 0.0
    return abs(mu) * late + sigma * math.sqrt(late)


class Task:
    __slots__ = ("id", "deadline", "cost", "mu", "sigma")

    def __init__(self, tid, deadline, cost, mu=0.0, sigma=0.0):
        self.id = tid
        self.deadline = deadline
        self.cost = cost
        self.mu = mu
        self.sigma = sigma


def plan(tasks, now, budget, quantum, order="penalty"):
    """The due ``tasks`` to run at ``now`` within ``budget`` probes; the rest wait one ``quantum``."""
    if order not in ORDERS:
        raise ValueError("order must be one of %s" % ", ".join(ORDERS))
    edf = sorted(tasks, key=lambda k: (k.deadline, k.id))
    if sum(k.cost for k in tasks) <= budget:
        return edf
    if order == "penalty":
        def metric(k):
            late = max(now + quantum - k.deadline, 1e-9)
            return -(abs(k.mu) + k.sigma / math.sqrt(late)) / max(k.cost, 1)
        edf.sort(key=lambda k: (metric(k), k.deadline, k.id))
    out = []
    for k in edf:
        if k.cost <= budget:
            out.append(k)
            budget -= k.cost
    return out
