"""Segment mode under clock skew (backend/coordinator/core/sequence.py ``_segment``, replay.py ``_band``; DESIGN.md
§4 final answers, precision under delay and skew): a segment stamped by a clock whose lead lies in [lo, hi] starts
in event time between a − hi and a − lo, so the final mirror holds the hull of it and the piece before it until
then, and its line widened by what its slope moves in hi − lo after. Oracle: the simulator's ground truth for every
final answer (``backend.sim.final_truth``), on the fault schedules of issue #20 with the lag queries put under
skew; the same schedules with the segments placed at their stamps are wrong, so the check can fail."""
import random

from backend.coordinator.core.lines import Lines
from backend.coordinator.core.queries import parse_query
from backend.coordinator.core.sequence import Sequence
from backend.sim import engine

from test_fault_schedules import schedule

SEEDS = range(600)      # the lag schedules among them: SUM, AVG, MIN, MAX (line and constant), COUNT


def _skewed():
    """The lag schedules of the fault-schedule property, each under skew 0.1 or 0.3 s (drawn per seed)."""
    for seed in SEEDS:
        w = schedule(seed)
        if "lag" in w["queries"][0]:
            w["network"]["skew"] = random.Random(seed).choice([0.1, 0.3])
            yield seed, w


def _finals(limit=None):
    bad, finals, said, kinds, runs = [], 0, 0, set(), 0
    for seed, w in _skewed():
        if limit is not None and runs >= limit:
            break
        runs += 1
        sim = engine.simulation(w)
        res = sim.run()
        x = res["queries"]["q"]
        kinds.add((w["queries"][0]["kind"], w["queries"][0].get("segment")))
        finals += x["finals"]
        said += sum(1 for a in sim.answers if a.get("final") and "wider than precision" in (a.get("reason") or ""))
        if res["violations"] or x["final_violations"] or x["final_revoked"] or x["final_precision_misses"]:
            bad.append((seed, x["final_violations"], x["final_revoked"], x["final_precision_misses"]))
    return bad, finals, said, kinds


def test_segments_from_clocks_off_by_up_to_sigma_never_make_a_final_answer_wrong():
    bad, finals, said, kinds = _finals()
    assert bad == [], "(seed, wrong, withdrawn, wider than δ unsaid): %s" % bad[:10]
    assert finals > 3000 and said > 0       # final answers everywhere; the hulls' width said where it is past δ
    assert {"sum", "avg", "min", "max"} <= {k for k, _ in kinds} and {"line", "constant"} <= {m for _, m in kinds}


def test_segments_placed_at_their_stamps_would_be_wrong(monkeypatch):
    place = Sequence._segment
    monkeypatch.setattr(Sequence, "_segment", lambda self, key, d, r, clock: place(self, key, d, r, (0.0, 0.0)))
    bad, finals, _, _ = _finals(limit=30)
    assert len(bad) >= 5 and finals > 500, bad


def test_a_min_whose_line_widens_past_precision_says_so_when_it_does():
    # a segment's line widened by its clock (width 2.2 > δ = 2) under a constant bound: the MIN's lower end comes
    # from the falling line, its upper end from the constant one, so the answer widens as it goes (seed 541 of the
    # schedules under skew 0.1: a final answer stated 2.0 wide, 2.06 by its end). Its width reaches δ at t = 0.2: a
    # final answer from then says it is wider (before, the answer stated at t = 0.1 held on, unsaid).
    q = parse_query({"id": "q", "kind": "min", "sources": ["x", "y"], "precision": 2.0}, ["x", "y"])
    lines = Lines(q)
    lines.advance(0.0)
    lines.set("x", [0.0, 95.0, 97.2, -1.0, -1.0, None, None])
    lines.set("y", [0.0, 94.9, 96.8, 0.0, 0.0, None, None])
    t, said = 0.0, []
    while t < 1.0:
        said.append((round(t, 6), lines.line(2.0)["degraded"]))
        t = lines.next_event()
        if t < 1.0:
            lines.advance(t)
    grew = [at for at, wide in said if wide]      # (δ plus a float32 board's rounding: SLACK, 7e-4 here)
    assert said[0] == (0.0, False) and grew and 0.2 <= grew[0] < 0.2005 and said[-1][1], said
