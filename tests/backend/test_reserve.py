"""The precision a query keeps for clock skew (backend/coordinator/core/reserve.py) against a brute-force
quantile of the excesses it was shown, and its effect on the widths handed out (Query.budget)."""
import copy
import random

import pytest

from backend.coordinator.core import aggregate
from backend.coordinator.core.queries import parse_query
from backend.coordinator.core.reserve import BINS, COUNT, FIRST, QUANTILE, Reserve
from backend.coordinator.precision.rows import Rows


def query(precision=10.0):
    return parse_query({"id": "q", "kind": "sum", "sources": ["a", "b"], "precision": precision}, ["a", "b"])


def test_exact_clocks_keep_no_reserve():
    r, q = Reserve(), query()
    for k in range(5 * COUNT):
        assert not r.observe(q, float(k), 10.0 - (k % 3))      # never past δ
    assert r.get("q") == 0.0


def test_the_reserve_is_the_quantile_of_the_excess_over_the_epochs():
    rng = random.Random(4)
    r, q = Reserve(), query(10.0)
    excess = [rng.choice([0.0] * 9 + [rng.uniform(0.0, 4.0)]) for _ in range(FIRST)]
    moved = [r.observe(q, float(k), 10.0 + x) for k, x in enumerate(excess)]
    assert moved[-1] and not any(moved[:-1])                # the first epoch ends after FIRST changes
    xs = sorted(excess)
    want = xs[min(len(xs) - 1, int(QUANTILE * len(xs)))]     # brute force, to the bin above
    assert want <= r.get("q") <= want + 10.0 / BINS + 1e-12
    q.reserve = r.get("q")
    assert aggregate.uniform_width(q) == (10.0 - q.reserve) / 2
    rows = Rows({"q": q})
    assert rows.budget == [10.0 - q.reserve]


def test_it_follows_the_excess_down_when_clocks_are_known_better():
    r, q = Reserve(), query(10.0)
    for k in range(FIRST):
        r.observe(q, float(k), 13.0)
    assert r.get("q") >= 3.0
    t = float(FIRST)
    for _ in range(3):                                       # answers now within δ − R: R comes down
        for _ in range(COUNT):
            t += 1.0
            r.observe(q, t, 10.0 - r.get("q"))
    assert r.get("q") == 0.0


def test_the_final_answers_are_a_stream_of_their_own_and_the_reserve_the_larger():
    # finals reach past δ − R (the hull over a report's whole uncertain window) while the provisional answers
    # stay within it: the provisional stream must not pull the reserve back down, nor dilute the finals' quantile
    rng = random.Random(5)
    r, q = Reserve(), query(10.0)
    fin = [rng.uniform(0.0, 3.0) for _ in range(FIRST)]
    for k in range(FIRST):
        r.observe(q, float(k), 10.0 - r.get("q"))            # provisional: within δ − R
        r.observe(q, float(k), 10.0 + fin[k], True)
    xs = sorted(fin)
    want = xs[min(len(xs) - 1, int(QUANTILE * len(xs)))]
    assert want <= r.get("q") <= want + 10.0 / BINS + 1e-12
    t, held = float(FIRST), r.get("q")
    for _ in range(3 * COUNT):                                # the provisional epochs end (their R is 0)
        t += 1.0
        assert not r.observe(q, t, 10.0 - r.get("q"))
    assert r.get("q") == held
    r.drop("q")
    assert r.get("q") == 0.0 and not r.q and not r.value


def _final_wide_share(protocol, skew, duration=300, seed=7):
    """The SUM's final answers on the issue's workload (backend.bench.faults.FINAL with its faults): (share of
    records, share of final answer time) wider than the precision, measured against the simulator's ground
    truth, which every one of them (degraded or not) must contain."""
    from backend.bench.faults import FAULTS, FINAL
    from backend.sim import engine
    from backend.sim.final_truth import check_final
    w = copy.deepcopy(dict(FINAL, seed=seed, duration=duration))
    w.update(name="skew", protocol=protocol, network=dict(w["network"], **dict(FAULTS, skew=skew)))
    sim = engine.simulation(w)
    res = sim.run()
    assert res["violations"] == 0 and res["precision_misses"] == 0
    fin = [a for a in sim.answers if a.get("final") and a["query"] == "total"]
    horizon = sim.coord.finals.horizon("total")
    d = sim.precisions["total"][0][1]
    whole = check_final(sim.truth.tracks["total"].timeline,
                        [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], False, a["watermark"]) for a in fin],
                        horizon, sim.precisions["total"])
    assert whole["final_violations"] == 0 and whole["final_revoked"] == 0       # degraded ones contain it too
    wide = tot = 0.0
    n = 0
    for a, b in zip(fin, fin[1:] + [{"time": horizon}]):
        span = b["time"] - a["time"]
        tot += span
        if d * (1 + 1e-9) < a["hi"] - a["lo"] < float("inf"):     # (inf: a source's value unknown, said so)
            assert a["degraded"] and a["reason"].startswith("wider than precision")
            wide += span
            n += 1
    assert len(fin) > 100 and tot > duration / 2
    return n / len(fin), wide / tot


@pytest.mark.parametrize("protocol", ["adaptive", "deadband"])
def test_final_answers_under_clock_skew_are_rarely_wider_than_the_precision(protocol):
    # the reserve learns from the final answers too: each holds the hull over every overlapping report's whole
    # uncertain window, which the provisional answers at arrival rarely show (at main, 48-67 % of the SUM's
    # final records and 21-26 % of its final time were wider than δ at skew 0.3 on 1,200 s); what is left is the
    # reserve's first epochs and its quantile
    records, time = _final_wide_share(protocol, 0.3)
    print("%s: final records wider than precision %.4f, final time %.4f" % (protocol, records, time))
    assert records <= 0.05 and time <= 0.05, (records, time)
    assert _final_wide_share(protocol, 0.0) == (0.0, 0.0)      # exact clocks: none
