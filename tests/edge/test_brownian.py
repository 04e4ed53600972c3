"""Brownian estimators: ML μ, σ² converge on synthetic DBM paths; Eq. 7 deferral, φ1/φ2, quantiles."""
import math

from edge.core.brownian import Estimator, below, defer, phi1, phi2, within, z_two
from portable import Rng, raises


def _normal(r):
    u = r.random() or 1e-12
    return math.sqrt(-2.0 * math.log(u)) * math.cos(2.0 * math.pi * r.random())


def _path(r, mu, sigma, n, irregular):
    t, v = 0.0, 100.0
    out = [(t, v)]
    for _ in range(n - 1):
        d = r.uniform(0.1, 3.0) if irregular else 1.0
        t += d
        v += mu * d + sigma * math.sqrt(d) * _normal(r)
        out.append((t, v))
    return out


def _direct(items):
    """Eq. 15 and 16 written out literally (the oracle)."""
    k = len(items)
    ys = [items[j][1] - items[j - 1][1] for j in range(1, k)]
    ds = [items[j][0] - items[j - 1][0] for j in range(1, k)]
    mu = sum(ys) / sum(ds)
    s2 = sum((y - d * mu) ** 2 / d for y, d in zip(ys, ds)) / (k - 2)
    return mu, s2


def test_estimates_match_the_equations_on_a_sliding_buffer():
    r = Rng(3)
    items = _path(r, 0.3, 2.0, 350, True)
    e = Estimator(k=40)
    for j, (t, v) in enumerate(items):
        assert e.add(t, v)
        if j >= 2:
            mu, s2 = e.estimate()
            m0, s0 = _direct(items[max(0, j - 39):j + 1])
            assert abs(mu - m0) <= 1e-9 * (1 + abs(m0)) and abs(s2 - s0) <= 1e-9 * (1 + s0), (j, mu, m0, s2, s0)
    assert len(e) == 40 and e.last() == items[-1]


def test_estimates_converge_within_statistical_bounds():
    # μ̂ ~ N(μ, σ²/span) and σ̂² has sd ≈ σ²·sqrt(2/(k-2)); allow 4.5 standard errors.
    for seed in range(6):
        r = Rng(10 + seed)
        mu, sigma = r.uniform(-1.0, 1.0), r.uniform(0.2, 3.0)
        k = 400
        items = _path(r, mu, sigma, k, seed % 2 == 0)
        e = Estimator(k=k)
        for t, v in items:
            e.add(t, v)
        m, s2 = e.estimate()
        span = items[-1][0] - items[0][0]
        assert abs(m - mu) <= 4.5 * sigma / math.sqrt(span), (seed, m, mu)
        assert abs(s2 - sigma * sigma) <= 4.5 * sigma * sigma * math.sqrt(2.0 / (k - 2)), (seed, s2, sigma * sigma)


def test_unbiased_variance_on_average_over_many_short_buffers():
    r = Rng(77)
    acc, n = 0.0, 300
    for _ in range(n):
        e = Estimator(k=6)
        for t, v in _path(r, 0.5, 1.0, 6, True):
            e.add(t, v)
        acc += e.estimate()[1]
    # each σ̂² has sd sqrt(2/4) = 0.71: the mean of 300 is within 4.5·0.041 of 1 (the k-1 ML estimator is 0.8)
    assert abs(acc / n - 1.0) < 0.19, acc / n


def test_estimator_ignores_items_that_do_not_advance_time_and_needs_three():
    e = Estimator(k=5)
    assert e.estimate() is None
    assert e.add(1.0, 1.0) and not e.add(1.0, 2.0) and not e.add(0.5, 2.0)
    assert not e.add(2.0, float("nan")) and not e.add(2.0, float("inf"))
    assert e.add(2.0, 3.0) and e.estimate() is None
    assert e.add(4.0, 3.0)
    mu, s2 = e.estimate()
    assert abs(mu - 2.0 / 3.0) < 1e-12 and s2 > 0
    raises(ValueError, Estimator, 2)


def test_defer_solves_equation_7():
    for mu, s2, eps, p in ((0.0, 1.0, 2.0, 0.95), (0.3, 2.0, 1.0, 0.9), (-0.5, 0.5, 3.0, 0.85), (2.0, 0.01, 1.0, 0.95)):
        dt = defer(eps, p, mu, s2, 1e6)
        assert abs(within(eps, mu, s2, dt) - p) < 1e-9, (mu, s2, dt)
        assert within(eps, mu, s2, dt * 0.99) > p
    # no drift: closed form (eps / (z σ))²
    z = z_two(0.95)
    assert abs(defer(2.0, 0.95, 0.0, 1.0, 1e6) - (2.0 / z) ** 2) < 1e-6
    assert defer(1.0, 0.9, 0.0, 1e-6, 50.0) == 50.0
    assert defer(1.0, 0.9, 0.5, 0.0, 50.0) == 2.0 and defer(1.0, 0.9, 0.0, 0.0, 50.0) == 50.0
    raises(ValueError, defer, 1.0, 1.0, 0.0, 1.0, 10.0)
    raises(ValueError, defer, -1.0, 0.5, 0.0, 1.0, 10.0)


def test_defer_holds_by_monte_carlo():
    r = Rng(5)
    mu, s2, eps, p = 0.2, 1.5, 2.0, 0.9
    dt = defer(eps, p, mu, s2, 1e6)
    n, inside = 4000, 0
    for _ in range(n):
        x = mu * dt + math.sqrt(s2 * dt) * _normal(r)
        inside += abs(x) <= eps
    assert abs(inside / n - p) < 4.5 * math.sqrt(p * (1 - p) / n), inside / n


def test_z_two_is_the_two_sided_quantile():
    assert abs(z_two(0.95) - 1.959963985) < 1e-8
    assert abs(z_two(0.9) - 1.644853627) < 1e-8
    assert abs(math.erf(z_two(0.5) / math.sqrt(2)) - 0.5) < 1e-12
    raises(ValueError, z_two, 1.0)


def test_phi2_one_sided_and_drift_down():
    c, p = 1.5, 0.9
    t = phi2(c, p, 0.1, 1.0, 1e6)
    assert abs(below(c, 0.1, 1.0, t) - p) < 1e-9
    # drifting away from the level: never crosses within tmax when the minimum stays above p
    assert phi2(c, p, -5.0, 0.01, 100.0) == 100.0
    assert phi2(-1.0, p, 0.0, 1.0, 10.0) == 0.0
    assert phi2(1.0, p, 0.5, 0.0, 10.0) == 2.0


def test_phi1_against_brute_force_window_slide():
    r = Rng(9)
    for _ in range(15):
        tk, w = 100.0, 30.0
        items = []
        t = tk - w
        while t <= tk:
            items.append((t, r.uniform(0.0, 10.0)))
            t += r.uniform(0.5, 4.0)
        am = max(v for _, v in items)
        eps = r.uniform(0.0, 6.0)
        got = phi1(items, tk, w, am, eps)
        # brute force: slide the trailing edge in small steps; the max of the step function over
        # [tk - w + tau, tk] is the value in force at the edge and every item after it
        tau, step = 0.0, 0.005
        while tau < w:
            edge = tk - w + tau
            held = [v for (s, v) in items if s <= edge]
            vals = ([held[-1]] if held else []) + [v for (s, v) in items if s > edge]
            if max(vals) <= am - eps:
                break
            tau += step
        assert abs(min(tau, w) - got) <= 2 * step, (got, tau, eps)
