"""The offline filter replays of backend.sim.headroom against the simulator and the clairvoyant minima."""
import os
import random

from backend.sim import engine, headroom
from backend.sim.clairvoyant import minimum_reports, minimum_segments


def _walks(n_src=3, n=400, seed=7):
    rng = random.Random(seed)
    out = {}
    for k in range(n_src):
        x, s, t, v = 0.0, rng.uniform(-0.5, 0.5), [], []
        for i in range(n):
            s += rng.gauss(0, 0.05)
            x += s + rng.gauss(0, 1.0)
            t.append(float(i))
            v.append(round(x, 6))
        out["s%d" % k] = (t, v)
    return out


def test_the_deadband_replay_counts_the_simulators_deadband_reports(tmp_path):
    data = _walks()
    path = os.path.join(tmp_path, "walk.csv")
    with open(path, "w") as fh:
        fh.write("time,source,value\n")
        rows = sorted((t, s, x) for s, (ts, vs) in data.items() for t, x in zip(ts, vs))
        fh.writelines("%.6f,%s,%r\n" % r for r in rows)
    width = 4.0
    r = engine.run({"name": "walk", "seed": 0, "protocol": "deadband", "params": {"models": "constant"},
                    "duration": 399.0, "sources": {"trace": path},
                    "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": width}]})
    assert r["violations"] == 0
    births = len(data)          # one device per trace source, one birth each
    replayed = sum(headroom.replay(headroom.Constant(width / 2), t, v) for t, v in data.values())
    assert r["messages"]["up"] - births == replayed


def test_no_variant_beats_the_clairvoyant_minima():
    for seed in range(6):
        for t, v in _walks(2, 300, seed).values():
            width = random.Random(seed).uniform(1.0, 8.0)
            got = headroom.measure(t, v, width, 1.0, t[-1])
            pc, pl = minimum_reports(v, width), minimum_segments(t, v, width)
            assert got["clairvoyant_pc"] == pc and got["clairvoyant_pl"] == pl
            for k, n in got.items():
                assert n >= pl, (k, n, pl)          # every variant sends lines (a constant is one)
            for k in ("deadband", "lead 0.5"):
                assert got[k] >= pc
            assert got["oracle (all)"] == min(n for k, n in got.items() if not k.startswith(("clair", "chooser")))


def test_an_exact_line_follows_a_ramp_with_two_reports_and_the_hull_needs_more():
    t = [float(i) for i in range(100)]
    v = [3.0 * x for x in t]
    assert headroom.replay(headroom.Line(1.0, headroom.two), t, v) == 2
    assert headroom.replay(headroom.Line(1.0, headroom.last), t, v) == 2
    assert headroom.replay(headroom.Constant(1.0), t, v) == 100        # each step (3) leaves ±1
    # the hull of a slope-3 line over 1.875 intervals is wider than the width 2: constant, every step
    assert headroom.replay(headroom.Line(1.0, headroom.two, 1.0, 1.875, 1.0), t, v) == 100
    # the chooser starts the line once the shadow costs say so, then stays on it
    n = headroom.chooser([lambda: headroom.Constant(1.0), lambda: headroom.Line(1.0, headroom.two)], t, v)
    assert 2 < n < 20
