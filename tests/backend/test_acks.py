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
    assert res["violations"] == 0 and f["withdrawn_late"] == 0 and (f["withdraw_delay_max"] or 0.0) <= _late(sim, delay)
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


def _late(sim, delay):
    """How long a wrong provisional answer may stand: 5 s by default (issue #20); with an ack delay D a gap is
    waited for λ + TRIES·rto, rto = D + R (2.0: 0.8 + 3 × 2.45 s), so what each answer states (``withdrawn_late``,
    0) is the bound, and this one: a withdrawal found by the gap's wait and issued a λ later."""
    if delay is None:
        return 5.0
    ig = sim.coord.integrity
    return 2 * ig.latency + TRIES * max(ig.links.dev[d][6] for d in sim.agents)


def _bound(heard, delay, rto, end):
    """The acks ``acks`` allows a device whose uplinks the backend heard as ``heard``: quiet spells of ``delay``
    after a numbered uplink (a birth's needs none), gaps filled, duplicates, one per BATCH numbers and one per
    HOLD·rto of talk."""
    times = [t for t, kind, _, new, _ in heard if kind != "mark" and kind != "birth" and new]
    spells = sum(1 for a, b in zip(times, times[1:] + [end + delay]) if b - a >= delay)
    prompt = sum(1 for _, kind, _, new, filled in heard if filled)
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
    f = res["faults"]
    assert res["violations"] == 0 and f["withdrawn_late"] == 0 and (f["withdraw_delay_max"] or 0.0) <= _late(sim, delay)


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


def test_a_birth_is_not_acknowledged_nothing_on_a_device_waits_for_it():
    sim, res, heard, sent = _run(None)
    births = 0
    for dev in sim.agents:
        at = {}                     # instant -> kinds of what the backend heard from the device then
        for t, kind, _, new, _ in heard.get(dev, []):
            at.setdefault(t, []).append(kind)
        births += sum(1 for kinds in at.values() if kinds == ["birth"])
        for t, kind, _ in sent.get(dev, []):
            assert kind != "ack" or at.get(t) != ["birth"], (dev, t)     # (an ack at once follows something else)
    assert births >= 5 and res["violations"] == 0
    assert (res["faults"]["withdraw_delay_max"] or 0.0) <= 5.0


def test_the_live_drivers_take_the_ack_delay_as_the_simulator_does():
    from backend import cli, host
    for argv in (["coordinator", "--credentials", "c.json"], ["backend", "--broker-dir", "b"]):
        args = cli.parser().parse_args(argv + ["--ack-delay", "2.5"])
        h = host.Host(host.from_args(args), t0=0.0)
        assert h.coord.acks.delay == 2.5 and h.coord.integrity.links.delay == 2.5, argv
        default = host.Host(host.from_args(cli.parser().parse_args(argv)), t0=0.0)
        assert default.coord.acks.delay == acks_mod.DELAY == 0.0
    sim = engine.simulation(dict(copy.deepcopy(FINAL), params={"ack_delay": 2.5}))
    assert sim.coord.acks.delay == sim.coord.integrity.links.delay == 2.5        # the same setting, the same place


def test_a_lost_birth_in_ack_mode_is_asked_for_again_and_the_answers_hold():
    # through backend/host.py: a report lost at 2 s switches ack mode on; at 10 s a birth (a reconnect's) is lost. No
    # ack of it was ever what resynchronised: the next uplink's number shows the gap, the backend asks for a birth
    import math
    import random
    from backend.host import Host
    from backend.sim import final_truth
    from edge.agent import Agent
    from edge.core import codec
    from test_watchdog import wrong
    h = Host(protocol="deadband", period=5.0, shrink=0.0, latency=2.0, beat=1.0, t0=0.0)
    agent = Agent("d1", ["x"], boot=7, width=1.0)
    answers, finals, heard, down = [], [], [], []

    def handle(now, acts):
        for a in acts:
            if a[0] == "down":
                down.append((now, codec.decode(a[2])[0]))
                deliver(now, agent.handle_message(now, a[2]))
            elif a[0] == "answer":
                (finals if a[1].get("final") else answers).append(a[1])

    def deliver(now, out):
        for ch, payload in out:
            kind = codec.decode(payload)[0]
            heard.append((now, kind))
            acts = h.record(now, "d1", ch, payload)
            answered[kind] = answered.get(kind, 0) + len([a for a in acts if a[0] == "down" and
                                                          codec.decode(a[2])[0] == "ack"])
            handle(now, acts)
    answered = {}               # uplink kind -> acks sent on hearing one
    rng, v, truth, lost = random.Random(5), 0.0, [], []
    handle(0.0, h.spec(0.0, "top", {"kind": "max", "sources": ["x"], "precision": 2.0}))
    for k in range(300):
        now = k / 10
        v += rng.uniform(-0.6, 0.6)
        truth.append((now, v))
        if k == 0:
            deliver(now, agent.start(now))
        if k == 100:
            assert agent.delivery.rto > 0                       # ack mode (the gap at 2 s)
            lost.append(agent.start(now))                       # a reconnect's birth, lost
        out = agent.handle_sample(now, 0, v)
        dl = agent.next_deadline()
        if dl is not None and dl <= now:
            out += agent.handle_timer(now)
        if now >= 2.0 and not lost and out:
            lost.append(out)                                    # the first uplinks from 2 s: lost, a gap
        else:
            deliver(now, out)
        while h.next_deadline() <= now:
            handle(now, h.timer(now))
    births = [t for t, kind in heard if kind == "birth"]
    again = [t for t in births if t > 10.0]
    assert again and "birth" in [codec.decode(p)[0] for _, p in lost[1]], births
    assert "rebirth" in [kind for t, kind in down if 10.0 < t <= again[0]], down      # asked for again
    assert answered["birth"] == 0 and answered["report"] > 0 and len(births) >= 3, (answered, births)   # (ack mode)
    settled = [(t, x) for t, x in truth if t <= truth[-1][0] - 2.0]
    assert wrong(answers, settled) == []
    got = final_truth.check_final([(t, x, 0.0) for t, x in truth], [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"],
                                  a["degraded"], a["watermark"]) for a in finals], finals[-1]["watermark"],
                                  [(-math.inf, 2.0)])
    assert got["final_violations"] == 0 and got["final_revoked"] == 0, got
    assert any(not a["degraded"] and a["time"] > again[0] for a in finals), got       # resynchronised
