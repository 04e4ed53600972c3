"""Agent summary control path (Bulut & Singh 2003 §3): SWAT tree on demand, pushes, read replies.

Portable: runs under pytest and under MicroPython (tests/edge/mp_runner.py). The backend's replica
is rebuilt from the blobs and checked against the exact window after every reading.
"""
from edge.agent import Agent
from edge.core import codec
from edge.core.swat_asr import TAG, unpack_segments
from portable import Rng, ctl, session


def _agent():
    a = Agent("d", ["t"], width=1e9)
    session(a, seq=0)
    return a


def _summary(a, seq, window=16, subs=0, read=0, pad=None, k=1):
    return ctl(a, "summary", src=0, seq=seq, window=window, k=k, subs=subs, read=read, pad=pad or [])


def _rows(out):
    got = {}
    for _, p in out:
        kind, m = codec.decode(p)
        if kind == "blob":
            assert m["tag"] == TAG and m["src"] == 0
            for sid, lo, hi, mean in unpack_segments(m["data"])[1]:
                got[sid] = (lo, hi, mean)
    return got


def _segment(hist, s):
    a, b = (0, 1) if s == 0 else (1 << s, (2 << s) - 1)
    return [hist[len(hist) - 1 - i] for i in range(a, b + 1)]


def test_tree_is_allocated_only_when_configured_and_dropped_by_window_zero():
    a = _agent()
    a.handle_sample(0.0, "t", 1.0)
    assert a.summaries is None and a.handle_sample(1.0, "t", 2.0) == []
    assert a.handle_message(1.0, _summary(a, 1)) == [] and a.summaries[0].tree.window == 16
    a.handle_message(2.0, _summary(a, 2, window=0))
    assert a.summaries == {}


def test_replicated_segments_always_enclose_the_window():
    rng = Rng(5)
    a = _agent()
    a.handle_message(0.0, _summary(a, 1, subs=0b1111))           # every segment of N = 16
    hist = []
    replica = {}
    pushes = 0
    for t in range(200):
        v = round(rng.uniform(-20.0, 20.0), 2)
        hist.append(v)
        rows = _rows(a.handle_sample(float(t), "t", v))
        pushes += len(rows)
        replica.update(rows)
        if len(hist) >= 32:
            for s in range(4):
                lo, hi, _ = replica[s]
                assert all(lo <= x <= hi for x in _segment(hist, s)), (t, s)
    assert 0 < pushes < 4 * 200


def test_forwarded_read_is_answered_and_repeated_at_the_same_instant():
    a = _agent()
    a.handle_message(0.0, _summary(a, 1))
    for t in range(40):
        assert _rows(a.handle_sample(float(t), "t", float(t % 7))) == {}      # nothing replicated: silent
    rows = _rows(a.handle_message(40.0, _summary(a, 2, read=0b0110)))
    assert sorted(rows) == [1, 2]
    again = _rows(a.handle_sample(40.0, "t", 100.0))          # a reading stamped the reply's time
    assert sorted(again) == [1, 2] and _rows(a.handle_sample(41.0, "t", 1.0)) == {}


def test_pads_widen_shipped_ranges_and_bad_controls_are_counted():
    a = _agent()
    a.handle_message(0.0, _summary(a, 1, subs=1, pad=[{"seg": 0, "w": 5.0}]))
    out = []
    for t in range(8):
        out += a.handle_sample(float(t), "t", 10.0 + (t % 2))
    rows = _rows(out)
    blobs = [p for _, p in out if codec.decode(p)[0] == "blob"]
    assert len(blobs) == 1 and rows[0][0] <= 5.0 and rows[0][1] >= 16.0
    before = a.stats["bad_messages"]
    assert a.handle_message(9.0, _summary(a, 2, window=12)) == []                 # not a power of two
    assert a.handle_message(9.0, _summary(a, 3, subs=1 << 9)) == []               # beyond the segments
    assert a.handle_message(9.0, _summary(a, 4, subs=1, pad=[{"seg": 0, "w": -1.0}])) == []
    assert a.stats["bad_messages"] == before + 3
