"""Interval filter: report rule, shrink re-check, constraints; a mirror fed only reports always holds the truth."""
from edge.core.interval import IntervalFilter, INF, membership
from portable import Rng, raises


def test_reports_on_exit_and_recenters():
    f = IntervalFilter(width=4.0)
    assert f.check(10.0)            # nothing reported yet
    f.recenter(10.0)
    assert (f.lo, f.hi) == (8.0, 12.0)
    assert not f.check(8.0) and not f.check(12.0) and not f.check(11.9)
    assert f.check(12.01) and f.check(7.99)
    f.recenter(12.5)
    assert (f.lo, f.hi) == (10.5, 14.5)


def test_shrink_is_symmetric_and_rechecks_both_ends():
    f = IntervalFilter(width=10.0)
    f.recenter(0.0)
    f.shrink(0.5)
    assert f.width == 5.0 and (f.lo, f.hi) == (-2.5, 2.5)
    assert f.check(3.0) and f.check(-3.0) and not f.check(2.0)


def test_infinite_width_never_reports_and_zero_width_reports_every_change():
    f = IntervalFilter(width=INF)
    f.recenter(1.0)
    assert not f.check(1e300) and not f.check(-1e300)
    f.shrink(0.05)
    assert f.width == INF and f.silent()
    g = IntervalFilter(width=0.0)
    g.recenter(1.0)
    assert not g.check(1.0) and g.check(1.0000001)


def test_constraint_reports_on_crossing_only():
    f = IntervalFilter()
    f.set_filter(INF, [(400.0, 600.0)], 1)
    f.recenter(500.0)
    assert not f.check(401.0) and not f.check(600.0)
    assert f.check(601.0) and f.check(399.0)
    f.recenter(700.0)
    assert not f.check(1000.0) and f.check(600.0)
    assert f.known() == (-INF, INF)   # outside [400,600] on both sides is possible
    f.recenter(450.0)
    assert f.known() == (400.0, 600.0)


def test_false_positive_and_false_negative_filters_are_silent():
    fp = IntervalFilter()
    fp.set_filter(INF, [(-INF, INF)], 1)
    fp.recenter(5.0)
    fn = IntervalFilter()
    fn.set_filter(INF, [(INF, INF)], 1)
    fn.recenter(5.0)
    for v in (-1e9, 0.0, 5.0, 1e9):
        assert not fp.check(v) and not fn.check(v)
    assert fp.silent() and fn.silent()
    assert membership([(-INF, INF), (INF, INF)], 3.0) == 1


def test_explicit_bound_and_bad_bound():
    f = IntervalFilter(width=2.0)
    f.recenter(0.0)
    f.set_bound(5.0, 9.0, 3)
    assert (f.lo, f.hi, f.width, f.epoch) == (5.0, 9.0, 4.0, 3)
    assert f.check(0.0) and not f.check(6.0)
    raises(ValueError, f.set_bound, 2.0, 1.0, 4)


def _walk(seed, steps):
    r = Rng(seed)
    dev = IntervalFilter(width=r.uniform(0, 8))
    mirror = IntervalFilter(width=dev.width)
    v = r.uniform(-50, 50)
    epoch = 0
    for step in range(steps):
        op = r.below(20)
        if op == 0:
            s = r.uniform(0, 0.5)
            dev.shrink(s)
            mirror.shrink(s)
        elif op == 1:
            epoch += 1
            w = r.uniform(0, 10)
            dev.set_width(w, epoch)
            mirror.set_width(w, epoch)
        elif op == 2:
            epoch += 1
            l = r.uniform(-60, 40)
            cons = [(l, l + r.uniform(0, 40))]
            if r.below(4) == 0:
                cons.append(r.choice([(-INF, INF), (INF, INF)]))
            w = r.choice([INF, r.uniform(0, 10)])
            dev.set_filter(w, cons, epoch)
            mirror.set_filter(w, cons, epoch)
            if dev.check(v):           # the device re-checks after an assignment
                dev.recenter(v)
                mirror.recenter(v)
        else:
            v += r.uniform(-3, 3)
        if dev.check(v):
            dev.recenter(v)
            mirror.recenter(v)       # the only thing the backend learns
        lo, hi = mirror.known()
        assert lo <= v <= hi, (seed, step, v, lo, hi)
        assert (mirror.lo, mirror.hi) == (dev.lo, dev.hi)


def test_mirror_always_contains_truth_on_every_prefix():
    for seed in range(40):
        _walk(seed, 400)
