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


def _live_relay_count(skew, lead, delay=0.0002, seed=3):
    """A relay node closed-loop with a Host (as the live coordinator drives it): items every 50 ms, the
    relay's clock ``lead`` s ahead of the backend's, the backend covering clocks within ``skew``; returns the
    exact count in the window by the relay's stamps (the truth a gateway logs) and the final answers."""
    import random
    from backend.host import Host
    from edge.core.relay import RelayNode
    rnd = random.Random(seed)
    h = Host(protocol="relay", skew=skew, latency=0.5, period=1.0, shrink=0.0, t0=0.0, declared=["r"])
    relay = RelayNode("r", h=10, m=32, support=0.02, fdi=50, delta=0.1, span=2.0, lag=0.5)
    window, answers = [6.0, 18.0], []

    def deliver(now, outs):     # ``now``: the backend's clock; the relay reads ``now + lead``
        for ch, p in outs:
            for a in h.record(now + delay, "r", ch, p):
                if a[0] == "down":
                    deliver(now + 2 * delay, relay.handle_message(now + 2 * delay + lead, a[2]))
                elif a[0] == "answer":
                    answers.append(a[1])
    deliver(0.0, relay.start(lead))
    for a in h.spec(0.01, "c", {"kind": "count", "sources": ["r"], "window": window, "error": 0.1, "range": [0, 40]}):
        if a[0] == "down":
            deliver(0.02, relay.handle_message(0.02 + lead, a[2]))
    items, t = [], 0.05
    while t < 25:
        k = min(int(rnd.expovariate(0.1)), 60)
        items.append((t + lead, k))
        deliver(t, relay.handle_item(t + lead, k, t + lead))
        deliver(t, relay.handle_timer(t + lead))
        answers.extend(a[1] for a in h.timer(t + delay) if a[0] == "answer")
        t = round(t + 0.05, 6)
    exact = sum(1 for ti, k in items if window[0] < ti <= window[1] and 0 <= k <= 40)
    return exact, [a for a in answers if a.get("query") == "c" and a.get("final")]


@pytest.mark.parametrize("skew,lead", [(0.0, 0.0), (0.1, 0.0), (0.1, 0.03), (0.0, 0.0004)])
def test_live_relay_count_holds_with_clock_placement(skew, lead):
    """The backend places a report by its device's clock bounds (σ = ``skew``; a relay clock a rounding ahead
    bounds the lead above 0 even at σ = 0): a relay's bodies name their lifetime in the relay's clock, so they
    must be matched by their stamps, not their placed times (else the forecasts drop and the COUNT is short:
    100 for 239 at σ = 0.1 before)."""
    exact, final = _live_relay_count(skew, lead)
    assert final, "no final answer"
    a = final[-1]
    assert a["lo"] <= exact <= a["hi"] and a["aligned"], (exact, a)
    assert a["hi"] - a["lo"] <= 0.1 * exact + 2, a         # the relative error η the query asked for
