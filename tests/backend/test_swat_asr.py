"""SWAT-ASR and baselines against the exact window (Bulut & Singh 2003 §3-5), Histogram vs brute force."""
import itertools

import numpy as np
import pytest

from backend.experiments.histogram import vopt
from backend.sim import sites
from backend.sim.engine import run
from backend.sim.workload import WorkloadError


def _wl(proto, **kw):
    w = {"window": 32, "protocol": proto, "clients": 3, "duration": 300, "phase": 10, "seed": 2,
         "data": {"generator": "weather", "interval": 1.0},
         "queries": [{"id": "q", "kind": "summary", "type": "inner", "weights": "linear", "rate": 1.0,
                      "precision": 10.0},
                     {"id": "p", "kind": "summary", "type": "point", "rate": 0.5, "precision": 15.0},
                     {"id": "r", "kind": "summary", "type": "range", "rate": 0.2, "precision": 15.0,
                      "radius": 5.0}],
         "params": {"value_range": 100.0} if proto == "dc" else {}}
    w.update(kw)
    return w


@pytest.mark.parametrize("proto", ["swat-asr", "dc", "aps"])
def test_answers_contain_the_exact_value(proto):
    r = run(_wl(proto))
    assert r["queries"] > 300 and r["violations"] == 0


def test_swat_asr_saves_messages_when_reads_dominate():
    res = {p: run(_wl(p, clients=1, data={"generator": "weather", "interval": 2.0}))["messages"]
           for p in ("swat-asr", "dc", "aps")}
    assert res["swat-asr"] < res["dc"] and res["swat-asr"] < res["aps"], res
    r = run(_wl("swat-asr", clients=7))
    assert r["cached_approximations"] <= 7 * 5          # O(M log N) approximations at the clients


def test_replicas_follow_reads_and_contract_under_writes():
    sys_ = sites.SwatAsr(16, sites=2)
    t = 0.0
    for v in range(40):
        sys_.on_data(t, 50.0 + (v % 3))
        t += 1
    for _ in range(5):
        a = sys_.on_query(t, 1, [4, 5, 6], [1.0, 1.0, 1.0], 100.0)
        assert not a["local"] and a["lo"] <= a["estimate"] <= a["hi"]
    sys_.on_phase(t)                                    # expansion: reads 5 > writes 0
    assert 2 in sys_.site[1].rows and sys_.on_query(t, 1, [4], [1.0], 100.0)["local"]
    for v in range(200):                                # wild writes, no reads: contraction
        sys_.on_data(t, float((v * 37) % 101))
        t += 1
    sys_.on_phase(t)
    assert 2 not in sys_.site[1].rows and 1 not in sys_.site[0].subscribed.get(2, set())


def test_checker_catches_stale_replicas():
    class NoPush(sites.SwatAsr):
        def _write(self, u, s, row):
            pass
    sites.SYSTEMS["broken"] = NoPush
    try:
        w = _wl("broken", data={"generator": "uniform", "interval": 1.0})
        w["queries"][0]["precision"] = 100.0
        assert run(w)["violations"] > 0
    finally:
        del sites.SYSTEMS["broken"]


def test_vopt_matches_brute_force():
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 100, 10)

    def sse(b):
        return sum(((x[a:c] - x[a:c].mean()) ** 2).sum() for a, c in zip(b[:-1], b[1:]))

    for buckets in (1, 2, 3, 4):
        best = min(sse([0, *c, 10]) for c in itertools.combinations(range(1, 10), buckets - 1))
        assert sse(vopt(x, buckets)) == pytest.approx(best)
        assert sse(vopt(x, buckets, 0.1)) <= best * 1.1 + 1e-9


@pytest.mark.parametrize("bad", [{"window": 12}, {"protocol": "nope"}, {"clients": 0}, {"duration": -1},
                                 {"queries": []}, {"queries": [{"kind": "sum"}]},
                                 {"queries": [{"kind": "summary", "type": "median"}]},
                                 {"queries": [{"kind": "summary", "window": [3, 99]}]},
                                 {"data": {"generator": "sine"}}])
def test_bad_workloads_are_refused(bad):
    w = _wl("swat-asr")
    w.update(bad)
    with pytest.raises(WorkloadError):
        run(w)
