"""Simulator: zero violations for every protocol on unseen random walks; the checker catches liars."""
import json
import os
import random

import pytest

from backend.coordinator.precision import deadband
from backend.coordinator import protocols
from backend.sim import engine
from backend.sim.workload import WorkloadError, load

EXAMPLES = os.path.join(os.path.dirname(engine.__file__), "examples")


def random_workload(seed, protocol, count=12, duration=300, delay=0.0, jitter=0.0, per_device=None):
    r = random.Random(seed)
    ids = ["s%d" % i for i in range(count)]
    queries = []
    for j in range(r.randint(1, 5)):
        kind = r.choice(["sum", "avg", "min", "max", "count"])
        srcs = r.sample(ids, r.randint(1, count)) if r.random() < 0.8 else "all"
        q = {"id": "q%d" % j, "kind": kind, "sources": srcs, "precision": round(r.uniform(0.0, 20.0), 3)}
        n = count if srcs == "all" else len(srcs)
        if kind in ("sum", "avg") and r.random() < 0.5:
            q["weights"] = [r.choice([-2, -1, 0.5, 1, 2]) for _ in range(n)]
        if kind == "count":
            a = r.uniform(80, 110)
            q["range"] = [a, a + r.uniform(0, 20)]
        queries.append(q)
    return {
        "name": "random-%d" % seed, "seed": seed, "duration": duration, "protocol": protocol,
        "sources": {"generator": "random_walk", "count": count, "per_device": per_device or r.randint(1, 3),
                    "start": [90, 110], "step": [0.1, 3.0],
                    "arrival": r.choice(["periodic", "exponential"]), "interval": r.choice([0.5, 1.0, 2.0])},
        "queries": queries,
        "network": {"delay": delay, "jitter": jitter},
        "params": {"period": r.choice([5, 10]), "shrink": 0.05},
    }


INTERVAL_PROTOCOLS = sorted(n for n, c in protocols.PROTOCOLS.items()
                            if set(c.kinds) >= {"sum", "avg"} and getattr(c, "guarantee", "interval") == "interval")


@pytest.mark.parametrize("protocol", INTERVAL_PROTOCOLS)
def test_zero_violations_on_random_walks_and_queries(protocol):
    for seed in range(12):
        res = engine.run(random_workload(seed, protocol))
        assert res["violations"] == 0, (seed, res["queries"])
        assert res["samples"] > 0 and res["messages"]["up"] > 0


@pytest.mark.parametrize("protocol", INTERVAL_PROTOCOLS)
def test_zero_violations_with_delay_within_latency_tolerance(protocol):
    for seed in range(6):
        res = engine.run(random_workload(100 + seed, protocol, delay=0.7, jitter=0.5))
        assert res["violations"] == 0, (seed, res["queries"])
        assert res["late"] == 0


def test_deadband_sends_far_fewer_messages_than_naive():
    spec = {"seed": 1, "duration": 2000,
            "sources": {"generator": "random_walk", "count": 10, "step": 1.0},
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 10.0}]}
    naive = engine.run(dict(spec, protocol="naive"))
    dead = engine.run(dict(spec, protocol="deadband"))
    assert naive["messages"]["up"] >= naive["samples"] * 0.9
    assert dead["messages"]["up"] < 0.1 * naive["messages"]["up"]
    assert naive["violations"] == dead["violations"] == 0


class _Liar(deadband.Deadband):
    """Claims half the width it gives the devices: the checker must notice."""
    name = "liar"

    def answer(self, coord, q):
        lo, hi = coord.interval(q)
        mid, half = (lo + hi) / 2, (hi - lo) / 4
        return {"lo": mid - half, "hi": mid + half}


class _Stale(deadband.Deadband):
    """Forgets every report after the first: answers drift away from the truth."""
    name = "stale"

    def reported(self, coord, key, m):
        s = coord.cache.sources[key]
        if s.reports > 1 or s.last_t > 5:
            s.filt.recenter(-1000.0)


@pytest.mark.parametrize("cls", [_Liar, _Stale])
def test_checker_catches_broken_protocols(cls, monkeypatch):
    monkeypatch.setitem(protocols.PROTOCOLS, cls.name, cls)
    res = engine.run(random_workload(5, cls.name, count=6))
    assert res["violations"] > 0


def test_cli_sim_writes_result_and_answers(tmp_path):
    from backend import cli
    wl = tmp_path / "w.yaml"
    wl.write_text("seed: 3\nduration: 100\nprotocol: deadband\n"
                  "sources: {generator: random_walk, count: 4}\n"
                  "queries:\n  - {id: s, kind: sum, sources: all, precision: 4}\n")
    out, ans = tmp_path / "r.json", tmp_path / "a.jsonl"
    assert cli.main(["sim", str(wl), "--out", str(out), "--answers", str(ans), "--quiet"]) == 0
    res = json.loads(out.read_text())
    for key in ("messages", "bytes", "violations", "samples"):
        assert key in res
    assert set(res["messages"]) == {"up", "down"} and set(res["bytes"]) == {"up", "down"}
    lines = [json.loads(x) for x in ans.read_text().splitlines()]
    assert lines and all({"time", "query", "lo", "hi"} <= set(x) for x in lines)
    assert all(x["hi"] - x["lo"] <= 4 + 1e-6 for x in lines if x["time"] > 0)


def test_trace_workload(tmp_path):
    r = random.Random(0)
    rows = ["time,source,value"]
    vals = {"a": 0.0, "b": 5.0}
    for k in range(400):
        for s in vals:
            vals[s] += r.uniform(-1, 1)
            rows.append("%g,%s,%r" % (k * 0.5, s, vals[s]))
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    spec = {"seed": 0, "duration": 199, "protocol": "deadband", "sources": {"trace": str(tmp_path / "t.csv")},
            "queries": [{"id": "d", "kind": "sum", "sources": ["a", "b"], "weights": [1, -1], "precision": 2}]}
    res = engine.run(spec)
    assert res["violations"] == 0 and res["sources"] == 2 and 0 < res["messages"]["up"] < res["samples"]


@pytest.mark.parametrize("patch,msg", [
    ({"duration": None}, "duration"),
    ({"sources": {"generator": "sine", "count": 3}}, "generator must be one of"),
    ({"sources": {"generator": "random_walk", "count": 0}}, "count must be a positive integer"),
    ({"queries": [{"id": "x", "kind": "sum", "sources": ["nope"]}]}, "unknown sources"),
    ({"protocol": "magic"}, "unknown protocol"),
    ({"params": {"shrink": 1.5}}, "shrink"),
    ({"network": {"delay": -1}}, "network.delay"),
    ({"sources": {"trace": "/nonexistent.csv"}}, "does not exist"),
])
def test_bad_workloads_are_explained(patch, msg):
    spec = {"seed": 0, "duration": 10, "sources": {"generator": "random_walk", "count": 3}, "queries": []}
    spec.update(patch)
    if spec.get("duration") is None:
        del spec["duration"]
    with pytest.raises(WorkloadError, match=msg):
        load(spec)


@pytest.mark.parametrize("patch,msg", [
    ({"network": {"delay": 0.1, "lossy": 0.05}}, r"unknown key network\.lossy"),
    ({"colour": "red"}, r"unknown key colour"),
    ({"sources": {"generator": "random_walk", "count": 3, "outages": {"rate": 0.1, "mean_length": 1, "when": 2}}},
     r"sources\.outages\.when"),
    ({"sources": {"generator": "random_walk", "count": 3, "trace": "x.csv"}}, r"sources\.generator"),
    ({"queries": [{"id": "x", "kind": "sum", "precison": 2}]}, r"queries\[0\]\.precison"),
    ({"queries": [{"id": "x", "kind": "sum", "k": 2}]}, r"queries\[0\]\.k"),
    ({"params": {"period": 5, "shrinkk": 0.1}}, r"params\.shrinkk"),
    ({"events": [{"time": 1, "delay": {"delay": 0.1, "loss": 0.1}}]}, r"events\[0\]\.delay\.loss"),
    ({"events": [{"time": 1, "set_precision": {"id": "x", "precision": 1}, "note": 1}]}, r"events\[0\]\.note"),
])
def test_unknown_workload_keys_are_named(patch, msg):
    spec = {"seed": 0, "duration": 10, "sources": {"generator": "random_walk", "count": 3},
            "queries": [{"id": "x", "kind": "sum", "precision": 1}]}
    spec.update(patch)
    with pytest.raises(WorkloadError, match=msg):
        load(spec)


def test_unknown_keys_are_named_in_relay_and_summary_workloads():
    relay = json.loads(open(os.path.join(EXAMPLES, "relay.json")).read())
    summary = json.loads(open(os.path.join(EXAMPLES, "summary.json")).read())
    for spec, msg in ((dict(relay, network={"delay": 0.1, "loss": 0.05}), r"network\.loss"),
                      (dict(relay, queries=[{"id": "c", "kind": "count", "eror": 0.1}]), r"queries\[0\]\.eror"),
                      (dict(summary, data={"generator": "weather", "rate": 2}), r"data\.rate"),
                      (dict(summary, params={"alpha": 2}), r"params\.alpha"),
                      (dict(summary, protocol="aps", params={"alpha": 2, "beta": 1}), r"params\.beta"),
                      (dict(summary, queries=[dict(summary["queries"][0], colour=1)]), r"queries\[0\]\.colour")):
        with pytest.raises(WorkloadError, match=msg):
            load(spec)
    assert load(dict(summary, protocol="aps", params={"alpha": 2})).params == {"alpha": 2}


@pytest.mark.parametrize("name,kind", [("fleet.yaml", "fleet"), ("relay.json", "relay"), ("summary.json", "summary")])
def test_cli_sim_runs_every_kind_through_the_one_loop(tmp_path, name, kind):
    from backend import answers, cli
    from backend.sim.loop import Loop
    path = os.path.join(EXAMPLES, name)
    assert isinstance(engine.simulation(path), Loop)
    out, ans = tmp_path / "r.json", tmp_path / "a.jsonl"
    assert cli.main(["sim", path, "--out", str(out), "--answers", str(ans), "--quiet"]) == 0
    res = json.loads(out.read_text())
    assert res["kind"] == kind and res["violations"] == 0
    lines = [json.loads(x) for x in ans.read_text().splitlines()]
    assert len(lines) > 10 and all(x["guarantee"] in answers.GUARANTEES for x in lines)
    for x in lines:             # relay and summary answers carry the exact value they were checked against
        if "exact" in x and not x["degraded"]:
            lo, hi = (float("-inf") if x["lo"] is None else float(x["lo"]),      # strict JSON: an infinite
                      float("inf") if x["hi"] is None else float(x["hi"]))       # bound is not a number
            tol = 1e-6 * (1 + abs(x["exact"]))
            assert lo - tol <= x["exact"] <= hi + tol, x


def test_bad_trace_rows_are_explained(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("time,source,value\n0,a,1\n1,a,notanumber\n")
    with pytest.raises(WorkloadError, match="line 3"):
        load({"duration": 5, "sources": {"trace": str(p)}})
    p.write_text("t,s,v\n")
    with pytest.raises(WorkloadError, match="header"):
        load({"duration": 5, "sources": {"trace": str(p)}})


def _choosers(agent):
    """A device's filter-model choice (edge.core.predict.Chooser): sampling times, shadow costs and filters."""
    return [(c.prev, c.last, c.value, c.cost, [g.__dict__ for g in c.shadows]) for c in agent.alt or ()]


def _same_runs(spec):
    """Run ``spec`` screened and scalar; assert the same messages, answers, verdicts and agent state."""
    fast, slow = engine.Simulation(spec), engine.Simulation(spec, vectorised=False)
    rf, rs = fast.run(), slow.run()
    assert rs["screened"] == 0 and rf["screened"] <= rf["samples"] == rs["samples"]
    for key in ("messages", "bytes", "by_kind", "reports", "probes", "violations", "precision_misses", "network"):
        assert rf[key] == rs[key], key
    assert fast.answers == slow.answers
    # every screened reading still reached its agent: the same per-agent sample counts and state
    assert [a.stats for a in fast.agents.values()] == [a.stats for a in slow.agents.values()]
    assert [a.values for a in fast.agents.values()] == [a.values for a in slow.agents.values()]
    assert [[f.__dict__ for f in a.filters] for a in fast.agents.values()] == \
        [[f.__dict__ for f in a.filters] for a in slow.agents.values()]
    assert [_choosers(a) for a in fast.agents.values()] == [_choosers(a) for a in slow.agents.values()]
    assert [q["violations"] for q in rf["queries"].values()] == [q["violations"] for q in rs["queries"].values()]
    for qid, tr in slow.truth.tracks.items():      # the bulk truth agrees within the checker's tolerance
        other = dict((t, x) for t, x, _ in fast.truth.tracks[qid].timeline)
        for t, x, scale in tr.timeline[-50:]:
            if t in other:
                assert abs(other[t] - x) <= 1e-9 * (1 + scale + abs(x))
    return rf


@pytest.mark.parametrize("protocol", INTERVAL_PROTOCOLS)
def test_vectorised_screening_matches_the_scalar_agents(protocol):
    screened = 0
    for seed in range(3):
        spec = random_workload(300 + seed, protocol, count=80, duration=150, delay=0.3 * seed)
        spec["sources"]["arrival"] = "periodic"
        spec.setdefault("params", {})["models"] = "constant"    # the model choice sees every reading
        if seed < 2:    # count-in-range constraints keep a source on the scalar path: leave them out
            spec["queries"] = [q for q in spec["queries"] if q["kind"] != "count"] or [
                {"id": "avg", "kind": "avg", "sources": "all", "precision": 8.0}]
        rf = _same_runs(spec)
        screened += rf["screened"]
        assert rf["violations"] == 0
    if protocol != "naive":         # a zero-width filter never holds a reading, so nothing is screened
        assert screened > 0.3 * 2 * 80 * 150
    else:
        assert screened == 0


@pytest.mark.parametrize("protocol", ["deadband", "adaptive", "optimal_static"])
def test_screening_matches_on_few_sources_skew_reboots_outages_and_repeated_instants(protocol, tmp_path):
    """Silent readings skipped across many instants (few sources, exponential arrivals), a source read
    twice at one instant, clock skew, reboots and outages: still the scalar run, message for message."""
    for seed in range(3):
        spec = random_workload(400 + seed, protocol, count=4, duration=2000)
        spec["sources"]["arrival"] = "exponential"
        spec["sources"]["outages"] = {"rate": 0.002, "mean_length": 20.0}
        spec["network"].update({"skew": 0.2, "reboots": 3.0})
        spec.setdefault("params", {})["models"] = "constant"    # the model choice sees every reading
        _same_runs(spec)
    r = random.Random(7)
    p = tmp_path / "repeat.csv"
    rows, v = [], {"a": 100.0, "b": 50.0}
    for k in range(3000):
        for src in ("a", "b", "a") if k % 3 == 0 else ("b",):       # "a" twice at every third instant
            v[src] += r.choice([-1, 1]) * r.uniform(0, 2)
            rows.append("%d,%s,%r" % (k, src, v[src]))
    p.write_text("time,source,value\n" + "\n".join(rows) + "\n")
    rf = _same_runs({"seed": 1, "duration": 3000, "protocol": protocol, "sources": {"trace": str(p)},
                     "params": {"models": "constant"},
                     "queries": [{"id": "s", "kind": "sum", "sources": "all", "precision": 12.0}]})
    assert rf["screened"] > rf["samples"] / 2


@pytest.mark.parametrize("protocol", ["deadband", "adaptive", "optimal_static"])
def test_screening_with_filter_model_choice_matches_the_scalar_agents(protocol, tmp_path):
    """Default models (``choose``): the screen skips readings inside the filter and both shadow models
    (lines included, and the linear shadow's gap), and the scalar run agrees message for message, with
    the same shadow costs, on random walks, steady drifts (lines win), outages and reboots, a skewed
    clock (constant only) and a source read twice at one instant."""
    screened = samples = 0
    for seed in range(4):
        spec = random_workload(500 + seed, protocol, count=6, duration=600)
        spec["queries"] = [q for q in spec["queries"] if q["kind"] != "count"] or [
            {"id": "avg", "kind": "avg", "sources": "all", "precision": 8.0}]
        if seed % 2:
            spec["sources"]["outages"] = {"rate": 0.002, "mean_length": 20.0}
            spec["network"].update({"reboots": 3.0, "delay": 0.2, "jitter": 0.1})
        if seed == 3:
            spec["network"]["skew"] = 0.2
        rf = _same_runs(spec)
        if seed != 3:       # (a skewed clock: readings within a report's guard go to the agent, unscreened)
            screened, samples = screened + rf["screened"], samples + rf["samples"]
        assert rf["violations"] == 0
    assert screened > samples / 4
    r = random.Random(9)
    p = tmp_path / "drift.csv"
    rows, v = [], {"a": 100.0, "b": 50.0}
    for k in range(2000):
        for src in ("a", "b", "a") if k % 3 == 0 else ("b",):       # "a" twice at every third instant
            v[src] += (0.3 if src == "a" else -0.2) + r.uniform(-0.05, 0.05) + (5 * r.random() if k % 97 == 0 else 0)
            rows.append("%r,%s,%r" % (k * 1.5 + r.uniform(0, 0.5) if src == "b" else k * 1.5, src, v[src]))
    rows.sort(key=lambda x: float(x.split(",")[0]))
    p.write_text("time,source,value\n" + "\n".join(rows) + "\n")
    spec = {"seed": 1, "duration": 3000, "protocol": protocol, "sources": {"trace": str(p)},
            "queries": [{"id": "s", "kind": "sum", "sources": "all", "precision": 6.0}]}
    rf = _same_runs(spec)
    assert rf["by_kind"].get("line", 0) + rf["by_kind"].get("mline", 0) > 10    # the drifts were sent as lines
    assert rf["screened"] > rf["samples"] / 4       # and their readings inside the lines skipped the agents


def test_real_temperature_dataset_runs_without_violations():
    spec = {"seed": 0, "duration": 200, "protocol": "deadband", "sources": {"dataset": "temps"},
            "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 2.0}]}
    res = engine.run(spec)
    assert res["sources"] == 24 and res["violations"] == 0
    assert 0 < res["messages"]["up"] < res["samples"]
    with pytest.raises(WorkloadError, match="dataset must be one of"):
        load(dict(spec, sources={"dataset": "nope"}))


def test_host_follows_the_fleet_and_starts_queries_at_t0():
    from backend import host
    from edge.agent import Agent
    h = host.Host({"protocol": "deadband", "latency": 0.5, "t0": 0.0}, declared=["s0", "s1"])
    out = h.spec(0.0, "tot", {"kind": "sum", "sources": "all", "precision": 5})
    assert [a[1]["time"] for a in out if a[0] == "answer"] == [0.0]          # not -λ: nothing precedes t0
    for i in range(4):
        a = Agent("d%d" % i, ["s%d" % (2 * i), "s%d" % (2 * i + 1)], boot=1)
        for _, payload in a.start(1.0 + i):
            h.uplink(1.0 + i, a.device, payload)
        h.timer(2.0 + i)
        assert h._everyone() == len(h.coord.all_sources()) == max(2, 2 * i + 2)
        assert h.coord.queries["tot"].sources == h.coord.all_sources()
