"""hCount sketch and eFreq output (Zhang et al. 2005 §4.1, after Jin et al. 2003): h×m counters, minimum estimate.

``HCount(h, m, seed)`` keeps an h×m array S; an arriving item k adds one to ``S[i][H_i(k)]`` for
every row i, and ``estimate(k) = min_i S[i][H_i(k)]`` never underestimates the true count f(k).
With pairwise-independent hashes, each row overestimates by more than ``e·N/m`` with probability at
most ``1/e`` (Markov), so ``estimate(k) <= f(k) + e·N/m`` with probability at least ``1 - e^-h``
(``bound()``). ``frequent(lo, hi, support)`` is eFreq: the items k of the domain [lo, hi] with
``estimate(k) >= support·N``. Hashing is ``((a·k + b) mod P) mod m`` with P = 2^31 - 1 and integer
coefficients drawn from a xorshift32 stream of the seed: identical on MicroPython and CPython.
Portable: no typing, no numpy.
"""
import math

P = 2147483647          # Mersenne prime 2^31 - 1; items are integers in 0..P-1
MAX_ITEM = P - 1


def coefficients(seed, h):
    """h pairs (a, b), 1 <= a < P, 0 <= b < P, from a xorshift32 stream seeded by ``seed``."""
    s = (seed * 2654435761 + 1) & 0xFFFFFFFF or 1
    out = []
    while len(out) < h:
        pair = []
        while len(pair) < 2:
            s ^= (s << 13) & 0xFFFFFFFF
            s ^= s >> 17
            s ^= (s << 5) & 0xFFFFFFFF
            v = s & 0x7FFFFFFF
            if v < P and (v > 0 or pair):
                pair.append(v)
        out.append((pair[0], pair[1]))
    return out


def check_item(k):
    """Raise ValueError unless ``k`` is an item the sketch can hash (an integer in 0..P-1)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0 or k > MAX_ITEM:
        raise ValueError("items must be integers in 0..%d, got %r" % (MAX_ITEM, k))


class HCount:
    def __init__(self, h=30, m=30, seed=1):
        for name, v in (("h", h), ("m", m), ("seed", seed)):
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "seed" else 1):
                raise ValueError("hCount %s must be a positive integer, got %r" % (name, v))
        self.h = h
        self.m = m
        self.ab = coefficients(seed, h)
        self.rows = [[0] * m for _ in range(h)]
        self.n = 0                  # N: items counted since the last clear

    def cells(self, k):
        """The cell index of ``k`` in every row: [H_0(k), ..., H_{h-1}(k)]."""
        m = self.m
        return [((a * k + b) % P) % m for a, b in self.ab]

    def add(self, k, c=1):
        check_item(k)
        m = self.m
        rows = self.rows
        i = 0
        for a, b in self.ab:
            rows[i][((a * k + b) % P) % m] += c
            i += 1
        self.n += c

    def estimate(self, k):
        """F(k) = min_i S[i][H_i(k)] >= f(k)."""
        check_item(k)
        m = self.m
        rows = self.rows
        best = self.n
        i = 0
        for a, b in self.ab:
            v = rows[i][((a * k + b) % P) % m]
            if v < best:
                best = v
            i += 1
        return best

    def clear(self):
        for row in self.rows:
            for j in range(self.m):
                row[j] = 0
        self.n = 0

    def bound(self):
        """(additive error e·N/m, probability 1 - e^-h that a given estimate stays within it)."""
        return math.e * self.n / self.m, 1.0 - math.exp(-self.h)

    def frequent(self, lo, hi, support, cap=None):
        """eFreq over the domain lo..hi: [(k, F(k))] with F(k) >= support·N, largest first, at most ``cap``."""
        if not (0.0 <= support <= 1.0):
            raise ValueError("support must be in [0, 1], got %r" % (support,))
        check_item(lo)
        check_item(hi)
        thr = support * self.n
        m = self.m
        rows = self.rows
        ab = self.ab
        h = self.h
        out = []
        for k in range(lo, hi + 1):
            best = self.n
            i = 0
            while i < h:
                a, b = ab[i]
                v = rows[i][((a * k + b) % P) % m]
                if v < thr:
                    break
                if v < best:
                    best = v
                i += 1
            if i == h and best > 0:
                out.append((best, k))
        out.sort(key=lambda e: (-e[0], e[1]))
        if cap is not None:
            out = out[:cap]
        return [(k, f) for f, k in out]
