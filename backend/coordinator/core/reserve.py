"""The precision a query keeps in reserve for clock skew (DESIGN.md §4 precision under delay and skew), measured.

While a report's instant is uncertain (the bounds of its device clock, ``offsets.py``) its source states
the hull of its bound before the report and the reported value (the whole new band without the device's
guard): an answer then is wider than the widths allocated to its sources. Per query the coordinator
measures how far each of its interval answers reaches past δ − R (R its reserve, 0 at first):
X = width − (δ − R), counted per answer change (what a user sees; an uncertain window makes a change of
its own however short it is) into BINS bins over [0, δ], the last two epochs (an epoch ends after EPOCH s
or COUNT changes, so a new query learns fast). The provisional answers and the final ones (``finals.py``)
are two streams, measured apart: a final answer holds the hull over each report's whole uncertain window,
for every source whose window overlaps, so several sources' windows add up in the finals more often than
in the provisional answers at arrival. At the end of a stream's epoch its R becomes X's QUANTILE when that
moved by more than STEP·δ; the query's reserve is the larger of its streams' (every answer a user gets
is budgeted), and the protocols allocate δ − R (``Query.budget``, ``precision/rows.py``,
``aggregate.uniform_width``): an answer is wider than δ (and degraded, saying so) only for the rest. A
query's first epoch ends after FIRST changes already, so it learns from its first uncertain reports.
Where clocks are exact nothing reaches past δ − R, so R stays 0 and widths are the protocols' own.
"""
EPOCH = 60.0            # s of event time per measurement epoch at most
COUNT = 256             # answer changes per epoch at most
BINS = 64               # histogram bins over [0, δ]
QUANTILE = 0.99         # of the answer changes whose excess stays within R
STEP = 1.0 / 32         # R moves only by more than this share of δ
FIRST = 32              # answer changes in a query's first epoch


class Reserve:
    def __init__(self):
        self.q = {}             # (query id, final) -> [changes this epoch, current epoch bins, previous bins, epoch end]
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
            st = self.q[sk] = [COUNT - FIRST, [0] * (BINS + 1), [0] * (BINS + 1), t + EPOCH]
        d = q.precision
        x = width - (d - self.get(q.id))
        if d > 0 and x == x and width != float("inf"):
            st[1][0 if x <= 0 else min(BINS, 1 + int(x / d * BINS))] += 1
            st[0] += 1
        if st[0] < COUNT and t < st[3]:
            return False
        hist = [a + b for a, b in zip(st[1], st[2])]
        st[0], st[2], st[1], st[3] = 0, st[1], [0] * (BINS + 1), t + EPOCH
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
