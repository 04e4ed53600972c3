"""Segment mode on the device (edge/core/segment.py) against the readings themselves, on every prefix.

An agent in segment mode is fed irregular random walks with jumps sample by sample (timers fired when
due, as the pump does); after every event its decoded ``segs`` and ``rsegs`` messages are replayed into
pieces the way the backend does, and the oracle checks (1) every reading's value, over the whole time it
holds, lies within ±W/2 of the line of every piece covering that time, up to what the backend may claim by
then (now − D); (2) the pieces leave no hole and reach now − D (the lag promise); (3) messages carry several
segments. With a real-time filter beside the segments (a lag-free query reads the source too), also (4)
the latest reading lies in the bound of the latest report at every instant, and (5) while that bound is
no wider than W the segments never send a message of their own. Native floats, integer-ms boards and
emulated float32 boards.
"""
from edge.agent import Agent
from edge.core import codec, segment
from edge.core.float32 import f32
from portable import Rng, ctl, session, raises

INF = float("inf")


def _drive(model, unit, rnd, seed, n=220, width=2.0, rt=INF):
    rng = Rng(seed)
    a = Agent("d", ["x", "y"], width=rt, unit=unit, rnd=rnd)
    session(a)
    lag_ms = 1500
    for i in range(2):
        a.handle_message(0, ctl(a, "segment", src=i, seq=2 + i, lag=lag_ms, model=model, width=width))
    lag = lag_ms if unit == 1000 else lag_ms / 1000
    pad = 2.0 ** -20 if rnd is not None else 1e-12
    readings = [[], []]
    pieces = [[], []]
    centre = [None, None]                   # the value of each source's latest report (the backend's bound)
    vals = [0.0, 50.0]
    stats = {"msgs": 0, "recs": 0, "checks": 0, "alone": 0, "rides": 0}
    now = 0

    def take(out):
        for _, p in out:
            kind, m = codec.decode(p)
            if kind == "rsegs":
                stats["rides"] += 1
                centre[m["src"]] = m["v"]
            elif kind == "segs":
                stats["alone"] += 1
            else:
                continue
            stats["msgs"] += 1
            for r in m["segs"]:
                stats["recs"] += 1
                ps = pieces[r["src"]]
                e = INF if r["f"] & 1 else r["e"]
                rec = [r["a"], e, r["v"], r["s"], r["w"]]
                if ps and ps[-1][0] == r["a"]:
                    ps[-1] = rec
                else:
                    assert not ps or ps[-1][0] < r["a"]
                    if ps:
                        ps[-1][1] = min(ps[-1][1], r["a"])
                    ps.append(rec)

    def check(now):
        claim = now - lag                   # what the backend may state as final at this instant
        for i in range(2):
            ps, rs = pieces[i], readings[i]
            if rs and rt < INF:             # real time: the latest reading lies in the latest report's bound
                assert centre[i] is not None and abs(rs[-1][1] - centre[i]) <= rt / 2 + pad * abs(centre[i]), (i, rs[-1], centre[i])
            if not rs or rs[0][0] > claim:
                continue
            assert ps and ps[0][0] == rs[0][0], "pieces start at the first reading"
            for k in range(1, len(ps)):
                assert ps[k - 1][1] == ps[k][0], "no hole between pieces"
            assert ps[-1][1] >= claim, "data older than the lag not sent: %r < %r" % (ps[-1][1], claim)
            for j in range(len(rs)):
                t0, v = rs[j]
                t1 = rs[j + 1][0] if j + 1 < len(rs) else now
                for pa, pe, pv, ps_, pw in ps:
                    lo, hi = max(t0, pa), min(t1, pe)       # [t0, t1) meets [pa, pe), up to the claim
                    if lo >= hi or lo > claim:
                        continue
                    hi = min(hi, claim)
                    for tau in (lo, hi):
                        line = pv + ps_ * (tau - pa) if model == segment.LINE else pv
                        slack = pw / 2 + pad * (abs(pv) + pw / 2 + abs(ps_ * (tau - pa)))
                        stats["checks"] += 1
                        assert abs(v - line) <= slack, (i, tau, v, line, pw, (pa, pe, pv, ps_))

    for step in range(n):
        gap = 100 + rng.u32() % (2 * lag_ms if step % 37 == 0 else 600)
        nxt = now + gap if unit == 1000 else (round(now * 1000) + gap) / 1000
        d = a.next_deadline()
        while d is not None and d <= nxt:
            take(a.handle_timer(d))
            now = d
            check(now)
            d2 = a.next_deadline()
            assert d2 is None or d2 > d, "a due timer leaves nothing due"
            d = d2
        now = nxt
        i = rng.u32() % 2
        jump = rng.u32() % 29 == 0
        vals[i] += (rng.random() - 0.5) * (8 * width if jump else 0.9 * width) + (0.3 if i else 0.0)
        v = vals[i] if rnd is None else rnd(vals[i])
        readings[i].append((now, v))
        take(a.handle_sample(now, i, v))
        check(now)
    assert stats["checks"] > 500 and stats["recs"] > stats["msgs"], stats
    assert a.stats["bad_messages"] == 0
    if rt <= width:
        assert stats["alone"] == 0 and stats["rides"] > 20, stats
    return stats


def test_line_segments_hold_every_reading_native_floats():
    for seed in (1, 2, 3):
        _drive(segment.LINE, 1, None, seed)


def test_constant_segments_hold_every_reading_native_floats():
    for seed in (4, 5):
        _drive(segment.CONST, 1, None, seed)


def test_integer_ms_board_line_and_constant():
    for seed in (6, 7):
        _drive(segment.LINE, 1000, None, seed)
        _drive(segment.CONST, 1000, None, seed)


def test_float32_board_emulated():
    for seed in (8, 9):
        _drive(segment.LINE, 1000, f32, seed)
        _drive(segment.CONST, 1000, f32, seed)


def test_a_real_time_filter_beside_the_segments_carries_them():
    # a lag-free query narrower than the segments: every segment rides on a report, none goes alone
    for unit, rnd in ((1, None), (1000, None), (1000, f32)):
        for model in (segment.LINE, segment.CONST):
            _drive(model, unit, rnd, 10 + model, rt=1.8)
    # a wider real-time filter (a cut, or a coarse lag-free query): segments go alone when due, reports too
    for unit, rnd in ((1, None), (1000, f32)):
        s = _drive(segment.LINE, unit, rnd, 12, rt=7.0)
        assert s["alone"] > 0 and s["rides"] > 0, s


def test_fewer_messages_than_samples_and_segment_mode_off_resumes_reports():
    a = Agent("d", ["x"], width=INF)          # only a lag query reads x: its filter never reports
    session(a)
    a.handle_message(0.0, ctl(a, "segment", src=0, seq=2, lag=5000, model=segment.LINE, width=1.0))
    out = []
    for k in range(100):
        out += a.handle_sample(k * 0.1, "x", 0.05 * k)      # one straight line
        if a.next_deadline() is not None and a.next_deadline() <= k * 0.1:
            out += a.handle_timer(k * 0.1)
    assert len(out) <= 3 and a.stats["samples"] == 100
    kinds = [codec.decode(p)[0] for _, p in a.handle_message(10.0, ctl(a, "segment", src=0, seq=3, lag=0, model=0,
                                                                        width=0.0))]
    assert kinds[-1] == "report" and not a.segs
    a.handle_message(10.0, ctl(a, "width", src=0, epoch=1, seq=4, period=0, width=1.0, ack=0))
    assert [codec.decode(p)[0] for _, p in a.handle_sample(10.1, "x", 100.0)] == ["report"]


def test_an_acknowledged_control_in_segment_mode_is_answered_with_the_segments():
    a = Agent("d", ["x"], width=INF)
    session(a)
    a.handle_message(0.0, ctl(a, "segment", src=0, seq=2, lag=5000, model=segment.LINE, width=1.0))
    assert a.handle_sample(0.5, "x", 3.0) == [] and a.handle_sample(1.0, "x", 3.2) == []
    out = a.handle_message(1.5, ctl(a, "width", src=0, epoch=1, seq=3, period=0, width=0.5, ack=1))
    kind, m = codec.decode(out[0][1])
    assert len(out) == 1 and kind == "rsegs" and (m["epoch"], m["v"], m["t"], m["why"]) == (1, 3.2, 1.5, codec.WHY_ASSIGN)
    assert [(r["a"], r["e"], r["f"]) for r in m["segs"]] == [(0.5, 1.5, 0), (1.5, 1.5, segment.COMMITTED)]
    assert a.handle_sample(2.0, "x", 3.3) == [] and a.next_deadline() is None     # on the committed constant
    kind, m = codec.decode(a.handle_sample(2.5, "x", 3.6)[0][1])      # leaves the real-time bound: reported at once
    assert kind == "rsegs" and m["why"] == codec.WHY_EXIT and [(r["a"], r["e"]) for r in m["segs"]] == [(1.5, 2.5), (2.5, 2.5)]


def test_bad_segment_controls_are_counted():
    a = Agent("d", ["x"], width=1.0)
    session(a)
    for bad in (ctl(a, "segment", src=0, seq=2, lag=0, model=1, width=1.0),
                ctl(a, "segment", src=0, seq=3, lag=10, model=7, width=1.0),
                ctl(a, "segment", src=4, seq=4, lag=10, model=1, width=1.0),
                ctl(a, "segment", src=0, seq=5, lag=10, model=1, width=-1.0)):
        assert a.handle_message(0.0, bad) == []
    assert a.stats["bad_messages"] == 4 and not a.segs
    raises(ValueError, segment.Segmenter, 3, 1.0, 10)


def test_a_committed_line_ends_where_its_width_changes_never_replaced_from_its_start():
    # the backend takes a committed line as going on and may state final answers past what it heard; a new width
    # used to replace the committed segment from its start unseen (a record with the same start and another
    # line). Oracle: records sharing a start state one line, and the committed line ends at the change.
    a = Agent("d", ["x"], width=4.0)
    session(a)
    a.handle_message(0.0, ctl(a, "segment", src=0, seq=2, lag=2000, model=segment.LINE, width=4.0))
    recs = []

    def take(out):
        for _, p in out:
            kind, m = codec.decode(p)
            if kind in ("segs", "rsegs"):
                recs.extend((r["a"], r["e"], r["v"], r["s"], r["w"], r["f"]) for r in m["segs"])
    t = 0.0
    for k in range(40):                     # flat: one line, committed once its data is due
        t = k * 0.1
        d = a.next_deadline()
        if d is not None and d <= t:
            take(a.handle_timer(d))
        take(a.handle_sample(t, "x", 10.0 + (0.5 if k % 2 else 0.0)))
    assert any(f & 1 for *_, f in recs), recs
    take(a.handle_message(4.0, ctl(a, "segment", src=0, seq=3, lag=2000, model=segment.LINE, width=1.0)))
    take(a.handle_sample(4.05, "x", 10.25))
    take(a.handle_message(4.1, ctl(a, "segment", src=0, seq=4, lag=0, model=0, width=0.0)))    # everything out
    by_start = {}
    for r in recs:
        line = r[2:5]
        assert by_start.setdefault(r[0], line) == line, (r, by_start[r[0]])
    before = [r for r in recs if r[5] & 1 and r[0] < 4.0][-1]      # committed under the old width
    ends = [r[1] for r in recs if not r[5] & 1 and r[0] == before[0]]
    assert ends == [4.0], (before, ends)        # it held the last reading until the new width came
