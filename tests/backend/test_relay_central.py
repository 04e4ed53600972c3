"""Relay topology end to end: every central answer holds its bound against the exact items; messages are saved."""
import pytest

from backend.coordinator.relay import central
from backend.coordinator.core.coordinator import Coordinator
from backend.experiments import relay as experiment
from backend.sim import engine
from backend.sim.workload import WorkloadError, load
from edge.core import codec

WORKLOAD = {
    "name": "relay-test", "seed": 5, "protocol": "relay",
    "sources": {"generator": "zipf", "items": 8000, "domain": 800, "skew": 1.2, "sensors": 6},
    "relays": {"count": 2, "h": 10, "m": 40, "fdi": 60, "span": 1000},
    "network": {"delay": 0.5, "jitter": 0.3, "hop1": 0.2, "hop1_jitter": 0.2},
    "queries": [
        {"id": "c", "kind": "count", "sources": "all", "error": 0.01, "window": [0, 8000]},
        {"id": "s", "kind": "sum", "sources": ["r0"], "error": 0.02, "window": [0, 4000]},
        {"id": "sel", "kind": "count", "sources": "all", "range": [1, 200], "window": [1500, 6500]},
        {"id": "j", "kind": "join", "sources": ["r0", "r1"], "span": 3, "window": [0, 8000]},
    ],
}


def test_answers_hold_their_bounds_and_save_messages():
    res = engine.run(WORKLOAD)
    fwd = engine.run(dict(WORKLOAD, protocol="relay_forward"))
    assert res["violations"] == 0 and res["theorem_misses"] == 0 and res["late"] == 0
    assert res["bad_messages"] == 0
    for qid, q in res["queries"].items():
        assert q["answers"] > 3 and q["final"] is not None, qid
        f = q["final"]
        assert f["lo"] <= f["exact"] <= f["hi"]
    assert res["queries"]["c"]["final"]["relative_error"] <= 0.01
    assert res["messages"]["hop1"] == fwd["messages"]["hop1"] == 8000
    assert res["messages"]["backend"] < 0.7 * fwd["messages"]["backend"]
    assert fwd["violations"] == 0 and fwd["relay"]["filtered"] == 0
    assert fwd["queries"]["c"]["final"]["error_bound"] == 0
    assert res["relay"]["filtered"] == res["relay"]["items"] - res["relay"]["raw"] > 0


def test_checker_catches_a_central_side_that_trusts_forecasts(monkeypatch):
    close = central.RelayLog.close

    def overconfident(self, tb, te, delta, corr):
        close(self, tb, te, 0.0, corr)      # pretends every uncorrected forecast is exact
    monkeypatch.setattr(central.RelayLog, "close", overconfident)
    w = dict(WORKLOAD, relays=dict(WORKLOAD["relays"], delta=0.5), queries=[
        {"id": "c", "kind": "count", "sources": "all", "error": 0.5, "window": [0, 8000]}])
    assert engine.run(w)["violations"] > 0


def test_body_join_integral_matches_brute_force():
    b1, e1, b2, e2, T = 0.0, 10.0, 4.0, 20.0, 3.0
    n = 20000
    brute = sum(max(0.0, min(x + T, e2) - max(x - T, b2)) for x in
                (b1 + (i + 0.5) * (e1 - b1) / n for i in range(n))) * (e1 - b1) / n
    assert abs(central._overlap_integral(b1, e1, b2, e2, T) - brute) < 1e-6


def test_bad_workloads_and_blobs_are_rejected_clearly():
    for bad, msg in ((dict(WORKLOAD, sources={"generator": "walk"}), "zipf"),
                     (dict(WORKLOAD, relays={"count": 0}), "relays.count"),
                     (dict(WORKLOAD, relays={"count": 1, "bogus": 1}), "unknown"),
                     (dict(WORKLOAD, relays={"count": 1, "support": 3}), "support"),
                     (dict(WORKLOAD, protocol="naive"), "relay protocol"),
                     (dict(WORKLOAD, queries=[{"id": "j", "kind": "join", "sources": ["r0"], "span": 1}]), "two"),
                     (dict(WORKLOAD, queries=[{"id": "c", "kind": "count", "window": [5, 1]}]), "window")):
        with pytest.raises(WorkloadError, match=msg):
            load(bad)
    proto = central.RelayAggregate()
    coord = Coordinator(proto, period=100.0)
    from edge.core.relay import RelayNode
    r = RelayNode("r0")
    coord.handle_uplink(0.0, "r0", r.start(0.0)[0][1])
    coord.handle_uplink(0.0, "r0", codec.encode("blob", {"src": 0, "seq": 9, "t": 1.0, "tag": 9, "data": b""}))
    coord.handle_timer(1.0)
    assert coord.stats["bad_messages"] == 1 and proto.bad == 1
    with pytest.raises(ValueError, match="no params"):
        central.RelayAggregate(width=1)


def test_experiment_workload_smoke():
    res = engine.run(experiment.workload(4000, 400))
    assert res["violations"] == 0 and len(res["queries"]) == 20
