"""Lagged and real-time queries on the same sources: a lagged AVG's final answers from segments and a real-time
MAX/MIN from the sources' filters (backend/coordinator/core/segments.py, edge/core/segment.py), against ground
truth on every prefix, on a hostile network, and never more messages than the same queries all real time."""
import bisect
import json
import random

import pytest

from backend import host
from backend.sim import engine
from edge.agent import Agent
from edge.core import codec
from edge.core.float32 import f32

INF = float("inf")
SOURCES = (("d0", ["a", "b"]), ("d1", ["c"]), ("d2", ["e"]))
LEVEL = {"a": 0.0, "b": 40.0, "c": 44.0, "e": -30.0}      # e far below the others: a MAX cut can let it go


class Rig:
    """Agents and a Host back to back (λ = 0), times in integer ms; counts every message both ways."""

    def __init__(self, protocol, unit, rnd, specs):
        self.h = host.Host(protocol=protocol, latency=0.0)
        self.unit = unit
        self.agents = {d: Agent(d, names, boot=1, unit=unit, rnd=rnd) for d, names in SOURCES}
        self.answers = []
        self.msgs = {"up": 0, "down": 0}
        self.kinds = {}
        self.heard = {}         # device -> clock (s) of its latest uplink
        for d, a in self.agents.items():
            self.up(0, d, a.start(0))
        for qid, spec in specs.items():
            self.act(0, self.h.record(0.0, qid, "spec", json.dumps(spec).encode()))

    def dev(self, ms):
        return ms if self.unit == 1000 else ms / 1000

    def up(self, ms, d, out):
        for _, payload in out:
            self.msgs["up"] += codec.decode(payload)[0] not in ("birth",)
            kind = codec.decode(payload)[0]
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            self.heard[d] = ms / 1000
            self.act(ms, self.h.record(ms / 1000, d, "up" if kind != "birth" else "state", payload))

    def act(self, ms, actions):
        # the answers of one host step first, then its downlinks: a device's reply (and what the host issues on
        # it) comes after everything the step issued, so answers stay in the host's order (finals by time)
        for a in actions:
            if a[0] == "answer":
                self.answers.append(a[1])
            elif a[0] == "error":
                raise AssertionError(a[2])
        for a in actions:
            if a[0] == "down":
                self.msgs["down"] += 1
                kind = codec.decode(a[2])[0]
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self.up(ms, a[1], self.agents[a[1]].handle_message(self.dev(ms), a[2]))

    def until(self, ms):
        while True:
            due = sorted((a.next_deadline(), d) for d, a in self.agents.items() if a.next_deadline() is not None)
            if not due or (due[0][0] if self.unit == 1000 else round(due[0][0] * 1000)) > ms:
                break
            at, d = due[0]
            self.up(at if self.unit == 1000 else round(at * 1000), d, self.agents[d].handle_timer(at))
        self.act(ms, self.h.record(ms / 1000, None, "tick", b""))

    def sample(self, ms, key, v):
        d = next(d for d, names in SOURCES if key in names)
        self.up(ms, d, self.agents[d].handle_sample(self.dev(ms), key, v))
        self.act(ms, self.h.record(ms / 1000, None, "tick", b""))


def _walk(seed, n=500):
    """(ms, key, value) of random walks at different levels, with jumps; e wanders up towards the top late on."""
    rng = random.Random(seed)
    vals = dict(LEVEL)
    ms, out = 0, []
    for step in range(n):
        ms += rng.randint(40, 300 if step % 60 else 2500)
        k = rng.choice("abce")
        vals[k] += rng.gauss(0.02 + (0.25 if k == "e" and step > n * 0.6 else 0.0), 0.7) + \
            (rng.choice((-9, 9)) if rng.random() < 0.02 else 0.0)
        out.append((ms, k, vals[k]))
    return out


def _at(answers, qid, tau):
    """The answer of ``qid`` in force at ``tau`` (the last one stamped at or before it)."""
    mine = [a for a in answers if a["query"] == qid and not a.get("final") and a["time"] <= tau]
    return mine[-1] if mine else None


SPECS = {"mean": {"kind": "avg", "sources": ["a", "b", "c", "e"], "precision": 4.0, "lag": 2.0},
         "top": {"kind": "max", "sources": ["b", "c", "e"], "precision": 4.0},
         "low": {"kind": "min", "sources": ["a", "b"], "precision": 6.0}}


@pytest.mark.parametrize("protocol,unit,rnd", [("deadband", 1, None), ("deadband", 1000, f32), ("adaptive", 1, None),
                                               ("adaptive", 1000, None), ("adaptive", 1000, f32)])
def test_real_time_answers_and_finals_hold_on_every_prefix(protocol, unit, rnd):
    rig = Rig(protocol, unit, rnd, SPECS)
    lag = SPECS["mean"]["lag"]
    readings = {k: [] for k in LEVEL}
    for ms, k, v in _walk(3 + unit + (rnd is not None)):
        v = v if rnd is None else rnd(v)
        rig.until(ms)
        readings[k].append((ms / 1000, v))
        rig.sample(ms, k, v)
        now = ms / 1000
        # real time: the MAX and MIN in force now contain the truth, and within precision unless degraded
        last = {key: rs[-1][1] for key, rs in readings.items() if rs}
        for qid, fn in (("top", max), ("low", min)):
            srcs = SPECS[qid]["sources"]
            a = _at(rig.answers, qid, now)
            if a is None or not all(s in last for s in srcs):
                continue
            x = fn(last[s] for s in srcs)
            assert a["lo"] - 1e-9 <= x <= a["hi"] + 1e-9, (qid, now, a, x)
            if protocol == "deadband":
                assert not a["degraded"] and a["hi"] - a["lo"] <= SPECS[qid]["precision"] + 2.0 ** -18 * abs(x) + 1e-9
        # final answers: every reading instant and midpoint below the horizon, and the lag promise
        horizon = rig.h.coord.finals.horizon("mean")
        # the lag promise (DESIGN.md §4): final by τ + L while every device has spoken since τ (a silent one on a
        # committed line proves nothing until it speaks: the horizon waits for its next uplink)
        spoke = min(rig.heard.values())
        if all(readings.values()) and min(now, spoke) - lag >= max(rs[0][0] for rs in readings.values()):
            assert horizon is not None and horizon >= min(now, spoke) - lag - 1e-9, (horizon, now, rig.heard)
        finals = [a for a in rig.answers if a.get("final") and a["query"] == "mean"]
        times = [a["time"] for a in finals]
        assert all(x < y for x, y in zip(times, times[1:])), times     # issued in time order, each τ once
        for tau in sorted({t + d for rs in readings.values() for t, _ in rs for d in (0.0, 0.0005)}):
            if not finals or tau < times[0] or horizon is None or tau >= horizon or not all(readings.values()) \
                    or tau < max(rs[0][0] for rs in readings.values()):
                continue        # (before every source has a reading its finals say "no reading yet")
            f = finals[bisect.bisect_right(times, tau) - 1]
            vals = [rs[bisect.bisect_right(rs, (tau, INF)) - 1][1] for rs in readings.values()]
            x = sum(vals) / len(vals)
            lo, hi = f["lo"] + f["dlo"] * (tau - f["time"]), f["hi"] + f["dhi"] * (tau - f["time"])
            assert not f["degraded"] and lo - 1e-9 <= x <= hi + 1e-9, (tau, lo, x, hi, f.get("reason"), f)
            assert hi - lo <= 4.0 + 1e-6 + 2.0 ** -18 * (abs(lo) + abs(hi)), f
    assert len([a for a in rig.answers if a.get("final") and a["query"] == "mean"]) > 25
    assert rig.kinds.get("rsegs", 0) > 20         # segments rode on real-time reports
    if protocol == "adaptive":
        assert rig.h.coord.protocol.stats["demoted"] > 0     # a MAX cut let a source in segment mode go


def _fleet(protocol, network, seed, lag=True, models=None):
    """Eight sources on four devices, a lagged AVG over all, a real-time MAX and MIN over some of them."""
    q = [{"id": "mean", "kind": "avg", "sources": "all", "precision": 3.0},
         {"id": "top", "kind": "max", "sources": ["s0", "s1", "s2", "s5"], "precision": 3.0},
         {"id": "low", "kind": "min", "sources": ["s3", "s6"], "precision": 5.0}]
    if lag:
        q[0]["lag"] = 1.5
    return {"name": "mixed", "seed": seed, "duration": 60, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": 8, "per_device": 2, "start": [60, 140],
                        "step": [0.2, 2.0], "interval": 0.25},
            "queries": q, "network": dict({"delay": 0.1}, **network),
            "params": dict({"heartbeat": 5.0}, **({"models": models} if models else {}))}


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
@pytest.mark.parametrize("network", [{}, {"loss": 0.05}, {"loss": 0.05, "reorder": 0.3, "duplicate": 0.1}])
def test_simulated_fleets_have_no_violations_on_a_hostile_network(protocol, network):
    for seed in range(4):
        res = engine.run(_fleet(protocol, network, seed))
        q = res["queries"]
        assert res["violations"] == 0, (seed, {k: (v.get("violations"), v.get("final_violations")) for k, v in q.items()})
        assert q["mean"]["finals"] > 20 and q["top"]["answers"] > 5


@pytest.mark.parametrize("protocol", ["deadband", "adaptive"])
def test_never_more_messages_than_the_same_queries_all_real_time(protocol):
    for seed in range(6):
        mixed = engine.run(_fleet(protocol, {}, seed))
        plain = engine.run(_fleet("deadband", {}, seed, lag=False))
        m, p = (r["messages"]["up"] + r["messages"]["down"] for r in (mixed, plain))
        assert m < p, (seed, m, p, mixed["by_kind"], plain["by_kind"])


def test_a_source_whose_filter_serves_the_lag_query_gets_no_segment_mode():
    # deadband: the MAX holds s0 to the AVG's width, so its bounds serve the lag query (no segment control, no
    # segments); the others send segments. A single source read both ways costs exactly its real-time reports.
    sim = engine.simulation(dict(_fleet("deadband", {}, 1), queries=[
        {"id": "mean", "kind": "avg", "sources": "all", "precision": 3.0, "lag": 1.5},
        {"id": "top", "kind": "max", "sources": ["s0"], "precision": 3.0}]))
    res = sim.run()
    mirror = sim.coord.segments
    assert "s0" not in mirror.mode and "s0" in mirror.plain and set(mirror.mode) == {"s%d" % i for i in range(1, 8)}
    assert res["violations"] == 0 and res["queries"]["mean"]["finals"] > 20
    one = {"name": "one", "seed": 2, "duration": 60, "protocol": "deadband",
           "sources": {"generator": "random_walk", "count": 1, "step": 1.0, "interval": 0.25}}
    for proto in ("deadband", "adaptive"):
        both = engine.run(dict(one, protocol=proto, queries=[
            {"id": "m", "kind": "avg", "sources": "all", "precision": 3.0, "lag": 1.5},
            {"id": "x", "kind": "max", "sources": "all", "precision": 3.0}]))
        alone = engine.run(dict(one, queries=[{"id": "m", "kind": "avg", "sources": "all", "precision": 3.0},
                                              {"id": "x", "kind": "max", "sources": "all", "precision": 3.0}]))
        assert both["violations"] == 0 and both["messages"] == alone["messages"], (proto, both["messages"], alone["messages"])
