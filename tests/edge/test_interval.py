"""Interval filter: report rule, shrink re-check, constraints; a mirror fed only reports always holds the truth.

The float32 oracle is independent of the class: software float32 (exact rationals rounded to 24
bits, ties to even) recomputes every bound a single-precision device holds, and exact rational
arithmetic gives the bound the backend meant.
"""
import struct

from edge.core.float32 import f32, step as f32_step
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


def test_mirror_always_contains_truth_on_every_prefix():
    for seed in range(40):
        _walk(seed, 400)


# -- exact rationals (num, den > 0) and software float32 -----------------------------------------
def _bits(n):
    return len(bin(abs(n))) - 2


def exact(x):
    """The double ``x`` as an exact rational."""
    b = struct.unpack("<Q", struct.pack("<d", x))[0]
    e = (b >> 52) & 0x7FF
    m = b & ((1 << 52) - 1)
    if e:
        m |= 1 << 52
    else:
        e = 1
    e -= 1075
    n = -m if b >> 63 else m
    return (n << e, 1) if e >= 0 else (n, 1 << -e)


def _add(a, b):
    return (a[0] * b[1] + b[0] * a[1], a[1] * b[1])


def _neg(a):
    return (-a[0], a[1])


def _mul(a, b):
    return (a[0] * b[0], a[1] * b[1])


def _le(a, b):
    return a[0] * b[1] <= b[0] * a[1]


def rnd24(q):
    """Nearest float32 to the rational ``q`` (normal range, ties to even), as a rational."""
    n, d = q
    if n == 0:
        return (0, 1)
    sign = -1 if n < 0 else 1
    n = abs(n)
    e = _bits(n) - _bits(d) - 24
    num, den = (n, d << e) if e >= 0 else (n << -e, d)
    while num >= den << 24:
        den <<= 1
        e += 1
    while num < den << 23:
        num <<= 1
        e -= 1
    m, rem = divmod(num, den)
    if 2 * rem > den or (2 * rem == den and m & 1):
        m += 1
    return (sign * m << e, 1) if e >= 0 else (sign * m, 1 << -e)


def _float(q):
    return q[0] / q[1]


def _oracle_walk(seed, steps):
    """A float32 device filter against software float32 and exact rationals; the backend's padded
    float32 mirror (fed the backend's doubles) must contain the device's bound at every step, and
    an unpadded double mirror (the backend before devices declared their precision) must not."""
    r = Rng(seed)
    w = r.uniform(0.001, 8)
    dev = IntervalFilter(w, rnd=f32)
    mirror = IntervalFilter(w, rnd=f32, pad=True)
    naive = IntervalFilter(w)
    W = rnd24(exact(w))                 # the device's width, by software float32
    meant = exact(w)                    # the backend's width, exactly
    v = r.uniform(-1e4, 1e4)
    c = None
    narrower = 0
    for step in range(steps):
        op = r.below(12)
        if op == 0:
            s = r.uniform(0, 0.3)
            for f in (dev, mirror, naive):
                f.shrink(s)
            W = rnd24(_mul(W, rnd24(_add((1, 1), _neg(rnd24(exact(s)))))))
            meant = _mul(meant, _add((1, 1), _neg(exact(s))))
        elif op == 1:
            w = r.uniform(0.001, 8)
            for f in (dev, mirror, naive):
                f.set_width(w, step)
            W, meant = rnd24(exact(w)), exact(w)
        else:
            v += r.uniform(-3, 3) * r.choice([1, 1e-3, 1e3])
        x = f32(v)                      # a single-precision reading
        if c is None or dev.check(x):
            c = rnd24(exact(x))
            for f in (dev, mirror, naive):
                f.recenter(x)           # the report: the backend learns the float32 value exactly
        half = (W[0], W[1] * 2)
        lo, hi = rnd24(_add(c, _neg(half))), rnd24(_add(c, half))
        assert (dev.lo, dev.hi) == (_float(lo), _float(hi)), (seed, step)
        # the device's decision differs from the exact one only within float32 rounding of the edge
        mhalf = (meant[0], meant[1] * 2)
        e_lo, e_hi = _add(c, _neg(mhalf)), _add(c, mhalf)
        inside = _le(e_lo, exact(x)) and _le(exact(x), e_hi)
        if inside != (dev.lo <= x <= dev.hi):
            tol = (abs(_float(c)) + _float(meant) + 1e-30) * 2.0 ** -20 * (step + 2)
            assert min(abs(x - _float(e_lo)), abs(x - _float(e_hi))) <= tol, (seed, step)
        klo, khi = mirror.known()
        assert klo <= f32_step(dev.lo, False) and f32_step(dev.hi, True) <= khi, (seed, step)
        if naive.lo > dev.lo or naive.hi < dev.hi:
            narrower += 1
    return narrower


def test_float32_device_matches_software_float32_and_the_padded_mirror_contains_it():
    narrower = 0
    for seed in range(30):
        narrower += _oracle_walk(seed, 300)
    if 1.0 + 2.0 ** -30 != 1.0:         # where floats are doubles: a double mirror claims less than the device holds
        assert narrower > 0
