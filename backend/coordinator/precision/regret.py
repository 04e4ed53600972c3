"""Exact no-regret for the default adaptive rule (our extension of Olston et al. 2003 §1.2, §3.3): real against metered deadband.

Every metered device (edge.core.meter) runs, per source, the filter plain deadband would run there
(deadband's uniform width and range constraints, told in the controls flagged METER; a constant filter) on
the same readings, counts the reports it would have sent, and puts that count and its reading count in every
report. A device whose model chooser departs from deadband's filter on a source the backend did not move
guards that itself (``edge.core.meter.OWE`` reports beyond deadband's per source at most, summed since its
meter began): the ledger sees its reports and counts like any other's, so the guard below sees what they
lose (it may leave the moves less of the loan) but cannot stop it: the promise is the loan plus ``OWE`` per
source whose device departed.
The ``Ledger`` of a query group adds up, in messages weighted by the sources' costs:

- ``real``: what the adaptive rule really sends: its reports (those missing too, ``Guard.unseen``: the
  meters count deadband's lost alike) and its controls (the births, configs and anything else deadband sends
  alike are left out of both sides);
- ``dead``: what deadband would have sent: the metered reports, and its own controls (one each time its
  filter of a source changes, and the forced re-send after a birth).

Delivery traffic (edge.core.delivery, core/heartbeat.py: marks, the configs telling a new heartbeat B,
and on a lossy link acks, links and resends) is left out of both sides, as the meter leaves it out: it is
what the delivery guarantees cost whatever the filters, and deadband's own cannot be known exactly (its B
follows the arrivals of its own reports, its resends the losses its messages would meet), so counting only
the rule's would charge adaptive for the acks of its own reports with no credit. A quieter device proves
its silence with more marks (one per B of silence, B ≥ 4× its mean interval): measured apart, never guarded.
A metered report reordered behind a newer one of its source is not applied, but it was sent: real
(``superseded``; deadband's side has it in the newer report's count).

A source is ``off`` while its filter may differ from its shadow after a move or a MIN/MAX cut. A SYNC
control (a downlink and its acknowledgement) makes it its shadow's twin: from then on both report at the
same readings, so syncing every ``off`` source stops the difference from growing, for at most the
``reserve`` (two messages per ``off`` source, one per acknowledgement still to come). The guard
(``estimate.Estimated``) keeps gap + reserve + what may be in flight within the loan at every report and
every control, so the rule never sends more than deadband plus its loan at any prefix of a run.

A source in segment mode (core/segments.py) is outside the ledger (``_metered``, ``_leave``, ``_back``):
it keeps deadband's filter but for MIN/MAX cuts where they pay, its controls all flagged METER.

``Guard`` is that half of ``estimate.Estimated`` (a mixin): deadband's filter per source (``_home``), the
controls flagged METER and counted (``_install``), SYNC (``_sync``, ``_revert`` in two steps so that no row
holds more than its budget meanwhile), the settle after a query change, the loan and the trailing stop.
"""
import math

from edge.core import codec
from edge.core.codec import WHY_ASSIGN, WHY_SYNC
from backend.coordinator.core.protocol import range_constraints
from backend.coordinator.precision import deadband
from backend.coordinator.precision.rows import INF, _ROUNDING

_M16 = 0xFFFF


class Ledger:
    __slots__ = ("real", "dead", "counts", "off", "told", "acks", "reserve", "flow", "rebase", "unseen")

    def __init__(self):
        self.real = 0.0         # messages the rule really cost
        self.dead = 0.0         # messages deadband would have cost
        self.counts = {}        # key -> (n, k, boot): the device's counts at its latest report
        self.off = {}           # key -> cost: sources whose filter may differ from their shadow
        self.told = {}          # key -> deadband's filter (width, cons) as its device's meter was last told
        self.acks = {}          # key -> cost: acknowledgements of SYNCs and moves still to come
        self.reserve = 0.0      # what syncing every ``off`` source costs, plus the acknowledgements to come
        self.flow = {}          # key -> [readings, seconds, time of the latest report], decayed
        self.rebase = set()     # keys back from outside the ledger: their next report restarts their count
        self.unseen = {}        # device -> (costs of its missing uplinks to charge, those charged): ``missing``

    def gap(self):
        """real − deadband so far."""
        return self.real - self.dead

    def report(self, key, m, boot, cost, decay):
        """A metered report ``m`` of ``key`` from a device of ``boot``: the readings since the source's
        previous report (None when unknown: the first report of a meter)."""
        self.real += cost
        last = self.counts.get(key)
        fresh = last is None or last[2] != boot     # a meter counts from 0 (a reboot starts a new one)
        if key in self.rebase:      # a twin's report (``leave``): deadband's too
            self.rebase.discard(key)
            self.dead += cost
            last, fresh = None, True
        else:
            self.dead += cost * (m["n"] if fresh else (m["n"] - last[0]) & _M16)
        self.counts[key] = (m["n"], m["k"], boot)
        if m["why"] == WHY_SYNC or m["why"] == WHY_ASSIGN:
            self.acked(key)
        if fresh:
            return None
        k = (m["k"] - last[1]) & _M16
        f = self.flow.get(key)
        if f is None:
            self.flow[key] = [float(k), 0.0, m["t"]]
        else:
            f[0], f[1], f[2] = f[0] * decay + k, f[1] * decay + max(0.0, m["t"] - f[2]), m["t"]
        return k

    def acked(self, key):
        """``key``'s device acknowledged a control: nothing more to come for it."""
        if key in self.acks:
            self.reserve -= self.acks.pop(key)

    def rate(self, key):
        """Readings per second of ``key`` lately (inf until measured)."""
        f = self.flow.get(key)
        return f[0] / f[1] if f is not None and f[1] > 0 else float("inf")

    def control(self, key, home, twin, cost, forced, ack):
        """A control to ``key``: ``twin`` when it installs deadband's filter ``home`` (flagged METER: its
        meter takes it alike, acknowledgement included), ``forced`` when deadband sends its filter again
        too (a birth); ``ack``: the device will acknowledge it."""
        self.real += cost
        if twin:
            if forced or self.told.get(key) != home:
                self.dead += cost
            self.told[key] = home
            return
        if key not in self.off:
            self.off[key] = cost
            self.reserve += 2 * cost
        self._await(key, cost, ack)

    def sync(self, key, home, cost, ack):
        """A SYNC control to ``key`` (deadband's filter ``home``); ``ack``: the device will acknowledge it."""
        self.control(key, home, True, cost, False, False)
        if key in self.off:
            self.reserve -= 2 * self.off.pop(key)
        self._await(key, cost, ack)

    def leave(self, key):
        """``key`` leaves the ledger (segment mode) as its shadow's twin: what it owed goes, and its count
        restarts at its next report in the ledger (its device's meter counted its reports outside)."""
        if key in self.off:
            self.reserve -= 2 * self.off.pop(key)
        if key in self.acks:
            self.reserve -= self.acks.pop(key)
        for book in (self.counts, self.told, self.flow):
            book.pop(key, None)
        self.rebase.add(key)

    def missing(self, device, n, cost):
        """``n`` more uplinks of ``device`` missing, real at ``cost`` each from its next metered report (``settle``),
        or −n of them arrived: charged back (the pending ones first)."""
        pending, charged = self.unseen.setdefault(device, ([], []))
        pending += [cost] * max(0, n)
        for _ in range(-n):
            if pending:
                pending.pop()
            elif charged:
                self.real -= charged.pop()

    def settle(self, device):
        """``device``'s metered report is applied: the uplinks found missing since are charged with it, beside the
        counts it carries (deadband's would-be reports lost alike): charged alone, before them, each read as a loss."""
        book = self.unseen.get(device)
        if book and book[0]:
            self.real += sum(book[0])
            book[1].extend(book[0])
            del book[0][:]

    def pending(self):
        """What the uplinks missing and not yet settled will be charged."""
        return sum(sum(book[0]) for book in self.unseen.values())

    def _await(self, key, cost, ack):
        if ack and key not in self.acks:
            self.acks[key] = cost
            self.reserve += cost


class Guard:
    """The exact no-regret half of the default adaptive rule (a mixin of ``estimate.Estimated``)."""

    def _home(self, coord, key):
        """Deadband's filter of ``key`` (width, constraints): what its device meters, and what a source that
        does not move keeps (with padding, ``rate``: the padded uniform share, and nothing is metered)."""
        if self.rate is not None:
            return (self.rows.uniform(key) if key in self.rows.of else INF), range_constraints(coord, key)
        return deadband.target(coord, key)

    def _uniform(self, coord, key):
        return self._home(coord, key)[0]

    def may_choose(self, coord, device):
        """Only a metering device guards its own model choice (edge.core.meter's departures); one that does not
        (older firmware) keeps constant models, deadband's, where its choice could lose unseen."""
        return self.rate is not None or coord.devices[device].get("meter", False)

    def _meters(self, coord, key):
        """Whether ``key``'s device meters plain deadband (edge.core.meter): its controls say when they are
        deadband's (METER)."""
        return self.rate is None and coord.devices[coord.cache.sources[key].device].get("meter", False)

    def _metered(self, coord, key):
        """Whether ``key`` is in the ledger: only such sources move. Not a source in segment mode
        (core/segments.py): its real-time exits go as ``rsegs``, which carry segments and no counts, from a
        constant filter whatever model deadband's shadow follows, so its meter cannot weigh it against
        deadband; it keeps deadband's filter (the lag-free queries' uniform width), its reports deadband's."""
        return self._meters(coord, key) and key not in coord.segments.mode

    def _leave(self, coord, key):
        """``key`` (its device meters) goes outside the ledger: synced first if it had moved (the report that
        found it so counts as real), then out, its shadow's twin. Outside, MIN/MAX cuts apply to it as the
        cut episodes' own ledger (``extremes.Ledger``) has them pay, every control flagged METER (the meter
        follows its real filter: no shadow, no count reports)."""
        led = self.ledger
        if key in led.off:
            led.real += self.cost(key)
            self._revert(coord, coord.clock, False, [key])
        if key in led.off or key in led.acks or key in led.counts or key in led.told:
            led.leave(key)

    def _back(self, coord, key):
        """``key`` is back in the ledger (out of segment mode): deadband's filter again (uncut, METER)."""
        s = coord.cache.sources[key]
        home = self._home(coord, key)
        if self.cuts.constraints(coord, key) or (s.filt.width, s.filt.cons) != (s.filt._r(home[0]), s.filt._cons(home[1])):
            self.cuts.uncut(coord, key)
            self._install(coord, key, home[0])

    def superseded(self, coord, key, m):
        """A metered report reordered behind a newer one is not applied, but it was sent: real (its count is in
        the newer report's, so deadband's side has it already)."""
        if "n" in m and self._metered(coord, key) and key not in self.ledger.rebase:
            self.ledger.real += self.cost(key)

    def unseen(self, coord, device, n):
        """``n`` more numbered uplinks of ``device`` missing (``Integrity.unseen``): sent, so real, each at its
        dearest metered source's cost (a reply or birth among them counts as a report: never less), charged with
        the device's next metered report, whose counts hold deadband's would-be reports lost alike (``settle``);
        one that arrives (n < 0) gets its charge back and counts as it is applied. Uncounted, partitions left the
        ledger at −771 by 600 s while the devices sent 177 reports more than their meters counted (seed 5003,
        ``bench.faults``; ``test_regret``); charged before the counts, the trailing stop read each as a loss."""
        d = coord.devices.get(device)
        costs = [self.cost(k) for k in (d["keys"] if d else ()) if k in self.ledger.counts and self._metered(coord, k)]
        if costs or n < 0:
            self.ledger.missing(device, n, max(costs or [0.0]))

    def _hard(self):
        """The loan: ``guard`` messages, by default as many as the queried sources (at least 8)."""
        return self.guard if self.guard is not None else max(8.0, float(len(self.rows.of)))

    def _exposed(self, coord, msgs=0.0, new=0):
        """real − deadband after ``msgs`` more messages, plus what syncing every moved source (``new``
        more of them) costs and the reports a moved source may have in flight within a round trip (2λ)."""
        led = self.ledger
        out = led.gap() + msgs + led.reserve + 2.0 * self.cmax * new
        lam = coord.tolerance
        if lam > 0:
            rate = [(c, led.rate(k)) for k, c in list(led.off.items()) + list(led.acks.items())]
            out += 2.0 * lam * math.fsum(c * r for c, r in rate if r < INF)
        return out

    def _affords(self, coord, msgs, new, cut=False):
        """Whether ``msgs`` messages that move ``new`` more sources keep within the trailing stop and the
        loan: a MIN/MAX ``cut`` (a silent source: real − deadband only falls, but for its rare promotions)
        the whole loan, a move of widths half of it (the other half takes the ups and downs of real −
        deadband before every moved source must be synced), though always one narrowing, its widening and
        their syncs (7 messages)."""
        loan = self._hard()
        room = loan - self.cmax if cut else max(loan / 2, min(loan - self.cmax, 7 * self.cmax))
        return (self.ceiling is not None and self.ledger.gap() + msgs <= self.ceiling
                and self._exposed(coord, msgs, new) <= room)

    def _install(self, coord, key, width, forced=False):
        """Give ``key`` ``width`` (with its constraints and cuts): a control if its filter changes (or
        ``forced``), flagged METER when it is deadband's filter, and counted in the ledger."""
        s = coord.cache.sources[key]
        if self._silent(coord, key):
            width = INF
        cons = self._constraints(coord, key)
        home = self._home(coord, key)
        meter = self._metered(coord, key)
        # deadband's filter on a source that is deadband's twin (a moved one keeps its shadow until a SYNC)
        twin = self._meters(coord, key) and (not meter or key not in self.ledger.off and cons == home[1]
                                             and s.filt._r(width) == s.filt._r(home[0]))
        flags = codec.METER if twin else 0
        st = self._source(coord, key) if meter and key in self.rows.of else None
        if st is not None:
            st.accrue(coord.clock)
        ack = s.value is not None and (cons != s.filt.cons or (forced and cons) or s.filt._r(width) < s.filt.width)
        if cons != s.filt.cons or (forced and cons):
            self._moved(key)
            coord.assign_filter(key, width, cons, flags=flags)
        elif s.filt._r(width) != s.filt.width or forced or (meter and twin and self.ledger.told.get(key) != home):
            if s.filt._r(width) < s.filt.width:
                self.stats["narrow"] += 1
            self._moved(key)
            coord.assign_width(key, width, flags=flags)
        else:
            return
        if meter:
            self.ledger.control(key, home, twin, self.cost(key), forced, ack)
        if st is not None:
            st.w = self._width(s)

    def _sync(self, coord, key):
        """Make ``key`` its shadow's twin: deadband's filter, the shadow's centre (SYNC, acknowledged)."""
        s = coord.cache.sources[key]
        home = self._home(coord, key)
        st = self._source(coord, key) if key in self.rows.of else None
        if st is not None:
            st.accrue(coord.clock)
        self._moved(key)
        coord.assign_filter(key, home[0], home[1], flags=codec.METER | codec.SYNC)
        self.ledger.sync(key, home, self.cost(key), s.value is not None)
        self.stats["syncs"] += 1
        if st is not None:
            st.w = self._width(s)

    def _revert(self, coord, t, backoff, keys=None):
        """Make every moved source (or those of ``keys``) its shadow's twin: those at least as wide as
        deadband's width first, the others once those are acknowledged (no row holds more than its budget
        meanwhile); ``backoff``: then try again only after a back-off that doubles each time, with half the loan."""
        self.target, self.narrowing = {}, set()
        src = coord.cache.sources
        first, self.later = [], []
        for key in sorted(self.ledger.off if keys is None else keys):
            self.cuts.uncut(coord, key)
            (first if self._width(src[key]) >= self._home(coord, key)[0] else self.later).append(key)
        for key in first:
            self._sync(coord, key)
        self._second(coord)
        if backoff:
            self.stats["backoffs"] += 1
            self.backoff = max(2 * self.backoff, t - self.since)
            self.until = t + self.backoff
            self.loan /= 2.0
            self.ceiling = None

    def _second(self, coord):
        """A revert's second step, once no sync of a source that is online waits for its acknowledgement."""
        src = coord.cache.sources
        if self.later and not any(src[k].online for k in self.ledger.acks):
            later, self.later = self.later, []
            for key in later:
                self._sync(coord, key)

    def _settle(self, coord, fresh=(), rows=None):
        """After a query change: deadband's filter for every source not moved; a moved one keeps its width
        while its deadband filter is unchanged, and is synced when it changed (deadband's new filter); when
        the rows do not fit so, every source is synced."""
        src, led = coord.cache.sources, self.ledger
        stale = [k for k in led.off if led.told.get(k) != self._home(coord, k)]
        widths = {}
        for key, s in src.items():
            if key in self.rows.of:
                w = self._width(s) if key in led.off and key not in fresh and key not in stale else INF
                widths[key] = w if w < INF else self.rows.uniform(key)     # (deadband's, as the rows count)
        if any(u > b * (1 + _ROUNDING) for u, b in zip(self.rows.used(widths), self.rows.budget)):
            self._revert(coord, coord.clock, False)
        elif stale:
            self._revert(coord, coord.clock, False, stale)
        for key, s in src.items():
            w = self._width(s) if key in led.off else INF
            self._install(coord, key, w if w < INF else self._home(coord, key)[0])

    def resync(self, coord, key, want):
        s = coord.cache.sources[key]
        last = self.ledger.counts.get(key)
        if key in self.ledger.off and last is not None and last[2] != coord.devices[s.device]["boot"]:
            self._revert(coord, coord.clock, False)       # it rebooted, and its meter is gone: synced
        else:
            self._install(coord, key, want[0], forced=True)

    def _begin(self, coord, t):
        """Whether a try is on: the first one from the first report (it may lose the loan), a later one once
        its back-off is over and every sync of an online source is acknowledged (it may lose its own loan,
        half the one before, from where it starts)."""
        if self.ceiling is None and t >= self.until and not self.later:
            src = coord.cache.sources
            if not any(src[k].online for k in self.ledger.acks):
                self.ceiling = self.ledger.gap() + self.loan
        return self.ceiling is not None

    def _guard(self, coord, t):
        """Sync every moved source when the next message could break the loan, or past the trailing stop,
        which follows the saving down to 0 (once ahead of deadband by the loan, never behind it)."""
        if self.ceiling is None:
            return
        led = self.ledger
        x = led.gap()
        if x > self.ceiling or led.off and self._exposed(coord) > self._hard() - self.cmax:
            self._revert(coord, t, True)
        else:
            self.ceiling = min(self.ceiling, max(0.0, x + self.loan))

