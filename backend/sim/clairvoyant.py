"""The clairvoyant offline minimum of reports for one source under a fixed bound width.

Knowing the whole trace, a sender may place each bound anywhere; a bound of width W can cover a
run of readings exactly when their range (max − min) is at most W. Greedy segmentation — extend
the current run until its range would exceed W — yields the minimum number of runs (the classic
interval-stabbing exchange argument), i.e. the fewest reports any filter protocol could send.
"""


def minimum_reports(values, width):
    """Fewest reports that keep every reading of ``values`` (in time order) inside a bound of ``width``."""
    it = iter(values)
    try:
        first = next(it)
    except StopIteration:
        return 0
    count, lo, hi = 1, first, first
    for v in it:
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
        if hi - lo > width:
            count += 1
            lo = hi = v
    return count



def minimum_segments(times, values, width):
    """Fewest line segments, each covering a run of consecutive readings within ±width/2 of its line.

    The clairvoyant bound for a sender that reports lines instead of constants (swing/slide filters).
    Feasibility is hereditary (a line that fits a run fits every sub-run), so greedy — extend the current
    run while some line still fits — is optimal by the same exchange argument as ``minimum_reports``.
    A run fits iff the polygon of lines y = c + s·(t − t0) meeting every reading's band [v − h, v + h]
    is non-empty; it is kept exactly as a convex polygon in (c, s) and clipped by two half-planes per
    reading (O'Rourke 1981's on-line line fitting, done by polygon clipping)."""
    h = width / 2.0
    count = 0
    poly = None           # convex polygon [(c, s)] once the run spans two distinct times
    t0 = clo = chi = None
    for t, v in zip(times, values):
        if t0 is not None:
            if poly is None and t == t0:
                clo, chi = max(clo, v - h), min(chi, v + h)
                if clo <= chi:
                    continue
            else:
                d = t - t0
                if poly is None:
                    poly = [(clo, (v - h - clo) / d), (chi, (v - h - chi) / d),
                            (chi, (v + h - chi) / d), (clo, (v + h - clo) / d)]
                    continue
                poly = _clip(_clip(poly, d, v + h, 1.0), d, v - h, -1.0)
                if poly:
                    continue
        count += 1
        t0, clo, chi, poly = t, v - h, v + h, None
    return count


def _clip(poly, d, bound, sign):
    """The part of convex polygon ``poly`` where sign·(c + s·d) <= sign·bound (Sutherland–Hodgman)."""
    out = []
    n = len(poly)
    f = [sign * (c + s * d - bound) for c, s in poly]
    for i in range(n):
        j = (i + 1) % n
        if f[i] <= 0:
            out.append(poly[i])
        if (f[i] < 0 < f[j]) or (f[j] < 0 < f[i]):
            a = f[i] / (f[i] - f[j])
            (c1, s1), (c2, s2) = poly[i], poly[j]
            out.append((c1 + a * (c2 - c1), s1 + a * (s2 - s1)))
    return out
