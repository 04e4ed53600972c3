"""SWAT tree against a brute-force Haar reference on every prefix (Bulut & Singh 2003 §2.3-2.6).

Portable: runs under pytest and under MicroPython (tests/edge/mp_runner.py).
"""
from portable import Rng, raises
from edge.core import swat
from edge.core.swat import Swat, haar
from edge.core.swat_asr import pack_segments, unpack_segments

EPS = 1e-9


def close(a, b):
    return abs(a - b) <= EPS * (1 + abs(a) + abs(b))


def check_tree(sw, hist):
    """Every problem of ``sw`` against the exact history (hist[j] = reading number j+1)."""
    bad = []
    c = len(hist)
    fresh = {}
    for l, p, node in sw.each():
        first, last = sw.span(l, node)
        # drift: a level-l node is refreshed every 2^l readings
        drift = first - (0 if p == swat.R else (1 << l) if p == swat.S else (2 << l))
        if not 0 <= drift < (1 << l):
            bad.append("L%d/%d drifted %d" % (l, p, drift))
            continue
        if last >= c:
            bad.append("L%d/%d covers readings not seen" % (l, p))
            continue
        seg = [hist[c - 1 - i] for i in range(first, last + 1)]      # newest first
        if node[1] != min(seg) or node[2] != max(seg):
            bad.append("L%d/%d bounds" % (l, p))
        exact = haar(seg)
        got = sw.coefficients(node)
        if len(got) != min(sw.k, len(seg)) or not all(close(got[j], exact[j]) for j in range(len(got))):
            bad.append("L%d/%d haar %r != %r" % (l, p, got, exact[:len(got)]))
        fresh[(l, p)] = drift
    n = sw.n
    if c >= 2 * sw.window:
        want = 3 * n - 2
        if len(fresh) != want:
            bad.append("%d nodes, want %d" % (len(fresh), want))
        for i in range(sw.window):
            if sw.cover(i) is None:
                bad.append("position %d uncovered" % i)
    if c % sw.window == 0 and c >= 2 * sw.window:
        # every level was just refreshed: R_l is the window's Haar approximation of its newest block
        full = haar([hist[c - 1 - i] for i in range(sw.window)])
        if not close(sw.coefficients(sw.nodes[n - 1][swat.R])[0], full[0]):
            bad.append("top average differs from the window's Haar average")
    return bad


def brute_point(sw, hist, i, min_level=0):
    """Reference reconstruction: first covering node in (level, R->S->L) order, its sub-block mean."""
    c = len(hist)
    for floor in (min_level, 0):
        for l, p, node in sw.each():
            if l < floor:
                continue
            first, last = sw.span(l, node)
            if first <= i <= last:
                m = len(node) - 3
                blk = (2 << l) // m
                s = first + ((i - first) // blk) * blk
                vals = [hist[c - 1 - j] for j in range(s, s + blk)]
                seg = [hist[c - 1 - j] for j in range(first, last + 1)]
                return sum(vals) / blk, min(seg), max(seg)
    return None


def _stream(seed, n, kind):
    rng = Rng(seed)
    out = []
    v = 50.0
    for _ in range(n):
        if kind == 0:
            v += rng.uniform(-1, 1)
        else:
            v = rng.uniform(0, 100)
        out.append(v)
    return out


def test_every_prefix_matches_haar_reference():
    for window, k, seed in ((4, 1, 1), (16, 1, 2), (16, 4, 3), (32, 2, 4)):
        sw = Swat(window, k)
        hist = []
        for v in _stream(seed, 3 * window + 7, seed % 2):
            sw.update(v)
            hist.append(v)
            bad = check_tree(sw, hist)
            assert not bad, (window, k, len(hist), bad[:3])


def test_checker_catches_broken_trees():
    class WrongOrder(Swat):
        def _combine(self, newer, older):
            return Swat._combine(self, older, newer)

    class NoShift(Swat):
        def _shift(self, l, node):
            self.nodes[l][swat.R] = node
            if self.nodes[l][swat.S] is None and l < self.n - 1:
                self.nodes[l][swat.S] = node
                self.nodes[l][swat.L] = node

    for cls in (WrongOrder, NoShift):
        sw = cls(16, 2)
        hist = []
        found = False
        for v in _stream(9, 60, 1):
            sw.update(v)
            hist.append(v)
            found = found or bool(check_tree(sw, hist))
        assert found, cls.__name__


def test_memory_is_logarithmic():
    for window in (4, 16, 64, 256, 1024, 4096):
        n = swat._log2(window)
        sw = Swat(window)
        rng = Rng(window)
        for _ in range(2 * window + 3):
            sw.update(rng.uniform(0, 10))
        nodes = len(list(sw.each()))
        assert nodes == 3 * n - 2, (window, nodes)
        assert sw.stored() <= 12 * n, (window, sw.stored())


def test_queries_match_reference_and_bound_the_truth():
    window = 32
    for k in (1, 2):
        sw = Swat(window, k)
        hist = []
        rng = Rng(11 + k)
        for step, v in enumerate(_stream(5 + k, 3 * window, 0)):
            sw.update(v)
            hist.append(v)
            if step < 2 * window or step % 3:
                continue
            c = len(hist)
            est, los, his = sw.window_values()
            for i in range(window):
                exact = hist[c - 1 - i]
                ref = brute_point(sw, hist, i)
                got = sw.point(i)
                assert close(got[0], ref[0]) and got[1] == ref[1] and got[2] == ref[2], (i, got, ref)
                assert got[1] <= exact <= got[2]
                assert est[i] == got[0] and los[i] == got[1] and his[i] == got[2]
            # coarser approximation A_j: only levels >= j where they cover
            for j in (1, 3):
                est_j = sw.window_values(j)[0]
                for i in range(window):
                    assert close(est_j[i], brute_point(sw, hist, i, j)[0])
                    assert close(sw.point(i, j)[0], est_j[i])
            # exponential and linear inner products over the newest M readings
            m = 1 + rng.below(window)
            pos = list(range(m))
            for ws in ([2.0 ** -j for j in pos], [(m - j) / m for j in pos], [(-1.0) ** j for j in pos]):
                e, lo, hi = sw.inner(pos, ws)
                exact = sum(ws[j] * hist[c - 1 - j] for j in pos)
                assert lo - EPS <= exact <= hi + EPS
                assert close(e, sum(ws[j] * est[j] for j in pos))
            # range query: sure <= exact <= possible
            p, r = rng.uniform(45, 55), rng.uniform(0.5, 3)
            first = rng.below(window)
            last = first + rng.below(window - first)
            approx, sure, maybe = sw.range_query(p, r, first, last)
            exact = [i for i in range(first, last + 1) if p - r <= hist[c - 1 - i] <= p + r]
            assert all(i in exact for i in sure) and all(i in maybe for i in exact)
            assert approx == [i for i in range(first, last + 1) if p - r <= est[i] <= p + r]


def test_segments_bound_their_readings():
    window = 16
    sw = Swat(window)
    hist = []
    for v in _stream(21, 80, 1):
        sw.update(v)
        hist.append(v)
        segs = sw.segments()
        c = len(hist)
        bounds = [(0, 1)] + [(1 << j, (2 << j) - 1) for j in range(1, sw.n)]
        for j, seg in enumerate(segs):
            a, b = bounds[j]
            if seg is None:
                assert c < 2 * window
                continue
            vals = [hist[c - 1 - i] for i in range(a, b + 1)]
            assert seg[0] <= min(vals) and max(vals) <= seg[1]
            assert seg[0] - EPS <= seg[2] <= seg[1] + EPS
        if c >= 2 * window:
            assert None not in segs


def test_blob_roundtrip_rounds_outward():
    rng = Rng(3)
    entries = []
    for j in range(6):
        lo = rng.uniform(-1e4, 1e4)
        entries.append((j, lo, lo + rng.uniform(0, 5) * 1.0000001, lo + 1.0))
    entries.append((6, 0.1, 0.1, 0.1))
    data = pack_segments(1234, entries)
    assert len(data) == 5 + 13 * len(entries)
    count, got = unpack_segments(data)
    assert count == 1234
    for (sid, lo, hi, _), (sid2, lo2, hi2, _) in zip(entries, got):
        assert sid == sid2 and lo2 <= lo and hi2 >= hi


def test_bad_input_is_refused():
    raises(ValueError, Swat, 12)
    raises(ValueError, Swat, 2)
    raises(ValueError, Swat, 16, 3)
    sw = Swat(8)
    raises(ValueError, sw.update, float("nan"))
    raises(ValueError, sw.update, float("inf"))
    raises(ValueError, sw.update, "7")
    assert sw.count == 0
    sw.update(1.0)
    assert sw.point(0) is None
    raises(ValueError, sw.cover, 8)
    raises(ValueError, sw.inner, [0], [])
    raises(ValueError, unpack_segments, b"\x00\x01")
    raises(ValueError, unpack_segments, pack_segments(1, [(0, 1.0, 2.0, 1.5)]) + b"x")
    raises(ValueError, unpack_segments, pack_segments(1, [(0, 3.0, 2.0, 2.5)]))
    raises(ValueError, haar, [1.0, 2.0, 3.0])
