"""Filter models per source (edge.core.predict) end to end: the simulator's ground truth at every instant,
the time-aware bound cache, the ``models`` setting, and devices that predate lines."""
import math
import os
import sys

import pytest

from backend import host
from backend.coordinator.core.boundcache import BoundCache
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from backend.sim import engine
from edge.core import codec
from edge.core.codec import CAP_LINE, CAP_MS


def _drift(models, protocol="deadband", seed=1, arrival="periodic"):
    return {"seed": seed, "duration": 1500, "protocol": protocol,
            "sources": {"generator": "brownian", "count": 12, "per_device": 3, "start": [0, 50],
                        "drift": [-0.8, 0.8], "volatility": [0.02, 0.2], "interval": 1, "arrival": arrival},
            "queries": [{"id": "tot", "kind": "sum", "sources": "all", "precision": 30},
                        {"id": "hi", "kind": "max", "sources": ["s%d" % i for i in range(6)], "precision": 4},
                        {"id": "lo", "kind": "min", "sources": ["s%d" % i for i in range(4, 12)], "precision": 3},
                        {"id": "band", "kind": "count", "sources": "all", "range": [10, 40]}],
            "network": {"delay": 0.2, "jitter": 0.1}, "params": {"models": models}}


def _total(r):
    return r["messages"]["up"] + r["messages"]["down"]


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_lines_hold_every_answer_and_save_on_drifts(protocol):
    runs = {m: engine.run(_drift(m, protocol)) for m in ("constant", "linear", "choose")}
    for m, r in runs.items():       # (a COUNT answer has no precision to miss)
        assert r["violations"] == 0, (m, r["queries"])
        assert all(q["precision_misses"] == 0 for qid, q in r["queries"].items() if qid != "band"), m
    assert _total(runs["linear"]) < 0.25 * _total(runs["constant"])
    assert _total(runs["choose"]) < 0.25 * _total(runs["constant"])


def test_irregular_readings_force_gap_reports_and_answers_stay_true():
    """Poisson readings: a line often runs out of readings (a gap report); answers stay true, and the
    choice, which counts those reports in shadow, does not lose to the constant model."""
    gaps = []
    sim = engine.Simulation(_drift("linear", arrival="exponential", seed=3))
    send = sim.send

    def spy(now, hop, end, payload, link=None):
        if hop == "up":
            kind, m = codec.decode(payload)
            gaps.append(kind == "report" and m["why"] == codec.WHY_GAP)
        return send(now, hop, end, payload, link)
    sim.send = spy
    r = sim.run()
    assert r["violations"] == 0 and r["queries"]["tot"]["precision_misses"] == 0 and sum(gaps) > 100
    runs = [engine.run(_drift(m, arrival="exponential", seed=3)) for m in ("choose", "constant")]
    assert runs[0]["violations"] == 0 and _total(runs[0]) <= _total(runs[1]) + 12


def test_choice_is_no_regret_on_random_walks():
    spec = {"seed": 4, "duration": 1500, "protocol": "deadband",
            "sources": {"generator": "random_walk", "count": 12, "per_device": 2, "start": [90, 110],
                        "step": [0.1, 2.0]},
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 3}]}
    runs = {m: engine.run(dict(spec, params={"models": m})) for m in ("constant", "linear", "choose")}
    assert all(r["violations"] == 0 for r in runs.values())
    assert _total(runs["linear"]) > _total(runs["constant"])              # lines lose on noise...
    assert _total(runs["choose"]) <= _total(runs["constant"]) + 12          # ...and the choice does not


def test_cache_states_the_hull_of_the_line_over_the_window_and_restates_it():
    cache = BoundCache()
    cache.add("k", "d", 0, 4.0, 1, unit=1000)
    cache.now = 10.0
    cache.report("k", 1, 10.0, 5.0, line=(10000, 0.001, 1000))    # 1 per second, readings every <= 1 s
    f = cache.sources["k"].filt
    h = 2.0 - 0.001 * 1250 / 2                                      # W/2 − |slope|·(gap + gap/4)/2
    assert f.half() == h
    assert cache.known("k") == (5.0 - h, 5.0 + 0.25 + h)            # [t0, t0 + H]
    cache.now = 12.0
    lo, hi = cache.known("k")
    assert (lo, hi) == (6.0 - h, 7.25 + h) and hi - lo <= 4.0       # [now − gap, now + H]: never wider than W
    assert cache.next_due() == 10.25 and cache.refreshes(10.25) == ["k"] and cache.next_due() == 10.5
    cache.report("k", 1, 12.5, 7.0)                                  # a constant report ends the line
    assert cache.next_due() == math.inf and cache.known("k") == (5.0, 9.0)


def _birth(caps, c=None):
    c = c or Coordinator(make("deadband"), period=10.0, models=3)
    birth = codec.encode("birth", {"seq": 1, "t": 1000, "boot": 1, "fw": "old", "caps": caps, "first": 0,
                                   "sources": [{"name": "x", "epoch": 0, "width": 1.0, "v": 1.0}]})
    out = c.handle_uplink(1.0, "d", birth) + c.handle_timer(2.0)
    return [m for m in (codec.decode(a[2]) for a in out if a[0] == "down") if m[0] in ("config", "setup")]


def test_lines_of_a_millisecond_device_are_mirrored_in_integer_ms():
    """The wire carries times as doubles; the mirror computes H = gap // 4 in integers as the board did."""
    c = Coordinator(make("deadband"), period=10.0, models=3)
    _birth(CAP_MS | CAP_LINE, c)
    c.handle_uplink(2.0, "d", codec.encode("line", {"src": 0, "epoch": 0, "seq": 2, "t": 2000, "v": 1.0, "why": 0,
                                                   "slope": 0.0001, "gap": 87}))
    f = c.cache.sources["x"].filt
    assert (f.t0, f.gap) == (2000, 87) and isinstance(f.gap, int) and isinstance(f.t0, int) and f.slope


def test_a_device_without_lines_gets_a_plain_config_and_a_new_one_a_setup():
    assert [k for k, _ in _birth(CAP_MS)] == ["config"]
    (kind, m), = _birth(CAP_MS | CAP_LINE)
    assert kind == "setup" and m["allow"] == 3


def test_models_setting_rides_in_params_and_bad_names_are_refused():
    s = host.settings(protocol="adaptive", params={"models": "linear", "cost": 2})
    assert s["models"] == "linear" and s["params"] == {"cost": 2}
    assert host.build(s).allow == 2 and host.build().allow == host.MODELS[host.DEFAULT_MODELS]
    with pytest.raises(ValueError, match="models"):
        host.settings(models="quadratic")


def test_lines_reach_the_live_adapter_and_the_spark_path_with_the_simulators_answers():
    """The ``lines`` case of the driver comparison (test_determinism) does run on lines."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import drivers
    answers, inputs = drivers.record("lines")
    sloped = [m["slope"] for m in (codec.decode(i[3])[1] for i in inputs if i[0] == "up") if "slope" in m]
    assert sum(1 for s in sloped if s) > 50
    records = drivers.spool_records(inputs)
    want = drivers.fingerprint(answers)
    assert drivers.fingerprint(drivers.live_answers("lines", records)) == want
    assert drivers.fingerprint(drivers.feed_answers("lines", records, seed=3)) == want


@pytest.mark.parametrize("interval", [365.25 * 86400, 0.0004])
def test_sparse_or_dense_sampling_lines_are_accepted_or_constant_and_the_run_ends(interval):
    """A source sampled yearly (line gap 1.5 y) or every 0.4 ms (gap below the backend's 1 ms): the device
    only starts lines whose gap the backend's admission accepts (``predict.GAPS``), so no line is dropped
    and resent unacknowledged every 4·rto for the rest of the run (the livelock of the yearly traces,
    where the backend accepted gaps up to a day). Bounded event count; answers true at every instant."""
    years = interval > 1
    spec = _drift("linear", seed=5)
    spec["duration"] = 40 * interval if years else 0.6
    spec["sources"] = dict(spec["sources"], count=4, per_device=2, interval=interval,
                           drift=[-0.8 / interval, 0.8 / interval], volatility=[0.0, 0.0])
    spec["queries"] = [q for q in spec["queries"] if q["id"] == "tot"]
    if not years:
        spec["network"] = {"delay": 0.0001, "jitter": 0.0}
    sim = engine.Simulation(spec)
    kinds, events, push = [], [0], sim.push

    def counted(t, kind, data):
        events[0] += 1
        assert events[0] < 20000, "no progress: %d events by t=%r" % (events[0], t)
        return push(t, kind, data)

    def spy(now, hop, end, payload, link=None):
        if hop == "up":
            kinds.append(codec.decode(payload)[0])
        return send(now, hop, end, payload, link)
    send, sim.send, sim.push = sim.send, spy, counted
    r = sim.run()
    assert r["violations"] == 0 and r["queries"]["tot"]["precision_misses"] == 0
    assert not [a for a in sim.host.alerts() if "gap" in a]
    assert ("line" in kinds) == years           # a yearly line is kept; a sub-ms gap stays constant


def _trend(models, protocol, seed=5):
    """Noisy drifts (each source's steps lean one way): where a lead (edge.core.predict) pays."""
    return {"seed": seed, "duration": 1500, "protocol": protocol,
            "sources": {"generator": "brownian", "count": 8, "per_device": 2, "start": [0, 50],
                        "drift": [-0.4, 0.4], "volatility": [0.4, 0.8], "interval": 1},
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 2},
                        {"id": "hi", "kind": "max", "sources": ["s0", "s1", "s2"], "precision": 2}],
            "params": {"models": models}}


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_leads_are_mirrored_exactly_and_every_answer_holds(protocol):
    """Every report the bound cache applies leaves its mirror equal to the device's filter (no network delay:
    the device has done nothing since), leads among them; the simulator's ground truth holds every answer;
    the choice with leads sends fewer messages than without them."""
    sim = engine.Simulation(_trend("choose", protocol))
    cache, leads, checked = sim.coord.cache, [0], [0]
    report = cache.report

    def spy(key, epoch, t, v, line=None, lead=0):
        report(key, epoch, t, v, line, lead)
        dev, i = next((d, a.names.index(key)) for d, a in sim.agents.items() if key in a.names)
        f, g = cache.sources[key].filt, sim.agents[dev].filters[i]
        if not f.slope and f.width == g.width:
            assert (f.center, f.lo, f.hi) == (g.center, g.lo, g.hi), (key, t, lead)
            checked[0] += 1
        leads[0] += lead != 0
    cache.report = spy
    r = sim.run()
    assert r["violations"] == 0 and all(q["precision_misses"] == 0 for q in r["queries"].values())
    assert leads[0] > 100 and checked[0] > 0.9 * r["messages"]["up"] - 100, (leads, checked, r["messages"])
    base = engine.run(_trend("constant", protocol))
    assert _total(r) < _total(base), (_total(r), _total(base))


@pytest.mark.parametrize("sources, leads", [(["x"], True), (["x", "y"], False)])
def test_a_source_of_a_min_or_max_over_several_sources_may_not_lead(sources, leads):
    """Once a MIN/MAX over several sources reads one of a device's sources, a ``setup`` allows it no lead
    (it would keep the source among the extreme's candidates); a MAX over its one source (the mixed workload's
    one-source traces) leaves it the lead."""
    from edge.core.predict import MOMENTUM
    c = Coordinator(make("adaptive"), period=10.0, models=host.MODELS["choose"])
    caps = CAP_MS | CAP_LINE | codec.CAP_METER
    birth = codec.encode("birth", {"seq": 1, "t": 1000, "boot": 1, "fw": "new", "caps": caps, "first": 0,
                                   "sources": [{"name": n, "epoch": 0, "width": 1.0, "v": 1.0} for n in ("x", "y")]})
    first = c.handle_uplink(1.0, "d", birth) + c.handle_timer(2.0)
    out = c.add_query({"id": "top", "kind": "max", "sources": sources, "precision": 2.0}, now=2.0)
    setups = [[m for k, m in (codec.decode(a[2]) for a in o if a[0] == "down") if k == "setup"] for o in (first, out)]
    assert setups[0] and setups[0][-1]["allow"] & MOMENTUM, setups      # before the query: leads allowed
    assert bool(setups[1]) != leads and all(not m["allow"] & MOMENTUM for m in setups[1]), setups     # sent at once


@pytest.mark.parametrize("protocol, caps, allow",
                         [("adaptive", codec.CAP_METER, 7), ("adaptive", 0, 1), ("deadband", 0, 7)])
def test_a_device_that_cannot_guard_its_model_choice_is_told_constant_models(protocol, caps, allow):
    """Under the default adaptive rule (a no-regret guard) a device whose birth says no CAP_METER (older firmware)
    may not choose among models: its choice could lose to deadband unseen; the deadband protocol has no guard."""
    told = _birth(CAP_MS | CAP_LINE | caps, Coordinator(make(protocol), period=10.0, models=host.MODELS["choose"]))
    assert host.MODELS["choose"] == 7 and [(k, m["allow"]) for k, m in told] == [("setup", allow)]


def test_a_superseded_lead_report_is_held_with_its_lead_band():
    """A lead report that a newer one overtook (a skewed clock's hold in force) may still be the device's state
    until the newer one's instant is known: the cache holds its band as the device placed it (past the value),
    not a band centred on the value (``BoundCache.widen``)."""
    from edge.core.predict import LineFilter
    c = BoundCache()
    c.add("x", "d", 0, 4.0, 0, value=10.0)
    c.now = 5.0
    c.hold("x", 6.0)                    # a report that may have happened as late as 6.0
    c.report("x", 0, 5.0, 9.0)
    c.widen("x", 12.0, 1)               # the device's lead report of 12.0 before it, arrived late
    dev = LineFilter(4.0, (), 0)
    dev.recenter(12.0)
    dev.lead(1)
    lo, hi = c.known("x")
    assert dev.hi > 14.0 and lo <= dev.lo and dev.hi <= hi, ((lo, hi), (dev.lo, dev.hi))
