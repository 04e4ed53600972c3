"""Ack mode's acknowledgements (backend/coordinator/core/acks.py, edge/core/delivery.py; DESIGN.md §4 bounded
withdrawal): on a lossy network every uplink a device sends is delivered or declared lost in bounded time, and
the acks the backend sends stay within the bound ``acks`` states: per device, one per quiet spell of the ack
delay D, per gap a resend filled, per birth, per duplicate heard, plus one per HOLD·rto of continuous talk.
Oracles: the simulator's ground truth (violations, withdrawal delays) and each run's own log of what the
backend heard and sent, counted by brute force."""
import copy

import pytest

from backend.bench.faults import FAULTS, FINAL
from backend.coordinator.core import acks as acks_mod
from backend.coordinator.core.heartbeat import RTO_LEAST, TRIES
from backend.sim import engine


def _run(delay, seed=7, duration=300, protocol="deadband"):
    w = copy.deepcopy(FINAL)
    w.update(seed=seed, duration=duration, name="acks", protocol=protocol, network=dict(w["network"], **FAULTS))
    if delay is not None:
        w["params"] = {"ack_delay": delay}
    sim = engine.simulation(w)
    c = sim.coord
    heard, sent = {}, {}            # device -> [(wall, kind, seq, new, filled)], [(wall, kind, fields)]
    admit, send = c._admit, c.send

    def _admit(now, device, kind, m, rx):
        ig = c.integrity.dev.get(device)
        filled = ig is not None and m["seq"] in ig["missing"] and kind != "mark"
        out = admit(now, device, kind, m, rx)
        heard.setdefault(device, []).append((now, kind, m["seq"], out is not None or kind == "mark", filled))
        return out

    def _send(device, kind, fields):
        if kind in ("ack", "nack"):
            sent.setdefault(device, []).append((c.wall, kind, dict(fields)))
        return send(device, kind, fields)
    c._admit, c.send = _admit, _send
    res = sim.run()
    return sim, res, heard, sent


@pytest.mark.parametrize("delay", [None, 2.0])
def test_on_a_lossy_network_every_uplink_is_delivered_or_declared_lost_in_bounded_time(delay):
    sim, res, heard, sent = _run(delay)
    f = res["faults"]
    assert res["violations"] == 0 and (f["withdraw_delay_max"] or 0.0) <= 5.0
    ig, end = sim.coord.integrity, sim.coord.wall
    for dev, agent in sim.agents.items():
        assert agent.delivery.stats["overflow"] == 0 and len(agent.delivery.held) <= agent.delivery.size
        d = ig.dev[dev]
        if d["boot"] != agent.boot:
            continue                # (a reboot whose birth is still on its way)
        wait = ig.latency + TRIES * ig.links.dev[dev][6]
        # every number it used is in, or missing and waited for no longer than λ + TRIES·rto from when seen
        assert (agent.delivery.seq - d["high"]) & 0xFFFFFFFF < 8, dev
        for seq, (due, _) in d["missing"].items():
            assert due - end <= wait, (dev, seq)
    assert f["integrity"]["lost"] <= res["network"]["lost"]


def _bound(heard, delay, rto, end):
    """The acks ``acks`` allows a device whose uplinks the backend heard as ``heard``: quiet spells of ``delay``
    after a numbered uplink, gaps filled, births, duplicates, one per BATCH numbers and one per HOLD·rto of talk."""
    times = [t for t, kind, _, new, _ in heard if kind != "mark" and new]
    spells = sum(1 for a, b in zip(times, times[1:] + [end + delay]) if b - a >= delay)
    prompt = sum(1 for _, kind, _, new, filled in heard if filled or kind == "birth")
    dups = sum(1 for _, kind, _, new, _ in heard if not new)
    talk = (times[-1] - times[0]) / (acks_mod.HOLD * rto) + 1 if times else 0
    return spells + prompt + dups + len(times) / acks_mod.BATCH + talk


def test_quiet_acks_stay_within_their_bound_and_cost_a_fraction_of_the_uplinks():
    delay = 2.0
    sim, res, heard, sent = _run(delay)
    end = sim.coord.wall
    total_acks = total_up = 0
    for dev in sim.agents:
        acks = [s for s in sent.get(dev, []) if s[1] == "ack"]
        rto = delay + RTO_LEAST
        assert len(acks) <= _bound(heard.get(dev, []), delay, rto, end), dev
        total_acks += len(acks)
        total_up += len([h for h in heard.get(dev, []) if h[1] != "mark"])
        # a nack names a number missing when it went, at most once per round trip
        last = {}
        for t, kind, m in sent.get(dev, []):
            if kind == "nack":
                assert t - last.get(m["miss"], -1e9) >= sim.coord.integrity.links.trip(dev) - 1e-9
                last[m["miss"]] = t
    assert total_acks <= 0.5 * total_up             # (every uplink was acknowledged before)
    assert res["violations"] == 0 and res["faults"]["withdraw_delay_max"] <= 5.0


def test_by_default_a_duplicate_is_acknowledged_only_a_round_trip_after_the_last_ack():
    sim, res, heard, sent = _run(None)
    for dev in sim.agents:
        acks = [t for t, kind, _ in sent.get(dev, []) if kind == "ack"]
        news = [t for t, kind, _, new, filled in heard.get(dev, []) if (new and kind != "mark") or filled]
        dups = [t for t, kind, _, new, _ in heard.get(dev, []) if not new]
        trip = sim.coord.integrity.links.trip(dev)
        # brute force: an ack goes at an instant something new was heard, or at a duplicate a round trip after
        # the ack before it
        prev = -1e9
        for t in acks:
            assert t in news or (t in dups and t - prev >= trip - 1e-9), (dev, t)
            prev = t
    assert res["by_kind"]["ack"] < res["messages"]["up"] - res["by_kind"].get("mark", 0)
