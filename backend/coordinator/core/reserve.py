"""The precision a query keeps in reserve for clock skew (DESIGN.md §4 precision under delay and skew), measured.

While a report's instant is uncertain (the bounds of its device clock, ``offsets.py``) its source states
the hull of its bound before the report and the reported value (the whole new band without the device's
guard): an answer then is wider than the widths allocated to its sources. Per query the coordinator
measures how far each of its interval answers reaches past δ − R (R its reserve, 0 at first):
X = width − (δ − R), counted per answer change (what a user sees; an uncertain window makes a change of
its own however short it is) into BINS bins over [0, δ], the last two epochs. Epochs are the stretches of
event time between multiples of EPOCH s, the same whatever the protocol and the driver: R moves only at
their ends, so two protocols on the same data measure over the same stretches and move R alike (epochs
ended after COUNT = 256 changes too, at instants each protocol's own report count set: on the [final]
workload at skew 0.3, R flipped between 22.5 and 25.3 of δ = 60 at different times in the adaptive run
and deadband's, 4-9 flips more in one than the other, each a width control to every source of the SUM,
and adaptive sent 300-400 messages more than deadband on two of three seeds). The provisional answers and the final ones (``finals.py``)
are two streams, measured apart: a final answer holds the hull over each report's whole uncertain window,
for every source whose window overlaps, so several sources' windows add up in the finals more often than
in the provisional answers at arrival. At the end of a stream's epoch its R becomes X's QUANTILE when that
moved by more than STEP·δ; the query's reserve is the larger of its streams' (every answer a user gets
is budgeted), and the protocols allocate δ − R (``Query.budget``, ``precision/rows.py``,
``aggregate.uniform_width``): an answer is wider than δ (and degraded, saying so) only for the rest. A
query's first epoch ends sooner, at the first multiple of EPOCH / 8 s by which it has FIRST changes (at the
latest at the next multiple of EPOCH), so it learns from its first uncertain reports, at instants every protocol
shares too.
Where clocks are exact nothing reaches past δ − R, so R stays 0 and widths are the protocols' own.
"""
EPOCH = 60.0            # s of event time per measurement epoch (a query's first one may end sooner)
SHORT = EPOCH / 8       # s: where a query's first epoch may end
BINS = 64               # histogram bins over [0, δ]
QUANTILE = 0.99         # of the answer changes whose excess stays within R
STEP = 1.0 / 32         # R moves only by more than this share of δ
FIRST = 32              # answer changes in a query's first epoch


class Reserve:
    def __init__(self):
        # (query id, final) -> [changes the first epoch still needs, current epoch bins, previous bins, the epoch's
        # next possible end, its latest end]
        self.q = {}
        self.value = {}         # (query id, final) -> R of that stream
        self.stats = {"moves": 0}

    def get(self, qid):
        return max(self.value.get((qid, False), 0.0), self.value.get((qid, True), 0.0))

    def observe(self, q, t, width, final=False):
        """Query ``q``'s interval answer (``final`` or provisional) from event time ``t`` has ``width`` (inf:
        none); True when its reserve moved (the caller re-plans the widths)."""
        sk = (q.id, final)
        st = self.q.get(sk)
        if st is None:
            st = self.q[sk] = [FIRST, [0] * (BINS + 1), [0] * (BINS + 1), _grid(t, SHORT), _grid(t, EPOCH)]
        d = q.precision
        x = width - (d - self.get(q.id))
        if d > 0 and x == x and width != float("inf"):
            st[1][0 if x <= 0 else min(BINS, 1 + int(x / d * BINS))] += 1
            st[0] -= 1
        if t < st[3]:
            return False
        if st[0] > 0 and t < st[4]:     # a first epoch with too few changes yet
            st[3] = _grid(t, SHORT)
            return False
        hist = [a + b for a, b in zip(st[1], st[2])]
        st[0], st[2], st[1], st[3] = 0, st[1], [0] * (BINS + 1), _grid(t, EPOCH)
        st[4] = st[3]
        total = sum(hist)
        if not total:
            return False
        acc, k = 0, 0
        while k < BINS and acc + hist[k] < QUANTILE * total:
            acc += hist[k]
            k += 1
        r = k * d / BINS
        if abs(r - self.value.get(sk, 0.0)) <= STEP * d:
            return False
        was = self.get(q.id)
        self.value[sk] = r
        if self.get(q.id) == was:
            return False        # (the other stream's reserve is the larger)
        self.stats["moves"] += 1
        return True

    def drop(self, qid):
        for final in (False, True):
            self.q.pop((qid, final), None)
            self.value.pop((qid, final), None)


def _grid(t, every):
    """The next multiple of ``every`` after event time ``t``."""
    return (t // every + 1) * every
