"""Brownian protocol: measured fidelity >= p on DBM paths, interruption widening, EDF/penalty scheduling."""
import math
import random

import pytest

from backend.coordinator.brownian import deferral as brownian
from backend.coordinator.brownian import calibration, scheduling
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import PROTOCOLS, make
from backend.sim import engine
from backend.sim.workload import WorkloadError, load
from edge.agent import Agent

SOURCES = ["s%d" % i for i in range(9)]


def dbm_workload(seed, p=0.95, duration=2500, precision=3.0, outages=None, protocol="brownian", params=None,
                 only=None):
    src = {"generator": "brownian", "count": 9, "start": [90, 110], "drift": [-0.01, 0.01],
           "volatility": [0.2, 0.6], "interval": 1.0, "arrival": "exponential"}
    if outages:
        src["outages"] = outages
    return {"name": "dbm", "seed": seed, "duration": duration, "protocol": protocol, "sources": src,
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": precision, "confidence": p},
                        {"id": "sum", "kind": "sum", "sources": SOURCES[:4], "weights": [1, -1, 2, 0.5],
                         "precision": 2 * precision, "confidence": p}],
            "params": dict({"period": 1.0}, **(params or {}))} if only is None else dict(
        dbm_workload(seed, p, duration, precision, outages, protocol, params),
        queries=[{"id": only, "kind": only, "sources": "all", "precision": precision, "confidence": p}])


def test_measured_fidelity_meets_the_promised_confidence():
    checks = hits = 0
    for seed in range(3):
        res = engine.run(dbm_workload(seed))
        for q in res["queries"].values():
            assert q["guarantee"] == "probabilistic" and q["confidence"] == 0.95
            assert q["fidelity"] >= 0.95, q          # time fraction: above p (Δt is the last safe instant)
            checks += q["checks"]
            hits += q["check_fidelity"] * q["checks"]
        assert res["violations"] == 0               # probabilistic answers are measured, not counted
        assert res["probes"] < 0.4 * res["samples"]    # deferral: far fewer probes than readings
    # per-evaluation fidelity ≈ p (Zhu Table 2): within p - 1% - 3 standard errors
    f = hits / checks
    assert f >= 0.95 - 0.01 - 3 * math.sqrt(0.95 * 0.05 / checks), (f, checks)


class _Overdeferring(brownian.Brownian):
    """Defers six times longer than Eq. 7 allows: its answers must be caught missing the truth."""
    name = "overdeferring"

    def _complete(self, coord, st, t):
        brownian.Brownian._complete(self, coord, st, t)
        st.deadline = t + 6 * (st.deadline - t)


def test_fidelity_checker_catches_an_overdeferring_protocol(monkeypatch):
    monkeypatch.setitem(PROTOCOLS, "overdeferring", _Overdeferring)
    res = engine.run(dbm_workload(1, protocol="overdeferring", only="avg", params={"calibrate": False}))
    q = res["queries"]["avg"]
    assert q["fidelity"] < 0.9 and q["check_fidelity"] < 0.9, q   # model: P(|Z| <= 1.96/sqrt(6)) = 0.58


def test_calibration_pulls_an_overdeferring_model_back_to_its_confidence(monkeypatch):
    """The measured misses speed the model up until the promise holds again (calibration.py)."""
    monkeypatch.setitem(PROTOCOLS, "overdeferring", _Overdeferring)
    res = engine.run(dbm_workload(1, protocol="overdeferring", only="avg", duration=8000))
    q = res["queries"]["avg"]
    n = q["checks"]
    # miss share <= 1 - p + log(D)/(RATE n) (calibration.py); D ~ 6 undoes the 6x, one step more at most
    assert q["check_fidelity"] >= 0.95 - math.log(6 * math.exp(calibration.RATE)) / (calibration.RATE * n), (q, n)
    assert q["fidelity"] >= 0.95 - 0.01, q


def test_interruptions_widen_answers_degraded_with_reason():
    out = {"rate": 0.002, "mean_length": 60.0}
    res = engine.run(dbm_workload(4, outages=out), answers=None)
    for q in res["queries"].values():
        assert q["degraded_time"] > 100
        assert q["degraded_fidelity"] >= 0.94, q
        assert q["fidelity"] >= 0.94, q
    # the coordinator's default hook widens a deterministic protocol's stale bounds the same way
    res = engine.run(dbm_workload(4, outages=out, protocol="deadband"))
    assert res["violations"] == 0
    for q in res["queries"].values():
        assert q["degraded_time"] > 100 and q["degraded_fidelity"] >= 0.95, q


def _outage_pair(protocol):
    c = Coordinator(protocol, period=1.0, beat=0.0)     # (no watchdog: this harness answers it after the Will)
    c.declare_sources(["a", "b"])
    c.add_query({"id": "s", "kind": "sum", "sources": ["a", "b"], "precision": 4.0, "confidence": 0.9}, 0.0)
    return c, Agent("d", ["a", "b"], boot=1)


def _run(c, a, now, out):
    acts = []
    for _, p in out:
        acts += c.handle_uplink(now, "d", p)
    acts += c.handle_timer(now)
    answers = []
    while acts:
        nxt = []
        for act in acts:
            if act[0] == "down":
                for _, p in a.handle_message(now, act[2]):
                    nxt += c.handle_uplink(now, "d", p)
            elif not act[1].get("final"):       # (provisional answers; finals: test_finals)
                answers.append(act[1])
        acts = nxt
    return answers


def test_coordinator_widens_offline_sources_by_the_model_and_says_why():
    c, a = _outage_pair(make("deadband"))
    _run(c, a, 0.0, a.start(0.0))
    v = 100.0
    for k in range(1, 41):           # a steady climb of 0.5/s with noise: μ ≈ 0.5
        v += 0.5 + (0.3 if k % 2 else -0.3)
        _run(c, a, float(k), a.handle_sample(float(k), "a", v) + a.handle_sample(float(k), "b", 10.0 + 3 * (k % 3)))
    mu, s2 = c.models.params("a")
    assert abs(mu - 0.5) < 0.05 and s2 > 0
    before = c.interval(c.queries["s"])
    ans = _run(c, a, 40.5, [("state", a.will())])
    assert ans[-1]["degraded"] and "offline: a, b" in ans[-1]["reason"] and "confidence 0.9" in ans[-1]["reason"]
    ans = _run(c, a, 60.0, [])
    lo, hi = ans[-1]["lo"], ans[-1]["hi"]
    # moved by μτ and widened by z σ sqrt(τ) (Bonferroni over two offline sources)
    assert (lo + hi) / 2 > (before[0] + before[1]) / 2 + 0.8 * 0.5 * 19.5 and hi - lo > before[1] - before[0] + 5
    ans = _run(c, a, 61.0, a.start(61.0))
    assert not ans[-1]["degraded"] and "reason" not in ans[-1]


def test_brownian_answers_hold_through_an_outage_extrapolating_the_drift():
    c, a = _outage_pair(make("brownian", min_obs=5))
    _run(c, a, 0.0, a.start(0.0))
    v = 0.0
    for k in range(1, 60):
        v += 1.0 + (0.2 if k % 2 else -0.2)
        _run(c, a, float(k), a.handle_sample(float(k), "a", v) + a.handle_sample(float(k), "b", 5.0))
    _run(c, a, 59.5, [("state", a.will())])
    ans = _run(c, a, 80.0, [])[-1]
    true_then = v + 20.5 + 5.0
    assert ans["degraded"] and ans["guarantee"] == "probabilistic"
    assert ans["lo"] <= true_then <= ans["hi"], (ans, true_then)


def test_penalty_order_under_overload_and_edf_otherwise():
    calm = scheduling.Task("calm", 10.0, 3, mu=0.0, sigma=0.1)
    wild = scheduling.Task("wild", 11.0, 3, mu=0.5, sigma=4.0)
    cheap = scheduling.Task("cheap", 12.0, 1, mu=0.0, sigma=1.0)
    assert [k.id for k in scheduling.plan([wild, calm, cheap], 10.0, 7, 1.0)] == ["calm", "wild", "cheap"]
    # overload: the volatile task and the cheap one go first, EDF would have picked "calm"
    assert [k.id for k in scheduling.plan([wild, calm, cheap], 10.0, 4, 1.0)] == ["wild", "cheap"]
    assert [k.id for k in scheduling.plan([wild, calm, cheap], 10.0, 4, 1.0, "edf")] == ["calm", "cheap"]
    assert scheduling.penalty(0.5, 2.0, 4.0) == 0.5 * 4 + 2.0 * 2 and scheduling.penalty(1, 1, -1) == 0
    with pytest.raises(ValueError):
        scheduling.plan([calm], 0.0, 1, 1.0, "fifo")


def test_adaptive_scales_under_a_probe_capacity_where_naive_falls_behind():
    params = {"capacity": 5.0}
    naive = engine.run(dbm_workload(2, duration=600, params=dict(params, defer=False)))
    adapt = engine.run(dbm_workload(2, duration=600, params=params))
    n, a = naive["protocol_stats"], adapt["protocol_stats"]
    assert n["late"] > 3 * a["late"] and n["penalty"] > 5 * a["penalty"], (n, a)
    assert adapt["queries"]["avg"]["check_fidelity"] > naive["queries"]["avg"]["check_fidelity"] - 0.05


def test_bad_parameters_and_workload_keys_are_rejected_clearly():
    for bad in ({"capacity": 0}, {"order": "fifo"}, {"confidence": 1.5}, {"defer": "yes"}, {"tmax": math.inf}):
        with pytest.raises(ValueError):
            make("brownian", **bad)
    w = dbm_workload(0)
    w["queries"][0]["confidence"] = 1.0
    with pytest.raises(WorkloadError, match="confidence"):
        load(w)
    w = dbm_workload(0, outages={"rate": -1, "mean_length": 5})
    with pytest.raises(WorkloadError, match="outages.rate"):
        load(w)
    w = dbm_workload(0)
    w["sources"]["volatility"] = [-1, 1]
    with pytest.raises(WorkloadError, match="volatility"):
        load(w)


@pytest.mark.parametrize("kind", ["sum", "avg", "max"])
def test_a_huge_query_resynchronises_after_a_link_loss_in_linear_time_with_sound_widenings(kind, monkeypatch):
    """A link loss takes every source of one query offline; the devices come back one birth at a time in
    random order. After every birth the answer equals the aggregate over each source's widened bound
    (the brute-force oracle), is at least as wide as a widening built afresh (sources back before the
    next tick leave the others' widths as they were), says how many sources are still offline, and the
    model is asked for O(n) predictions in all, not one per offline source per birth."""
    import random
    from backend import host as hostmod
    from backend.coordinator.brownian import interruption
    from backend.coordinator.core import aggregate
    from edge.core import codec
    n, rng = 120, random.Random(kind)
    h = hostmod.Host(protocol="naive", period=10.0, latency=0.0)
    seq = {}

    def send(t, d, kind_, body):
        seq[d] = seq.get(d, 0) + 1
        body.update(seq=seq[d], t=t)
        return h.record(t, "d%d" % d, "state" if kind_ == "birth" else "up", codec.encode(kind_, body))
    for d in range(n):
        send(0.0, d, "birth", {"boot": 1, "fw": "t", "caps": 0, "first": 0,
                               "sources": [{"name": "s%d" % d, "epoch": 0, "width": 0.0, "v": 100.0}]})
    spec = {"kind": kind, "sources": ["s%d" % d for d in range(n)], "precision": 5.0}
    if kind == "sum":
        spec["weights"] = [rng.choice([-2.0, 0.5, 1.0, 3.0]) for _ in range(n)]
    h.spec(0.5, "q", spec)
    for k in range(1, 15):                       # enough readings for every source's model
        for d in range(n):
            send(k + d * 1e-4, d, "report", {"src": 0, "epoch": 0, "v": 100.0 + rng.gauss(0.3 * k, 1.0), "why": 0})
    h.record(20.0, None, "link", b"lost")
    h.record(25.0, None, "tick", b"")
    h.record(26.0, None, "link", b"restored")
    calls = [0]
    predict = interruption.Models.predict

    def counted(self, key, tau):
        calls[0] += 1
        return predict(self, key, tau)
    monkeypatch.setattr(interruption.Models, "predict", counted)
    c, q = h.coord, h.coord.queries["q"]
    order = rng.sample(range(n), n)
    for i, d in enumerate(order):
        out = send(27.0 + i * 1e-3, d, "birth", {"boot": 1, "fw": "t", "caps": 0, "first": 0,
                                                  "sources": [{"name": "s%d" % d, "epoch": 0, "width": 0.0, "v": 101.0}]})
        answers = [a[1] for a in out if a[0] == "answer"]
        still = sum(1 for s in q.sources if s in c.models.off_since)
        if not still:
            assert answers and not answers[-1]["degraded"]
            break
        got = c.interval(q)
        w = c.models.widening(c, q)
        want = aggregate.answer(q, w.widened(c.cache.known))
        pad = 1e-9 * (1.0 + abs(want[0]) + abs(want[1]))
        assert abs(got[0] - want[0]) <= pad and abs(got[1] - want[1]) <= pad, (i, got, want)
        before = calls[0]           # the oracle's own predictions are not the coordinator's
        fresh = aggregate.answer(q, interruption.Widening(c.models, c, q).widened(c.cache.known))
        calls[0] = before
        assert got[0] <= fresh[0] + pad and fresh[1] <= got[1] + pad
        assert w.m == still
        if answers and still > 8:
            assert "(+%d)" % (still - 8) in answers[-1]["reason"]
    assert calls[0] <= 4 * n, calls[0]


def _seasonal(tmp_path, n=3, duration=4000, step=10, jitter=False, shape=lambda t, i: 10 * math.sin(2 * math.pi * t / 600 + i)
              + 0.002 * t + 0.3 * math.sin(7.3 * t + i * i)):
    """Daily-cycle-like sources (by default a sine of period 600 s plus a trend), sampled every ``step`` s
    (or 1 to 2 step - 1 s apart with ``jitter``) and held between samples: not DBM paths, like the traces."""
    path = tmp_path / "seasonal.csv"
    with open(path, "w") as fh:
        fh.write("time,source,value\n")
        t, gaps = 0, random.Random(5)
        while t < duration:
            for i in range(n):
                v = shape(t, i)
                fh.write("%d,s%d,%r\n" % (t, i, v))
            t += gaps.randint(1, 2 * step - 1) if jitter else step
    return {"name": "seasonal", "seed": 0, "duration": duration, "protocol": "brownian",
            "sources": {"trace": str(path)}, "params": {"period": 1.0, "tmax": 400.0},
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 1.0, "confidence": 0.95}]}


def test_calibrated_fidelity_holds_on_a_stream_that_is_no_dbm_path(tmp_path):
    """Seasonal sources held between irregular samples (1-39 s apart, so no hold is trusted): the fitted
    model alone over-defers, the calibrated one keeps its confidence within the sampling noise of its
    checks (and DESIGN's 1 %)."""
    spec = _seasonal(tmp_path, jitter=True, step=20)
    out = {}
    for cal in (False, True):
        r = engine.run(dict(spec, params=dict(spec["params"], calibrate=cal)))
        q = r["queries"]["avg"]
        out[cal] = (q["fidelity"], 0.95 - 0.01 - 3 * math.sqrt(0.95 * 0.05 / q["checks"]))
        assert r["violations"] == 0 and q["guarantee"] == "probabilistic"
    assert out[False][0] < out[False][1], out          # the workload is one the model alone fails on
    assert out[True][0] >= out[True][1], out


@pytest.mark.parametrize("pattern", ["all", "bursts", "random", "none"])
def test_calibration_bounds_the_missed_share_on_every_prefix(pattern):
    """Batch oracle: after n checks the share missed is <= 1 - p + log(D)/(RATE n), whatever the outcomes."""
    import random
    rnd = random.Random(7)
    outcome = {"all": lambda i: True, "bursts": lambda i: i % 100 < 6,
               "random": lambda i: rnd.random() < 0.3, "none": lambda i: False}[pattern]
    p, cal, misses, capped = 0.95, calibration.Calibration(), 0, False
    for n in range(1, 2001):
        miss = outcome(n)
        misses += miss
        cal.check(miss, p)
        assert cal.checks == n and cal.misses == misses and cal.dilation >= 1.0
        capped = capped or cal.log_d >= calibration.MAX_LOG      # the bound holds while D never hit its cap
        if not capped:
            assert misses / n <= 1 - p + cal.log_d / (calibration.RATE * n) + 1e-12, (n, misses, cal.log_d)
    if pattern == "none":
        assert cal.dilation == 1.0          # never bolder than the fitted model
    if pattern == "bursts":
        assert not capped and misses / 2000 > 0.05     # the bound was exercised: more misses than 1 - p


def test_calibrate_must_be_a_boolean():
    with pytest.raises(ValueError, match="calibrate"):
        brownian.Brownian(calibrate="yes")


@pytest.mark.parametrize("probe_every", [0.7, 3.0, 13.0])
def test_a_learnt_hold_never_expects_a_periodic_source_to_change_late(probe_every):
    """Oracle: a source sampled every 50 s changes at each sample; on every prefix of its probe replies
    the hold says no change before ``due``, which is never after the source's next real change."""
    from backend.coordinator.brownian.holds import Holds
    h, rnd = Holds(), random.Random(3)
    t, changes, holds = 0.0, [], set()
    while t < 5000:
        t += probe_every * (0.5 + rnd.random())
        h.observe("s", t, float(int(t // 50)))                 # the reading held since the last sample
        nxt = (t // 50 + 1) * 50
        assert h.due(["s"]) <= nxt, (t, h.state["s"])
        if h.due(["s"]) > -math.inf:
            holds.add(round(h.state["s"][4], 6))
        changes.append(nxt)
    if probe_every < 50 / 2:
        assert holds and max(holds) > 40, holds            # probed well within a sample interval: learnt
    assert h.due(["s", "never-probed"]) == -math.inf


def test_a_stepped_trace_is_followed_near_its_own_cadence(tmp_path):
    """Readings that change once per 100 ticks: probes cluster after each sample instead of every few ticks."""
    rnd = random.Random(11)
    levels = [[100.0 + sum(rnd.gauss(0, 1) for _ in range(k + 1)) for k in range(60)] for i in range(4)]
    spec = _seasonal(tmp_path, n=4, duration=6000, step=100, shape=lambda t, i: levels[i][int(t // 100)])
    spec["queries"][0]["precision"] = 0.2
    r = engine.run(spec)
    q = r["queries"]["avg"]
    assert q["fidelity"] >= 0.95 - 0.01 - 3 * math.sqrt(0.95 * 0.05 / q["checks"]), q
    assert r["probes"] < 0.1 * 4 * 6000, r["probes"]      # a tenth of probing every tick (13,024 without holds)

