"""Exact no-regret (precision.regret, edge.core.meter): adaptive never sends more than deadband plus its loan, at any prefix.

The oracle is a plain (constant) deadband run of the same workload: every message either run puts on the
network (up and down, births and configs included) is stamped with the time it left, and at every instant t
the adaptive run must have sent no more than the deadband run by t plus the loan (max(8, queried sources))
and what its devices' own model choice may lose (edge.core.meter: ``OWE`` per source that chooses), counting
its filter traffic alone (what the ledger guards) and counting every message. Delivery traffic (marks,
the configs telling a new heartbeat B, acks, links, resends: edge.core.delivery, heartbeat.py) is left out
of both sides of the ledger, as of the meter: deadband's own would follow from arrivals its run has and
the adaptive run does not. The ledger must be exact: at the end its real − deadband equals the two runs'
difference in filter traffic, less the reports the devices' meters counted that no report carried to the
backend yet. Workloads: bench workloads, real
traces, the irregular occupancy counts, query changes, devices that do not meter, and random ones.
"""
import bisect
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from backend.bench import report as bench
from backend.bench import faults, suite
from backend.coordinator.precision import regret
from backend.sim import engine
from edge.core import codec


DELIVERY = ("mark", "ack", "nack", "link")


def _run(spec, protocol, params=None):
    """The run's messages as they left, (time, direction, device, delivery) in order, and the simulation;
    ``delivery``: a mark, ack or link, an uplink sent again, or a config whose heartbeat B is new."""
    sim = engine.Simulation(dict(spec, protocol=protocol, params=dict(spec.get("params", {}), **(params or {}))))
    sent, send, seen, beat = [], sim.send, set(), {}

    def record(now, hop, end, payload, link=None):
        kind, m = codec.decode(payload)
        told = beat.get(end)
        if kind in ("config", "setup"):
            beat[end] = m["beat"]
        again = kind not in ("birth", "mark") and hop == "up" and (end, payload) in seen
        seen.add((end, payload))
        sent.append((now, hop, end, kind in DELIVERY or again or kind in ("config", "setup") and told not in
                     (None, m["beat"]), kind == "setup"))
        return send(now, hop, end, payload, link)
    sim.send = record
    r = sim.run()
    assert r["violations"] == 0
    # all delivery traffic is found so: the devices' marks and resends, the coordinator's B changes, acks, links
    assert sum(1 for m in sent if m[3]) == sum(r["by_kind"].get(k, 0) for k in DELIVERY) + \
        sim.coord.integrity.links.stats["beats"] + sum(a.delivery.stats["resent"] for a in sim.agents.values())
    return sent, sim


def _worst(ours, theirs):
    """The largest excess of ``ours`` over ``theirs`` (message send times) at any instant."""
    return max(bisect.bisect_right(ours, t) - bisect.bisect_right(theirs, t) for t in ours) if ours else 0


def _check(spec, params=None, every=True):
    """Adaptive against deadband on ``spec``: the bound at every prefix and the ledger's exactness.

    ``every``: also bound every message, delivery included, at every prefix. That holds on the fixed workloads
    below but is no promise: a heartbeat B follows each run's own report times, so a B change can come earlier
    in the adaptive run than in deadband's (random workload seed 1722: one config at 107 s instead of 151 s,
    9 messages ahead at 115 s against a loan of 8, the same 7 delivery messages in both runs at the end)."""
    dead, _ = _run(spec, "deadband", {"models": "constant"})
    ours, sim = _run(spec, "adaptive", params)
    p = sim.protocol
    loan = sim.regret()[1]
    if every:
        assert _worst(sorted(m[0] for m in ours), sorted(m[0] for m in dead)) <= loan
    dt, ot = sorted(m[0] for m in dead if not m[3]), sorted(m[0] for m in ours if not m[3])
    assert _worst(ot, dt) <= loan
    unseen = 0
    for dev, a in sim.agents.items():
        for j, name in enumerate(a.names):
            got = p.ledger.counts.get(name)
            if a.meter is not None and got is not None:
                unseen += (a.meter.n[j] - got[0]) & 0xFFFF
    # (a setup restating the filter models a device may use is no filter traffic: deadband's devices, constant,
    # are not told that a MAX now reads them and they may no longer lead)
    setups = sum(1 for m in ours if m[4] and not m[3]) - sum(1 for m in dead if m[4] and not m[3])
    assert len(ot) - len(dt) == p.ledger.gap() - unseen + setups
    return ours, dead, p


@pytest.mark.parametrize("case", ["hetero-24", "extremes-20", "real-temps-24", "occupancy-30", "query-mix-20"])
def test_never_more_than_deadband_plus_the_loan_on_bench_workloads(tmp_path, case):
    spec = dict(bench.workloads(0.3, data_dir=str(tmp_path)))[case]
    _check(spec)


@pytest.mark.parametrize("case", ["eu-stocks", "co2-baseline", "ppg"])
def test_never_more_than_deadband_plus_the_loan_on_traces_where_adaptive_moves(tmp_path, case):
    c = suite.convert(str(tmp_path), [case], log=lambda *a: None)[0]
    spec = suite.workload(c, str(tmp_path), None)
    spec["queries"].append({"id": "mx", "kind": "max", "precision": spec["queries"][0]["precision"],
                            "sources": "all"})
    _check(spec)


def test_a_loan_too_small_for_any_move_leaves_adaptive_exactly_deadband(tmp_path):
    spec = dict(bench.workloads(0.3, data_dir=str(tmp_path)))["hetero-24"]
    ours, dead, p = _check(spec, {"guard": 1, "models": "constant"})
    assert sorted(ours) == sorted(dead) and p.stats["moves"] == 0
    _, _, p = _check(spec, {"guard": 1})       # (the devices' own model choice departs within its own bound)
    assert p.stats["moves"] == 0


def test_query_changes_and_devices_that_do_not_meter(tmp_path, monkeypatch):
    # half the devices do not meter (a micro:bit behind its gateway, older firmware): their sources keep
    # deadband's filter, and the others still move; precisions change, queries go and come
    spec = dict(bench.workloads(0.3, data_dir=str(tmp_path)))["hetero-24"]
    spec["events"] = [{"time": 400, "set_precision": {"id": "b", "precision": 150.0}},
                      {"time": 700, "remove_query": "m"},
                      {"time": 900, "add_query": {"id": "m2", "kind": "max", "sources": ["s%d" % i for i in range(6)],
                                                  "precision": 30.0}}]
    agent = engine.Agent
    monkeypatch.setattr(engine, "Agent", lambda device, sources, **kw: agent(
        device, sources, meter=int(device[1:]) % 2 == 0, **kw))
    ours, dead, p = _check(spec)        # (default models: a device that does not meter cannot guard its own
    assert p.stats["moves"] > 0 and p.stats["syncs"] > 0    # model choice, so it is told constant, deadband's)
    plain = lambda run: sorted(m for m in run if int(m[2][1:]) % 2)
    assert plain(ours) == plain(dead)          # to the instant, up and down


def test_sources_in_segment_mode_stay_outside_the_ledger_and_come_back_as_twins(tmp_path, monkeypatch):
    # four more sources read by a lagged AVG and a real-time SUM too wide to serve it (segment mode in both runs
    # alike, real-time exits as rsegs): outside the ledger every control to them is flagged METER, so their
    # meters never fork a shadow nor send a count report; when the lag query goes and a MAX takes them, they
    # come back into the ledger as deadband's twins and may move
    spec = dict(bench.workloads(0.3, data_dir=str(tmp_path)))["hetero-24"]
    spec["sources"] = dict(spec["sources"], count=28)
    late = ["s%d" % i for i in range(24, 28)]
    spec["queries"] = spec["queries"] + [{"id": "lagged", "kind": "avg", "sources": late, "precision": 2.0, "lag": 30.0},
                                         {"id": "wide", "kind": "sum", "sources": late, "precision": 60.0}]
    spec["events"] = [{"time": 700, "remove_query": "lagged"},
                      {"time": 700, "add_query": {"id": "m3", "kind": "max", "sources": late, "precision": 10.0}}]
    left, leave = [], regret.Ledger.leave
    monkeypatch.setattr(regret.Ledger, "leave", lambda led, key: left.append(key) or leave(led, key))
    ours, dead, p = _check(spec)
    assert set(left) == set(late) and p.stats["moves"] > 0
    assert not p.ledger.rebase and set(p.ledger.counts) >= set(late)   # back, counted from their first report


@st.composite
def _workloads(draw):
    n = draw(st.integers(2, 10))
    ids = ["s%d" % i for i in range(n)]
    lo = draw(st.sampled_from([0.05, 0.2, 0.5]))
    queries = [{"id": "a", "kind": draw(st.sampled_from(["avg", "sum"])), "precision": draw(st.sampled_from([2.0, 5.0, 12.0])),
                "sources": "all" if draw(st.booleans()) else sorted(draw(st.sets(st.sampled_from(ids), min_size=1)))}]
    if draw(st.booleans()):
        queries.append({"id": "m", "kind": draw(st.sampled_from(["max", "min"])), "precision": draw(st.sampled_from([2.0, 6.0])),
                        "sources": sorted(draw(st.sets(st.sampled_from(ids), min_size=1, max_size=4)))})
    delay = draw(st.sampled_from([0.0, 0.0, 0.3]))
    return {"seed": draw(st.integers(0, 10 ** 6)), "duration": draw(st.integers(300, 1500)),
            "network": {"delay": delay, "jitter": delay / 3},
            "sources": {"generator": "random_walk", "count": n, "per_device": draw(st.sampled_from([1, 2])),
                        "start": [90, 110], "step": [lo, draw(st.sampled_from([1.0, 3.0, 8.0]))],
                        "steps": draw(st.sampled_from(["normal", "binary"]))},
            "queries": queries}


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_workloads())
def test_never_more_than_deadband_plus_the_loan_on_random_workloads(spec):
    _check(spec, every=False)


def test_a_heartbeat_change_may_come_earlier_than_deadbands_but_filter_traffic_keeps_the_loan():
    # the workload where every message, delivery included, went one past the loan for an instant (see _check)
    spec = {"seed": 1722, "duration": 300, "network": {"delay": 0.0, "jitter": 0.0},
            "sources": {"generator": "random_walk", "count": 7, "per_device": 1, "start": [90, 110],
                        "step": [0.05, 1.0], "steps": "normal"},
            "queries": [{"id": "a", "kind": "avg", "precision": 2.0, "sources": "all"}]}
    ours, dead, p = _check(spec, every=False)
    assert sum(m[3] for m in ours) == sum(m[3] for m in dead)


def test_a_reordering_network_keeps_every_meter_and_the_loan():
    # the [final] workload on a network that reorders a fifth of the messages: a device's first METER control
    # may overtake its config and be dropped; the control sent again must say METER too, or the device never
    # starts its meter and its reports (unmetered) escape the ledger, which then moves those sources blind
    # (seed 7, 1,200 s: adaptive 10,166 uplinks against deadband's 8,846, the ledger believing −2,108)
    spec = dict(faults.FINAL, duration=400, network=dict(faults.FINAL["network"], reorder=0.2))
    ours, dead, p = _check(spec, every=False)
    assert sorted(p.ledger.counts) == sorted("s%d" % i for i in range(20))     # every source metered


def test_reports_reordered_behind_newer_ones_count_as_sent():
    # 4 Hz sources on a network holding a third of the messages back by up to 0.8 s: a metered report often
    # arrives after the source's next one and is not applied (597 here), but it was sent: the ledger counts it
    # real (its count rides in the newer report too), so real − deadband stays exact (else −597)
    spec = {"seed": 4, "duration": 200, "network": {"delay": 0.3, "jitter": 0.1, "reorder": 0.3},
            "sources": {"generator": "random_walk", "count": 6, "per_device": 1, "start": [90, 110],
                        "step": [0.2, 3.0], "interval": 0.25},
            "queries": [{"id": "a", "kind": "sum", "precision": 15.0, "sources": "all"},
                        {"id": "m", "kind": "max", "precision": 4.0, "sources": ["s0", "s1", "s2"]}]}
    _check(spec, every=False)


def _metered(spec, drop=None):
    """An adaptive run of ``spec`` with 0 violations, every send of each metered report ``drop(now, m)`` picks
    dropped (None: none). Returns (reports the devices' meters counted less the metered reports they sent, resends
    not counted: the devices' own oracle of what deadband would have sent, the run's protocol)."""
    sim = engine.Simulation(dict(spec, protocol="adaptive"))
    send, seen, gone, sent = sim.send, set(), set(), [0]

    def record(now, hop, end, payload, link=None):
        if hop == "up" and (end, payload) not in seen:
            kind, m = codec.decode(payload)
            if kind in ("mreport", "mline"):
                sent[0] += 1
                if drop is not None and drop(now, m):
                    gone.add((end, payload))
        seen.add((end, payload))
        return None if (end, payload) in gone else send(now, hop, end, payload, link)
    sim.send = record
    assert sim.run()["violations"] == 0
    assert drop is None or gone
    metered = sum(a.meter.n[j] for a in sim.agents.values() if a.meter for j in range(len(a.names)))
    return metered - sent[0], sim.protocol


def test_an_acknowledgement_reordered_behind_a_newer_report_still_acknowledges():
    # the [final] workload with the faults (loss, duplication, 20 % reordering, skew), seed 3002: at 165.9 s the
    # acknowledgement of a narrowing of s5 arrived behind s5's next report and was not applied; the guard then
    # waited for it for ever, its revert's narrower sources stayed narrow and no new try began: the devices sent
    # 157 metered reports more than their meters' deadband counted by 300 s (real - deadband +2,200 by 1,200 s)
    # against a loan of 20; now 73 fewer. The oracle is the devices' own: the metered reports they sent (resends
    # not counted) against what their meters counted.
    saved, p = _metered(dict(faults.FINAL, seed=3002, duration=300,
                             network=dict(faults.FINAL["network"], **faults.FAULTS)))
    assert -saved <= p._hard() and p.ledger.gap() <= p._hard()
    assert not p.ledger.acks or not p.later         # no revert waits for an acknowledgement that came


def _acks_lost(seed, lose):
    """The [final] workload at ``seed`` for 300 s on a lossy link (acks and resends on), every send of every
    acknowledging report (a SYNC's or an assignment's) before 240 s dropped when ``lose``: acknowledgements
    lost for good (``_metered``)."""
    spec = dict(faults.FINAL, seed=seed, duration=300, network=dict(faults.FINAL["network"], loss=0.02))
    return _metered(spec, (lambda now, m: now < 240 and m["why"] in (codec.WHY_ASSIGN, codec.WHY_SYNC)) if lose else None)


@pytest.mark.parametrize("seed", [5, 11])
def test_acknowledgements_lost_for_good_are_settled_by_the_next_report_under_the_newest_control(seed):
    # every acknowledging report lost, resends and all (42 and 51 of them here): awaited for ever, each kept its
    # source out of every later try (seed 5: 6 still awaited at 300 s, the devices saved 904 reports against their
    # meters instead of 1,438 with no loss; seed 11: 5 awaited, 621 instead of 877); the source's next report under
    # its newest control settles it, and the guard keeps nearly all it saves when nothing is lost (1,303; 879)
    saved, p = _acks_lost(seed, True)
    clean, _ = _acks_lost(seed, False)
    assert not p.ledger.acks and not p.later
    assert p.ledger.gap() <= p._hard() and saved >= 0.85 * clean > 0


def test_uplinks_lost_for_good_in_a_partition_count_as_sent(monkeypatch):
    # the [final] workload at seed 5003 with its partitions (bench.faults): five devices cut off from 234 s to
    # 372 s, five more overlapping, then all for 20 s. Their reports sent into a partition never arrive, and the
    # resend brings back only the latest: the numbers stay missing (Integrity.unseen), while their meters' counts
    # carried by the next report hold deadband's would-be reports lost alike. Counted on one side only, the ledger believed
    # −771 by 600 s and let moves through that lost: the devices sent 177 metered reports more than their meters
    # counted, against a loan of 20; now 3. The oracle is the devices' own (``_metered``)
    net, _ = faults.SHAPES["partitions"](5003)
    spec = dict(faults.FINAL, seed=5003, duration=600, network=dict(faults.FINAL["network"], **net))
    saved, p = _metered(spec)
    assert -saved <= p._hard() and p.ledger.gap() <= p._hard()
    monkeypatch.setattr(regret.Guard, "unseen", lambda self, coord, device, n: None)     # the ledger without them
    blind, q = _metered(spec)
    assert -blind > q._hard() and q.ledger.gap() < -100
