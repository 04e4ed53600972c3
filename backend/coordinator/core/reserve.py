"""The precision a query keeps in reserve for clock skew (DESIGN.md §4 precision under delay and skew), measured.

While a report's instant is uncertain (the bounds of its device clock, ``offsets.py``) its source states
the hull of its bound before the report and the reported value (the whole new band without the device's
guard): an answer then is wider than the widths allocated to its sources. Per query the coordinator
measures how far each of its interval answers reaches past δ − R (R its reserve, 0 at first):
X = width − (δ − R), counted per answer change (what a user sees; an uncertain window makes a change of
its own however short it is) into BINS bins over [0, δ], the last two epochs (an epoch ends after EPOCH s
or COUNT changes, so a new query learns fast). The provisional answers and the final ones (``finals.py``)
are two streams, measured apart: a final answer holds the hull (the live mirror's: a guarded report's is its
bound before and its value) over each report's whole uncertain window, for every source whose window overlaps,
so several sources' windows add up in the finals more often than in the provisional answers at arrival. At the
end of a stream's epoch its R rises to X's quantile over the last two epochs when that is more than STEP·δ above
it, and falls to X's quantile over the last DROPS epochs when that is more than STEP·δ below it (QUANTILE of
either stream; the finals' R keeps a margin above it, below); the query's reserve is the larger of its streams'
(every answer a user gets is budgeted), and the protocols allocate δ − R (``Query.budget``, ``precision/rows.py``,
``aggregate.uniform_width``): an answer is wider than δ (and degraded, saying so) only for the rest. A query's
first provisional epoch ends after FIRST changes already, so it learns from its first uncertain reports.
- **Measured against the widths in force** (``widths``): a rise of R narrows every width, and until the devices
  confirm the narrowings their old mirrors stay in the hull, so the answers reach past the new δ − R by the rise
  itself. Measured against the new R that fed back (one rise measured as the next: R went 9 → 32 of δ = 60 in
  20 s, only in the run whose rule was narrowing at the time, so adaptive paid ~600 messages deadband did not).
  X is taken against the R the widths held at the answer's event time: a rise counts from the first provisional
  answer after it with no narrowing unconfirmed (or SETTLE s on), a drop (widenings, in force at once) from the
  first provisional answer after it (a final answer's time is in the past: the move is in the widths from now).
- **Finals: a prior and a margin.** Until the finals' first epoch ends (a full one: COUNT changes or EPOCH s) a
  query whose finals are budgeted keeps PRIOR·δ (``begin``): while the clock bounds are still loose the excess is
  largest (X up to 10 of δ = 60 in the first 20 s, ~5 after), and 32 changes did not show it (54-93 wide finals
  per run in the first 100 s). The finals' R is their QUANTILE excess plus MARGIN·δ: no sample is a bound.
  Devices that sample on a common clock report together: a final answer
  just after such an instant holds the overshoot past its bound of every source that reported then (up to its
  step), so its excess is a sum over the sources that crossed together, and its only sure bound is the sum of
  every source's step (~38 of δ = 60 on the FINAL workload, 20 walks stepping up to 2). Two epochs are ~30 s of
  finals (they change ~17 times a second): with MARGIN δ/32 a burst 2-8 above the sample's largest made 3-29
  wide finals per dev run (seeds 7, 1003, 1004); δ/16 made none, for 4-7 % more messages over five dev seeds
  (both protocols alike). What is still past δ is degraded, saying its width (``lines.Lines.line``).
- **The finals' quantile, not their largest.** R was their largest excess plus the margin: a heavy tail's largest
  sample, which one run's finals reach and another's miss (FINAL seed 3002 with the faults: adaptive's largest 8.45
  at 78 s and 11.29 at 94 s, deadband's 7.38 over the whole run, so adaptive's R rose 10.31 → 13.12 → 15.94 of
  δ = 60 and deadband's stayed: +3,857 messages; their 99th percentiles were 6.00 and 6.05). The 99th percentile
  of two epochs (512 changes) is about their sixth largest, and moves little between runs; the margin still covers
  the rest: on the 26 dev runs (FINAL seeds 7, 1001-1004, 3001-3008, the faults and the skew alone) and the 36
  of 5001-5006 on six networks, as many finals wider than δ as with the largest (none but one run's 9e-5 of
  records, stated), adaptive − deadband at most +18 but ack traffic on the 26 (was +1,704), and 1.3-1.9 % fewer
  messages per set (deadband at skew 0.3 alone up to 15 %: seed 3001, 16,768 → 14,992). Held out (8001-8006 on
  six networks): pairs past the loan 9 → 7 of 36; finals wider than δ on 3 runs of 72, 6e-5 of records, stated.
- **Slow to fall, so that every protocol gets the same R.** Each run learns R from its own answers, and the finals'
  R was then a heavy tail's largest sample (above): on the FINAL workload with skew alone (no loss: deterministic
  runs) the largest excess per 30 s of finals ranged 6.9-10.0 in one run, so R went up and down between 11.25 and 15
  of δ = 60 at different times in adaptive's and deadband's runs (main at 37da0e2: 10 of 31 dev seeds' reserves
  moved differently, 8 of them first in the finals; adaptive − deadband up to +189 messages on seed 1018 against a
  loan of 20, held-out +95, while adaptive's own ledger against its metered deadband shadow, same R, stayed within
  it). A drop measured over DROPS epochs (~2 min of finals) stops most of that sawtooth: both runs' reserves moved
  alike on 28 of the 31 seeds (the 3 others: adaptive −180 to −2,488), adaptive − deadband ≤ +18 on all 31, for
  +1.6-1.7 % messages (R stays up after a burst), both protocols alike. A rise still takes two epochs: a final
  answer wider than δ is what R is for. Not solved: the runs' answers still differ (adaptive's finals' excess was
  heavier with loss: dev 1014, 99th percentile 8.6 against 7.9), so one run's R can rise where the other's does not
  (with the simulator's paired draws, held-out 2001 with skew alone +142), and R keeps a state: it moves only by
  more than STEP·δ from where it is, so where it is depends on the run's past. Dev 1011, skew alone: one burst at
  t ≈ 100 s (excess 15 in adaptive's finals, 24 in deadband's) left deadband's R at 12.19 from 248 s on, every later
  measure (11.25-14.06) within its ±δ/32, and adaptive's at 11.25 from 370 s, from which the same measures moved it
  six times between 11.25 and 14.06: +716 messages; adaptive replaying deadband's moves: −21 (test_reserve_drops),
  so a shared R is all the promise needs (with the finals' quantile both learn 11.25: −21). A rule without that
  state (R the larger of the two- and the DROPS-epoch measure, on a δ/32 lattice) made 1011 −1 but chattered between
  lattice levels at different times in each run (dev 1006 with the faults −6 → +199) and let a rise feed on itself
  (a higher R narrows the widths, more walks step past half their width each reading and the overshoots they sum
  grow: 1018 adaptive 15 → 28 of δ = 60, +453 at 900 s): not kept. An R both runs share needs an excess measured on
  something both share: the deadband shadow's would-be answers (each metered device knows its shadow's overshoot at
  each would-be report, but not which other sources' windows overlap it).
- **At most CAP·δ.** The excess is what sources move within their reports' uncertain windows, which narrower
  widths do not shrink: they add reports, so more windows overlap. Where the clocks are known worse than the
  signals need (the live demo's QEMU micro:bits behind a serial gateway on a loaded 2-core machine: their AVG's
  finals 0.4-1.36 wide at any width, δ = 1) R rose to δ and the widths to 0, every reading reported, for answers
  no narrower; the live deadband demo sent 4.3x its offline replay. Past δ/2 the rest is stated (``Lines.line``:
  wider than precision, with its width), not bought.
Where clocks are exact (σ = 0) nothing reaches past δ − R and no prior is kept, so R stays 0 and widths are the
protocols' own.
"""
EPOCH = 60.0            # s of event time per measurement epoch at most
COUNT = 256             # answer changes per epoch at most
BINS = 64               # histogram bins over [0, δ]
QUANTILE = 0.99         # of a stream's answer changes whose excess stays within R (the finals': with the margin)
STEP = 1.0 / 32         # R moves only by more than this share of δ
FIRST = 32              # answer changes in a query's first epoch
PRIOR = 1.0 / 4         # of δ the finals keep before their first epoch ends, where clocks may be off
MARGIN = 1.0 / 16       # of δ the finals' R keeps above the QUANTILE excess they measured
DROPS = 8               # epochs a drop of R is measured over (a rise: the last two)
SETTLE = 10.0           # s after a rise at most until the widths are taken as narrowed (their narrowings confirmed)
CAP = 0.5               # of δ at most: past it the excess is the clocks', which narrower widths do not reduce


class Reserve:
    def __init__(self):
        self.q = {}             # (query id, final) -> [changes this epoch, current epoch bins, previous bins, epoch end]
        self.value = {}         # (query id, final) -> R of that stream
        self.held = {}          # query id -> [(from event time, the R the widths in force leave)], newest last
        self.rise = {}          # query id -> [event time, rose, R] of a move not yet in the widths (rose: narrowings)
        self.stats = {"moves": 0}

    def begin(self, q, on):
        """Query ``q`` is registered; ``on``: its final answers are budgeted (clocks may be off): until its
        finals' first epoch ends they keep the prior."""
        if on and (q.id, True) not in self.value:
            self.value[(q.id, True)] = PRIOR * q.precision
            self._held(q.id, -float("inf"), PRIOR * q.precision)

    def get(self, qid):
        return max(self.value.get((qid, False), 0.0), self.value.get((qid, True), 0.0))

    def observe(self, q, t, width, final=False):
        """Query ``q``'s interval answer (``final`` or provisional) from event time ``t`` has ``width`` (inf:
        none); True when its reserve moved (the caller re-plans the widths)."""
        sk = (q.id, final)
        st = self.q.get(sk)
        if st is None:
            st = self.q[sk] = [0 if final else COUNT - FIRST, [0] * (BINS + 1), [], t + EPOCH]
        d = q.precision
        x = width - (d - self.widths(q.id, t))
        if d > 0 and x == x and width != float("inf"):
            st[1][0 if x <= 0 else min(BINS, 1 + int(x / d * BINS))] += 1
            st[0] += 1
        if st[0] < COUNT and t < st[3]:
            return False
        st[2].append(st[1])
        del st[2][:-DROPS]
        st[0], st[1], st[3] = 0, [0] * (BINS + 1), t + EPOCH
        r, now = self._quantile(st[2][-2:], d, final), self.value.get(sk, 0.0)
        if r is None:
            return False
        if r <= now + STEP * d:         # a rise: the last two epochs; a drop: all DROPS of them
            r = self._quantile(st[2], d, final)
            if r >= now - STEP * d:
                return False
        was = self.get(q.id)
        self.value[sk] = r
        if self.get(q.id) == was:
            return False        # (the other stream's reserve is the larger)
        self.stats["moves"] += 1
        self.rise[q.id] = [None, self.get(q.id) > was, self.get(q.id)]    # (from the next provisional answer:
        return True         # a final answer's time is in the past, the widths move now)

    @staticmethod
    def _quantile(epochs, d, final):
        """The R the histograms ``epochs`` of a stream give (None: nothing measured)."""
        hist = [sum(col) for col in zip(*epochs)]
        total = sum(hist)
        if not total:
            return None
        acc, k = 0, 0
        share = QUANTILE * total
        while k < BINS and acc + hist[k] < share:
            acc += hist[k]
            k += 1
        return min(CAP * d, k * d / BINS + (MARGIN * d if final else 0.0))

    def widths(self, qid, t):
        """The R the widths in force at event time ``t`` leave of δ (a final answer is for a time in the past:
        the widths then are what it is measured against)."""
        r = self.get(qid)
        for at, v in reversed(self.held.get(qid, ())):
            if at <= t:
                return min(r, v)
        return 0.0

    def pending(self, qid):
        return qid in self.rise

    def settled(self, qid, t, narrowing):
        """A provisional answer of query ``qid`` at event time ``t`` after its R moved: ``narrowing`` whether a
        narrowing of its sources is still unconfirmed. A drop's R is in the widths at once (widenings are), a
        rise's once no narrowing is unconfirmed (or SETTLE s after the first such answer)."""
        m = self.rise[qid]
        if m[0] is None:
            m[0] = t
        if not (m[1] and narrowing) or t >= m[0] + SETTLE:
            del self.rise[qid]
            self._held(qid, t, m[2])

    def _held(self, qid, t, r):
        h = self.held.setdefault(qid, [])
        h.append((t, r))
        if len(h) > 8:
            del h[0]

    def drop(self, qid):
        self.held.pop(qid, None)
        self.rise.pop(qid, None)
        for final in (False, True):
            self.q.pop((qid, final), None)
            self.value.pop((qid, final), None)
