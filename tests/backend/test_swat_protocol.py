"""SWAT-ASR and its baselines through the main simulator: real agents, coordinator, codec, ground truth
(Bulut & Singh 2003 §3-4). Every summary answer must hold the exact window value at its time."""
import random

import pytest

from backend.coordinator import protocols
from backend.coordinator.core.queries import SUMMARY_TYPES, SUMMARY_WEIGHTS
from backend.coordinator.swat import replication
from backend.sim import engine
from backend.sim.workload import WorkloadError, load


def summary_workload(seed, protocol, duration=200):
    r = random.Random(seed)
    window = r.choice([8, 16, 32])
    queries = []
    for j in range(3):
        t = r.choice(SUMMARY_TYPES)
        a = r.randrange(window)
        b = r.randrange(a, window)
        q = {"id": "q%d" % j, "kind": "summary", "sources": ["s%d" % j], "type": t,
             "window": r.choice(["random", [a, b]]) if t != "point" else [a, a],
             "weights": r.choice(SUMMARY_WEIGHTS), "precision": round(r.uniform(1.0, 40.0), 2),
             "every": r.choice([1, 2])}
        if t == "range":
            q.update({"value": 100.0, "radius": r.uniform(0.5, 5.0)})
        queries.append(q)
    delay = r.choice([0.0, 0.2])
    return {"name": "summary-%d" % seed, "seed": seed, "duration": duration, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": 3, "per_device": r.choice([1, 3]),
                        "start": [95, 105], "step": [0.2, 2.0], "interval": r.choice([0.5, 1.0])},
            "queries": queries, "network": {"delay": delay, "jitter": r.choice([0.0, delay / 2])},
            "params": {"period": r.choice([1, 2]), "window": window, "phase": r.choice([5, 10])}}


@pytest.mark.parametrize("protocol", ["swat", "swat-aps", "swat-dc"])
def test_summary_answers_hold_the_exact_window(protocol):
    for seed in range(4):
        res = engine.run(summary_workload(seed, protocol))
        checked = sum(q["checked"] for q in res["queries"].values())
        assert res["violations"] == 0 and res["late"] == 0, (seed, res["queries"])
        assert checked > 150, (seed, res["queries"])
        assert res["by_kind"].get("blob", 0) > 0 and res["by_kind"].get("report", 0) <= 2 * 3     # first reading, assignment ack


def test_swat_asr_replicates_what_is_read_and_answers_locally():
    w = summary_workload(1, "swat", duration=300)
    w["queries"] = [{"id": "p", "kind": "summary", "sources": ["s0"], "type": "point", "window": [2, 2],
                     "precision": 50.0}]
    res = engine.run(w)
    st = res["protocol_stats"]
    assert res["violations"] == 0 and st["local"] > 0.8 * st["reads"], st
    # the device pushes only when the replica no longer encloses: far fewer blobs than readings
    assert res["by_kind"]["blob"] < res["samples"] / 3


def test_checker_catches_a_broken_replica():
    class Shrunk(replication.SwatReplication):
        """Keeps every pushed range a third narrower than the device sent."""
        name = "swat-broken"

        def blob(self, coord, device, m):
            replication.SwatReplication.blob(self, coord, device, m)
            for st in self.src.values():
                for g, (lo, hi, mean) in list(st.rows.items()):
                    st.rows[g] = (lo + (hi - lo) / 3, hi - (hi - lo) / 3, mean)
    protocols.PROTOCOLS["swat-broken"] = Shrunk
    try:
        w = summary_workload(2, "swat-broken", duration=300)
        for q in w["queries"]:
            q["precision"] = 1e6                    # every read answered from the (corrupted) replica
        assert engine.run(w)["violations"] > 0
        assert engine.run(summary_workload(2, "swat", duration=300))["violations"] == 0
    finally:
        del protocols.PROTOCOLS["swat-broken"]


@pytest.mark.parametrize("bad", [{"sources": ["s0", "s1"]}, {"type": "median"}, {"window": [5, 2]},
                                 {"weights": "cubic"}, {"weights": [1, 2], "window": "random"},
                                 {"type": "range", "window": [0, 3]}, {"every": 0}])
def test_bad_summary_queries_are_refused(bad):
    w = summary_workload(0, "swat")
    w["queries"] = [dict({"id": "x", "kind": "summary", "sources": ["s0"], "precision": 1.0}, **bad)]
    with pytest.raises(WorkloadError):
        load(w)


def test_bad_protocol_params_are_refused():
    for params in ({"window": 12}, {"k": 3}, {"phase": 0}):
        with pytest.raises(ValueError):
            replication.SwatReplication(**params)
