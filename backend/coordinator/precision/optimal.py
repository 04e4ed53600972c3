"""Offline optimal static widths (Olston et al. 2003 §3.3, App. E–F): minimise Σ C_i·(2s_i)²/W_i² under the rows.

For a random walk with step s_i per time unit the streamed update period is P_i(W) ≈ W²/(2s_i)²
(App. E), so the static allocation that minimises the message rate solves
min Σ_i C_i·(2·s_i)²/W_i² s.t. Σ_i |K_ij|·W_i ≤ b_j for every row of ``precision.Rows``. We solve it
with SciPy's SLSQP from the uniform allocation. The squared steps per time unit come from the
workload's samples (simulator hook ``workload_samples``) or from the ``steps`` parameter; without
either (or with a zero precision) the protocol falls back to uniform widths.
"""
import math

import numpy as np
from scipy.optimize import minimize

from backend.coordinator.core.protocol import Protocol, range_constraints, realtime
from backend.coordinator.precision.rows import Rows, _per_key


def step_variance(keys, times, sources, values):
    """Per source: Σ(Δv)² / observed time span, i.e. the random walk's (step size)² per time unit."""
    out = {}
    for i, key in enumerate(keys):
        sel = sources == i
        t, v = times[sel], values[sel]
        if len(t) > 1 and t[-1] > t[0]:
            out[key] = float(np.sum(np.diff(v) ** 2) / (t[-1] - t[0]))
    return out


def solve(rows, var, cost, iters=1000):
    """Widths {key: W} minimising Σ cost·4·var/W² under ``rows`` (uniform where nothing is known)."""
    keys = sorted(rows.of)
    if not keys:
        return {}
    u = np.asarray([rows.uniform(k) for k in keys])
    if not var or not np.all(u > 0):
        return dict(zip(keys, u.tolist()))
    mean = sum(var.values()) / len(var)
    c = np.asarray([cost(k) * 4.0 * var.get(k, mean) for k in keys]) * u ** -2.0
    scale = c.sum() or 1.0
    c = c / scale
    pos = {k: i for i, k in enumerate(keys)}
    A = np.zeros((len(rows.coef), len(keys)))
    for j, coef in enumerate(rows.coef):
        for k, w in coef.items():
            A[j, pos[k]] = w * u[pos[k]] / rows.budget[j]
    res = minimize(lambda x: float(np.sum(c / x ** 2)), np.ones(len(keys)), jac=lambda x: -2.0 * c / x ** 3,
                   method="SLSQP", bounds=[(1e-6, None)] * len(keys),
                   constraints=[{"type": "ineq", "fun": lambda x: 1.0 - A @ x, "jac": lambda x: -A}],
                   options={"maxiter": iters, "ftol": 1e-12})
    x = res.x
    over = (A @ x).max()
    if over > 1.0:
        x = x / over            # SLSQP may end a hair outside; scale back inside every row
    return dict(zip(keys, (x * u * (1 - 1e-9)).tolist()))


class OptimalStatic(Protocol):
    """Static widths from the App. F optimisation, fixed for as long as the queries are."""
    name = "optimal_static"
    replaces = True
    static = True

    def __init__(self, steps=None, cost=1.0, iters=1000):
        self.cost = _per_key(cost, "cost")
        self.var = {}
        if steps is not None:
            if not isinstance(steps, dict):
                raise ValueError("steps must be {source: step size per time unit}")
            get = _per_key(steps, "steps")
            self.var = {k: get(k) ** 2 for k in steps}
        self.measure = steps is None
        if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
            raise ValueError("iters must be a positive integer, got %r" % (iters,))
        self.iters = iters
        self.widths = {}

    def workload_samples(self, keys, times, sources, values):
        if self.measure:
            self.var = step_variance(keys, np.asarray(times), np.asarray(sources), np.asarray(values))

    def queries_changed(self, coord, now):
        self.widths = solve(Rows(realtime(coord)), self.var, self.cost, self.iters)
        Protocol.queries_changed(self, coord, now)

    def target(self, coord, key):
        return self.widths.get(key, math.inf), range_constraints(coord, key)

PROTOCOLS = {"optimal_static": OptimalStatic}
