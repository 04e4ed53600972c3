"""The device's deadband meter (edge.core.meter) against deadband's own device and a brute-force replay, on every prefix.

A metered ``Agent`` gets random readings and the controls the backend's adaptive rule may send: deadband's
filter flagged METER (while the source is deadband's twin), moves (not flagged), SYNC. Two oracles run the
same readings at the same deadband filters: a plain constant ``Agent`` that is only ever sent deadband's
controls (plain deadband's own device, the baseline: no model chooser) and plain deadband written out from
scratch (bound test, range membership, acknowledgement of a narrowing or a constraint change). After every
reading, timer and control the meter's count must equal each oracle's and its reading count the readings so
far, in every report it sends too. While a twin the metered agent reports exactly when and what deadband's
device reports; a twin that takes a line (its model chooser's) departs at that report, and while departed
it never sends more than ``OWE`` reports beyond its shadow's, summed since the meter began: the exit that
would goes back to the shadow (WHY_SYNC) and it stays constant. Runs under CPython and MicroPython, in double and
in emulated float32 (a single-precision board).
"""
from edge.agent import Agent
from edge.core import codec, meter
from edge.core.float32 import f32
from portable import Rng, ctl, session


class Deadband:
    """Plain constant deadband for one source, from scratch."""

    def __init__(self, rnd):
        self.r = rnd or (lambda x: x)
        self.w, self.cons, self.c, self.mask, self.count = 0.0, [], None, 0, 0

    def _mask(self, v):
        m = 0
        for b, (lo, hi) in enumerate(self.cons):
            if lo <= v <= hi:
                m |= 1 << b
        return m

    def _out(self, v):
        r = self.r
        h = self.w / 2
        return (self.c is None or v < r(self.c - h) or v > r(self.c + h)
                or (bool(self.cons) and self._mask(v) != self.mask))

    def reading(self, v):
        if self._out(v):
            self.count += 1
            self.c, self.mask = v, self._mask(v)

    def control(self, w, cons, ack, v):
        r = self.r
        self.w, self.cons = r(w), [(r(lo), r(hi)) for lo, hi in cons]
        if self.c is not None:
            self.mask = self._mask(self.c)
        if v is not None and (ack or self._out(v)):
            self.count += 1
            self.c, self.mask = v, self._mask(v)


class Reference:
    """Plain deadband's device: a constant agent sent deadband's controls only; its reports counted."""

    def __init__(self, rnd, unit):
        self.a = Agent("ref", ["x"], rnd=rnd, meter=False, unit=unit)
        session(self.a)
        self.seq, self.epoch, self.count, self.out = 2, 1, 0, []

    def _got(self, out):
        self.out = [codec.decode(p)[1] for _, p in out]
        self.count += len(out)

    def control(self, t, kind, w, cons, ack):
        fields = {"seq": self.seq, "src": 0, "epoch": self.epoch, "width": w, "ack": ack}
        if kind == "filter":
            fields["cons"] = [{"l": lo, "u": hi} for lo, hi in cons]
        else:
            fields["period"] = 0
        self.seq, self.epoch = self.seq + 1, self.epoch + 1
        self._got(self.a.handle_message(t, ctl(self.a, kind, **fields)))

    def timer(self, t):
        d = self.a.next_deadline()
        self._got(self.a.handle_timer(t) if d is not None and d <= t else [])

    def sample(self, t, v):
        self._got(self.a.handle_sample(t, 0, v))


def _decode(out):
    return [codec.decode(p) for _, p in out]


def _counted(a, out, k):
    """Every report in ``out`` is metered and carries the meter's counts, ``k`` readings so far."""
    for kind, m in out:
        assert kind in ("mreport", "mline") and m["n"] == a.meter.n[0] and m["k"] == k & 0xFFFF


def _said(out):
    """What reports state: (time, value), from decoded (kind, fields) pairs or fields alone."""
    ms = [m[1] if isinstance(m, tuple) else m for m in out]
    return [(m["t"], m["v"]) for m in ms]


def _run(seed, rnd, lines, unit=1, guard=0, quiet=0):
    """``quiet``: readings without a control at first (a twin left alone, free to depart)."""
    rng = Rng(seed)
    a = Agent("d", ["x"], rnd=rnd, lines=lines, unit=unit)
    session(a)
    if lines:
        a.handle_message(0, ctl(a, "setup", seq=2, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0, allow=3))
    ref, brute = Reference(rnd, unit), Deadband(rnd)
    db = (2.0, [])                      # deadband's filter (width, ranges), as the backend knows it
    # the backend's first control is deadband's width, flagged METER: the meter starts there
    a.handle_message(0, ctl(a, "width", seq=3, src=0, epoch=1, period=0, width=2.0, ack=codec.METER))
    ref.control(0, "width", 2.0, [], 0)
    brute.control(2.0, [], False, None)
    seq, epoch, t, v = 4, 2, 0, 100.0
    if guard:                           # clock skew: reports are guarded (``link``, ms), on both devices alike
        a.handle_message(0, ctl(a, "link", seq=seq, rto=0, guard=guard))
        ref.a.handle_message(0, ctl(ref.a, "link", seq=ref.seq, rto=0, guard=guard))
        seq, ref.seq = seq + 1, ref.seq + 1
    k, value, twin, lined, departed, owed, back = 0, None, True, 0, 0, 0, 0
    step = 1000 if unit == 1000 else 1.0
    for step_no in range(1500):
        t += step * (1 + (rng.below(40) == 0) * rng.below(6))     # irregular: now and then a long gap
        dep, n0, moved = a.meter.departed[0], a.meter.n[0], False    # (moved: a move or a SYNC, the backend's)
        out = _decode(a.handle_timer(t)) if a.next_deadline() is not None and a.next_deadline() <= t else []
        ref.timer(t)
        if twin:
            assert _said(out) == _said(ref.out)
        _counted(a, out, k)
        if dep and a.meter.shadows[0] is None:      # a departure that lost at a line's gap: back to deadband's
            assert out[-1][1]["why"] == codec.WHY_SYNC and out[-1][1]["v"] == ref.a.filters[0].center
            twin, back = True, back + 1
        timed, out = len(out), []
        if rng.below(150) == 0:         # a reconnect: a birth recentres every filter on the latest reading
            session(ref.a, now=t, seq=ref.seq)
            session(a, now=t, seq=seq)
            if lines:
                a.handle_message(t, ctl(a, "setup", seq=seq + 1, period=0, shrink=0.0, beat=0, t0=0, now=0, tick=0,
                                        allow=3))
            ref.seq, seq = ref.seq + 1, seq + 2
            if value is not None:
                brute.c, brute.mask = value, brute._mask(value)
        elif rng.below(25) == 0 and step_no >= quiet:     # a control
            w = rng.choice([0.5, 1.0, 2.0, 3.0, 5.0])
            cons = [(98.0, 102.0)] if rng.below(3) == 0 else []
            what = rng.below(3)         # 0: a move, 1: deadband's filter (METER), 2: SYNC
            if what == 0:
                kind = "filter" if cons or rng.below(2) else "width"
                fields = {"width": w, "ack": codec.ACK if rng.below(2) else 0}
                f = a.filters[0]
                same = f._r(w) == f.width and (kind == "width" or f._cons(cons) == f.cons)
                if twin and same:
                    ref.control(t, kind, w, cons, fields["ack"])    # deadband's control sent again: its device
                    brute.control(w, cons if kind == "filter" else db[1], fields["ack"], value)   # gets it too
            else:
                if what == 2 and rng.below(2):
                    w, cons = db        # a SYNC that keeps deadband's filter
                kind = "filter" if cons != db[1] or what == 2 else "width"
                ack = cons != db[1] or ref.a.filters[0]._r(w) < ref.a.filters[0].width
                if (w, cons) != db:     # deadband sends its control when its filter changes, as the backend does
                    ref.control(t, "filter" if cons != db[1] else "width", w, cons, codec.ACK if ack else 0)
                    brute.control(w, cons, ack, value)
                db = (w, cons)
                fields = {"width": w, "ack": (codec.ACK if ack or what == 2 else 0) | codec.METER
                          | (codec.SYNC if what == 2 else 0)}
            fields.update(seq=seq, src=0, epoch=epoch)
            if kind == "filter":
                fields["cons"] = [{"l": lo, "u": hi} for lo, hi in cons]
            else:
                fields["period"] = 0
            seq, epoch = seq + 1, epoch + 1
            out += _decode(a.handle_message(t, ctl(a, kind, **fields)))
            if what == 0:                # (a move only if it changes the filter)
                twin, moved = twin and a.meter.shadows[0] is None, not same
            elif what == 2:
                twin, moved = True, True
                if value is not None:       # acknowledged under the control's epoch
                    assert len(out) == 1 and out[-1][0] in ("mreport", "mline") and out[-1][1]["why"] == codec.WHY_SYNC
                    assert out[-1][1]["epoch"] == epoch - 1
                f, g = a.filters[0], ref.a.filters[0]       # the real filter took deadband's state exactly
                assert (f.width, f.cons, f.center, getattr(f, "slope", 0.0)) == (g.width, g.cons, g.center,
                                                                                  getattr(g, "slope", 0.0))
            elif twin and a.meter.departed[0]:      # deadband's control acknowledged with a line: departed
                twin, departed = False, departed + 1
            assert (a.meter.shadows[0] is None) == twin
        else:                           # a reading
            calm = (t // (60 * step)) % 3     # drifts with little noise (lines pay), and a noisy walk
            v += rng.uniform(-0.02, 0.02) + 0.2 * (calm - 1.5) if calm else rng.uniform(-0.6, 0.6)
            if step_no < quiet:         # a steady ramp while left alone: a line pays (the twin departs)
                v += 0.25
            if rnd is not None:
                v = rnd(v)
            value, k = v, k + 1
            brute.reading(v)
            ref.sample(t, v)
            a_new = _decode(a.handle_sample(t, 0, v))
            out += a_new
            if twin:                    # deadband's twin reports when and what deadband's device reports
                assert _said(a_new) == _said(ref.out)
                if a.meter.shadows[0] is not None:      # a line taken: it departed
                    assert a.meter.departed[0] and a_new[-1][0] == "mline"
                    twin, departed = False, departed + 1
            elif dep and a.meter.shadows[0] is None:    # a departure that lost: back to deadband's filter
                assert a_new[-1][1]["why"] == codec.WHY_SYNC and a_new[-1][1]["v"] == ref.a.filters[0].center
                twin, back = True, back + 1
        if dep and not moved:           # what a departure sent beyond its shadow, since the meter began
            owed += timed + len(out) - ((a.meter.n[0] - n0) & 0xFFFF)
            assert owed <= meter.OWE and owed == a.meter.debt[0]
        n = a.meter.n[0]
        assert n == ref.count & 0xFFFF and a.meter.k[0] == k & 0xFFFF
        if not guard:                   # (the brute force knows no guard)
            assert n == brute.count & 0xFFFF
        _counted(a, out, k)
        assert (a.meter.shadows[0] is None) == twin
        lined += sum(1 for kind, _ in out if kind == "mline")
    assert ref.count > 30 and (lines or lined == 0)
    return lined, ref.count - brute.count, departed, back   # (lines; reports deadband's guard made; departures)


def test_the_meter_counts_what_deadband_would_send_on_every_prefix():
    for seed in range(5):
        _run(seed, None, False)


def test_the_meter_counts_plain_deadband_while_sources_take_lines():
    runs = [_run(seed, None, True, quiet=300 * (seed & 1)) for seed in range(5, 9)] + \
        [_run(9, None, True, unit=1000, quiet=300), _run(31, None, True)]     # (ms: a board)
    # the runs go through lines (a moved source's, a twin's that departs: three left alone on a ramp at first)
    # while the meter counts plain deadband; every run departs, and a departure that lost goes back
    assert sum(r[0] for r in runs) > 20 and all(r[2] for r in runs) and sum(r[3] for r in runs) >= 1


def test_the_meter_guards_reports_as_deadbands_device_does():
    # a guard of 3 readings (ms on a board): readings leaving a report's hull within it are reported too,
    # by the shadow of a moved source as by deadband's device, and a SYNC hands the shadow's guard over
    guarded = 0
    for seed, lines, unit in ((14, False, 1), (15, False, 1), (16, True, 1), (17, True, 1000)):
        guarded += _run(seed, None, lines, unit, guard=3000)[1]
    assert guarded > 20


def test_the_meter_is_exact_on_a_float32_board():
    for seed in range(10, 13):
        _run(seed, f32, False)
    _run(13, f32, True, unit=1000)


def test_metered_reports_round_trip_and_plain_agents_never_send_them():
    for kind, fields in (("mreport", {"src": 1, "epoch": 2, "seq": 3, "t": 4.5, "v": 6.25, "why": 0, "n": 65535,
                                      "k": 7}),
                         ("mline", {"src": 1, "epoch": 2, "seq": 3, "t": 4.5, "v": 6.25, "why": 0, "slope": 0.5,
                                    "gap": 2.0, "n": 0, "k": 65535, "o": 4.0})):
        assert codec.decode(codec.encode(kind, fields)) == (kind, fields)
        assert codec.PLAIN[kind] in ("report", "line")
    a = Agent("d", ["x"])
    assert a.caps & codec.CAP_METER and not Agent("d", ["x"], meter=False).caps & codec.CAP_METER
    session(a)
    a.handle_message(0.0, ctl(a, "width", seq=2, src=0, epoch=1, period=0, width=1.0, ack=0))
    kinds = [codec.decode(p)[0] for i in range(50) for _, p in a.handle_sample(float(i), 0, float(i % 7))]
    assert kinds and set(kinds) == {"report"} and a.meter is None
