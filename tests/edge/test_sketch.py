"""hCount/eFreq against an exact counter: never under, within e·N/m with probability 1 - e^-h, same hashes everywhere."""
import math

from edge.core.sketch import HCount, coefficients, P
from portable import Rng, raises


def zipf_stream(seed, n, domain, skew=1.0):
    """n items of 1..domain with P(rank i) ~ 1/i^skew, ranks shuffled over the domain."""
    rng = Rng(seed)
    cum = []
    tot = 0.0
    for i in range(1, domain + 1):
        tot += 1.0 / i ** skew
        cum.append(tot)
    perm = list(range(1, domain + 1))
    for i in range(domain - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    out = []
    for _ in range(n):
        u = rng.random() * tot
        lo, hi = 0, domain - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cum[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        out.append(perm[lo])
    return out


def counts(items):
    c = {}
    for k in items:
        c[k] = c.get(k, 0) + 1
    return c


def bound_misses(sk, exact, domain):
    """(underestimates, keys over the e·N/m bound) of sketch ``sk`` against exact counts over 1..domain."""
    eps, _ = sk.bound()
    under = over = 0
    for k in range(1, domain + 1):
        f = exact.get(k, 0)
        F = sk.estimate(k)
        if F < f:
            under += 1
        if F > f + eps:
            over += 1
    return under, over


def test_hashes_are_the_same_on_every_interpreter():
    # values computed once on CPython; MicroPython must reproduce them bit for bit
    assert coefficients(1, 3) == [(1361127282, 1277488949), (1770954068, 2125219974), (2807896, 1058475208)]
    s = HCount(3, 7, 1)
    assert s.cells(12345) == [5, 1, 5] and s.cells(0) == [2, 3, 0] and s.cells(P - 1) == [6, 1, 0]


def test_never_underestimates_and_stays_within_bound_with_stated_probability():
    domain = 400
    for seed in (1, 2, 3):
        items = zipf_stream(seed, 3000, domain)
        exact = counts(items)
        sk = HCount(h=2, m=40, seed=seed)
        for k in items:
            sk.add(k)
        assert sk.n == len(items)
        under, over = bound_misses(sk, exact, domain)
        _, prob = sk.bound()
        assert under == 0
        assert over <= (1 - prob) * domain, (over, domain)     # at most e^-2 of the keys miss


def test_checker_catches_a_broken_sketch():
    items = zipf_stream(4, 2000, 300)
    exact = counts(items)
    sk = HCount(h=3, m=40, seed=4)
    sk.ab = [(0, 7)] * 3              # every key hashes to one cell: estimates become N
    for k in items:
        sk.add(k)
    under, over = bound_misses(sk, exact, 300)
    assert over > 0.9 * 300
    sk2 = HCount(h=3, m=40, seed=4)
    for k in items:
        sk2.add(k)
    for row in sk2.rows:              # halve counters: estimates undercount
        for j in range(len(row)):
            row[j] //= 2
    assert bound_misses(sk2, exact, 300)[0] > 0


def test_efreq_finds_every_frequent_item_and_respects_the_cap():
    items = zipf_stream(5, 5000, 1000)
    exact = counts(items)
    sk = HCount(h=4, m=60, seed=9)
    for k in items:
        sk.add(k)
    support = 0.01
    got = sk.frequent(1, 1000, support)
    keys = [k for k, _ in got]
    for k, f in exact.items():
        if f >= support * len(items):
            assert k in keys                       # no false negatives: F(k) >= f(k)
    for k, F in got:
        assert F >= support * len(items) and F == sk.estimate(k)
    assert [F for _, F in got] == sorted([F for _, F in got], reverse=True)
    top = sk.frequent(1, 1000, support, cap=3)
    assert top == got[:3]
    sk.clear()
    assert sk.n == 0 and sk.frequent(1, 1000, support) == []


def test_bad_input_is_rejected_clearly():
    raises(ValueError, HCount, 0, 10)
    raises(ValueError, HCount, 3, -1)
    sk = HCount(2, 5)
    raises(ValueError, sk.add, -1)
    raises(ValueError, sk.add, P)
    raises(ValueError, sk.add, 1.5)
    raises(ValueError, sk.estimate, "a")
    raises(ValueError, sk.frequent, 0, 10, 1.5)
    eps, prob = sk.bound()
    assert eps == 0 and abs(prob - (1 - math.exp(-2))) < 1e-12
