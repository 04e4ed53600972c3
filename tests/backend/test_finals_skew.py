"""Final answers under clock skew (backend/coordinator/core/replay.py, DESIGN.md §4 precision under delay and skew):
while a guarded report's instant is uncertain its source's final bound is the hull of its bound before the report
and the reported value (as the live mirror's, boundcache.hold), never the whole new band; after a periodic shrink
(Olston's rule) its bound from before the tick stays while the device's clock may be behind; every final answer
contains the simulator's ground truth."""
import bisect
import copy
import math

import pytest

from backend.bench.faults import FAULTS, FINAL
from backend.coordinator.core import finals, replay
from backend.sim import engine
from backend.sim.final_truth import check_final


def _run(protocol, monkeypatch, duration=300, **spec):
    """FINAL at seed 11 with the faults (``spec``: more of the workload), the final mirror's ops and recorded bounds
    spied per source."""
    ops, known = {}, {}
    op, record = replay.Replay._op, replay.Replay._record

    def spy_op(self, key, s, t, n, kind, args, rec):
        ops.setdefault(key, []).append((t, kind, args))
        return op(self, key, s, t, n, kind, args, rec)

    def spy_record(self, key, s, t):
        known.setdefault(key, []).append((t,) + self.cache.known(key))
        return record(self, key, s, t)

    monkeypatch.setattr(replay.Replay, "_op", spy_op)
    monkeypatch.setattr(replay.Replay, "_record", spy_record)
    w = copy.deepcopy(dict(FINAL, seed=11, duration=duration, **spec))
    w.update(name="skew", protocol=protocol, network=dict(w["network"], **FAULTS))
    sim = engine.simulation(w)
    return sim, sim.run(), ops, known


@pytest.mark.parametrize("protocol", ["adaptive", "deadband"])
def test_a_guarded_reports_final_bound_is_the_hull_of_the_bound_before_and_its_value(protocol, monkeypatch):
    sim, res, ops, known = _run(protocol, monkeypatch)
    ticks = [t for t, _, _ in sim.coord.finals.replay.shrinks]
    checked = narrower = 0
    for key, seq in ops.items():
        rows = known.get(key, [])
        for i, (t0, kind, args) in enumerate(seq):
            if kind != "report" or not args[5] or args[3] <= t0:
                continue        # (not guarded within its guard time, or no uncertain window)
            hull, v = args[3], args[1]
            before = [r for r in rows if r[0] < t0]
            if not before:
                continue
            since = before[-1][0]
            others = [x for x in seq[:i] + seq[i + 1:] if since <= x[0] <= hull and x[1] != "release"]
            if others or any(since <= x <= hull for x in ticks):
                continue        # (another change of the source, or a shrink, in the window: not this oracle's)
            _, lo, hi = before[-1]
            want = (min(lo, v), max(hi, v))
            during = [r for r in rows if t0 <= r[0] < hull]
            if not during:
                continue        # (its source lost meanwhile: no bound recorded)
            for _, a, b in during:
                assert want[0] - 1e-9 <= a and b <= want[1] + 1e-9, (key, t0, hull, v, (lo, hi), (a, b))
            checked += 1
            narrower += want[1] - want[0] < (hi - lo) + abs(v - (lo + hi) / 2) - 1e-9  # the old band ∪ the new one
    assert checked > 200 and narrower > 100, (checked, narrower)
    assert res["violations"] == 0


@pytest.mark.parametrize("protocol", ["adaptive", "deadband"])
def test_every_final_answer_under_skew_and_loss_contains_the_truth(protocol, monkeypatch):
    sim, res, _, _ = _run(protocol, monkeypatch, duration=200)
    for qid in ("total", "top"):
        fin = [a for a in sim.answers if a.get("final") and a["query"] == qid]
        got = check_final(sim.truth.tracks[qid].timeline,      # degraded ones too: none is exempt
                          [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], False, a["watermark"]) for a in fin],
                          sim.coord.finals.horizon(qid), sim.precisions[qid])
        assert len(fin) > 50 and got["final_violations"] == 0 and got["final_revoked"] == 0, (qid, got)


def test_every_final_answer_wider_than_its_precision_says_its_width_on_the_faults_bench():
    # mixed-aggregates (AVG 0.5 and COUNT-in-range 0 over 16 walks, faults and skew 0.3): its precision is out of
    # reach under that skew, so many final answers are wider; each must be degraded and state the width it gives,
    # a COUNT with a lost source too (main at a9b197e: 77 said only "lost uplink: ..."). Oracle: final_truth.wider
    # over the records, and each record's own width in its reason
    from backend.bench.faults import run
    from backend.bench.report import workloads
    res = run("mixed-aggregates", dict(workloads(0.1))["mixed-aggregates"], "adaptive", FAULTS)
    assert res["final_wide"][0] > 0.01 and res["final_wide_unsaid"] == 0, (res["final_wide"], res["final_wide_unsaid"])


def test_a_periodic_shrink_keeps_the_bound_from_before_it_while_a_clock_may_be_behind(monkeypatch):
    # Olston's shrinking rule under skew: a device whose clock may be behind shrinks as late as its clock's lower
    # bound allows, so each source's final bound right after a tick is still the whole bound from before it
    # (oracle: the bound the mirror recorded before the tick, where nothing else changed the source since); and
    # every final answer holds the ground truth. Before the fix the final mirror held copies of its mirrors and
    # then shrank them too, and shrank the states held from before a report (the device leaves them by that report,
    # unshrunk): bounds narrowed at the tick (first at 2.0), and final answers at ticks missed readings the device
    # had not yet been made to report (schedule 673 of the fault schedules: p = s0 − s1 at 20.0)
    behind, cover = {}, finals.Finals.cover

    def spy_cover(self, device, t):
        until = cover(self, device, t)
        behind[device, t] = until > t       # (asked at each tick: whether the device may shrink after it)
        return until

    monkeypatch.setattr(finals.Finals, "cover", spy_cover)
    sim, res, ops, known = _run("adaptive", monkeypatch, 200, params={"rule": "shrink", "period": 2.0, "shrink": 0.2})
    ticks = [t for t, _, _ in sim.coord.finals.replay.shrinks]
    checked = 0
    for key, rows in known.items():
        times, device = [r[0] for r in rows], sim.coord.finals.replay.src[key].device
        for tick in ticks:
            i = bisect.bisect_left(times, tick)
            if i == 0 or i == len(rows) or times[i] != tick or rows[i - 1][1] == -math.inf \
                    or not behind.get((device, tick)):
                continue
            if any(times[i - 1] < x[0] <= tick for x in ops.get(key, ())):
                continue        # (a report or control of the source meanwhile: not this oracle's)
            _, lo, hi = rows[i - 1]
            assert rows[i][1] <= lo and hi <= rows[i][2], (key, tick, rows[i - 1], rows[i])
            checked += 1
    assert len(ticks) > 50 and checked > 200, (len(ticks), checked)
    for qid in ("total", "top"):
        fin = [a for a in sim.answers if a.get("final") and a["query"] == qid]
        got = check_final(sim.truth.tracks[qid].timeline,
                          [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], False, a["watermark"]) for a in fin],
                          sim.coord.finals.horizon(qid), sim.precisions[qid])
        assert len(fin) > 50 and got["final_violations"] == 0 and got["final_revoked"] == 0, (qid, got)
    assert res["violations"] == 0


@pytest.mark.parametrize("seed, skew", [(613, 0.2), (1202, 0.2), (2028, 0.2), (2470, 0.3)])
def test_a_count_in_range_holds_a_guarded_reports_hull_as_a_bound_not_as_membership(seed, skew):
    # the fault schedules' COUNT-in-range queries put under skew (found when this round's lag schedules under skew
    # were held out, with and without the lag): a guarded report of s1 re-entering [95, 105] stated the hull of its
    # bound before (92.98, out) and its value (95.94, in) until its latest instant; an unguarded report after it
    # kept that hull among the states held, as a copy of the filter, which also kept the filter's membership bit
    # (now: in), so from 1.859 the count said exactly 2 where the truth was 1 until 2.0 (schedule 2028; main at
    # e95fbac: 4 of the 88 COUNT-in-range schedules wrong at skew 0.1-0.3, real time and final alike)
    from test_fault_schedules import schedule
    w = schedule(seed)
    w["network"]["skew"] = skew
    w["queries"][0].pop("lag", None)
    assert w["queries"][0]["kind"] == "count" and "range" in w["queries"][0]
    res = engine.simulation(w).run()
    q = res["queries"]["q"]
    assert res["violations"] == 0 and q["final_violations"] == 0 and q["answers"] > 20, q
