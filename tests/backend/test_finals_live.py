"""Final answers under live timing (issue #30; backend/coordinator/core/finals.py): mechanisms a live run through the
fault proxy showed, each replayed here through a ``Host`` with real agents and every final answer checked against the
exact MAX at every instant (``backend.sim.final_truth``)."""
import math

from backend.host import Host
from backend.sim import final_truth
from edge.agent import Agent

INF = math.inf


def _fleet():
    """Two devices (d0: source a, d1: source b) under deadband, λ = 2 s, a MAX over both at precision 2."""
    h = Host(protocol="deadband", latency=2.0, t0=0.0)
    devs = {"d0": Agent("d0", ["a"], boot=1, width=1.0), "d1": Agent("d1", ["b"], boot=1, width=1.0)}
    answers, truth = [], {"a": [(0.0, 5.0)], "b": [(0.0, 3.0)]}

    def pump(now, acts):
        for act in acts:
            if act[0] == "answer":
                answers.append(act[1])
            elif act[0] == "down":
                for _, p in devs[act[1]].handle_message(now, act[2]):
                    pump(now, h.record(now, act[1], "up", p))

    def sample(dev, src, t, v):
        truth[src].append((t, v))
        return devs[dev].handle_sample(t, 0, v)[0][1]
    for dev, src in (("d0", "a"), ("d1", "b")):
        devs[dev].handle_sample(0.0, 0, truth[src][0][1])
        pump(0.0, h.record(0.0, dev, "state", devs[dev].start(0.0)[0][1]))
    pump(0.0, h.spec(0.0, "top", {"kind": "max", "sources": ["a", "b"], "precision": 2.0}))
    return h, devs, answers, truth, pump, sample


def _check(fin, truth):
    events = sorted({t for rows in truth.values() for t, _ in rows})
    exact = [(t, max([v for s, v in rows if s <= t][-1] for rows in truth.values()), 0.0) for t in events]
    return final_truth.check_final(exact, [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], a["degraded"],
                                            a["watermark"]) for a in fin], fin[-1]["watermark"], [(-INF, 2.0)])


def test_a_birth_that_forgives_lost_numbers_holds_the_limits_until_the_final_mirror_takes_it():
    # issue #30 (live, through the fault proxy): a report lost and the next one held back, the device's birth heard
    # first. Integrity's watermark jumps to the birth's stamp (what it skipped is no longer missing); the final
    # mirror learns the gap only when it takes the birth, λ later. Until then no limit may pass the latest uplink
    # it took, or a MAX final answer stands across the lost report's change (oracle: the exact MAX at every instant)
    h, devs, answers, truth, pump, sample = _fleet()
    pump(1.0, h.record(1.0, "d0", "up", sample("d0", "a", 1.0, 9.0)))
    for now in (2.0, 3.0, 4.0):
        pump(now, h.timer(now))
    sample("d0", "a", 4.0, 12.0)                                # lost: d0 suspect ("lost uplink") from the
    pump(4.5, h.record(4.5, "d0", "up", sample("d0", "a", 4.5, 15.0)))     # gap found at 4.5 + λ
    pump(6.6, h.timer(6.6))
    sample("d0", "a", 5.0, 20.0)                                # lost too
    held = sample("d0", "a", 5.5, 30.0)                         # held back by the network
    pump(6.7, h.record(6.7, "d0", "state", devs["d0"].start(6.7)[0][1]))    # a birth, heard at once
    rp = h.coord.finals.replay
    for now in (7.0, 7.5, 8.0, 8.5):                            # d1 heard: its limit follows the release clock
        pump(now, h.record(now, "d1", "up", sample("d1", "b", now, 3.0 + 4 * now)))
        assert rp.src["b"].limit == now - 2.0
    for now in (9.0, 9.5, 12.0):                                # the birth is taken: "lost uplink" from there
        pump(now, h.record(now, "d1", "up", sample("d1", "b", now, 3.0 + 4 * now)))
    pump(12.5, h.record(12.5, "d0", "up", held))
    pump(20.0, h.timer(20.0))
    fin = [a for a in answers if a.get("final")]
    assert any(a["degraded"] and "lost uplink: d0" in a["reason"] for a in fin)
    got = _check(fin, truth)
    assert got["finals"] >= 2 and got["final_violations"] == 0 and got["final_revoked"] == 0, got


def test_uplinks_released_together_are_each_taken_before_any_limit_passes_them():
    # issue #30 (live, on a loaded machine): the coordinator's thread heard nothing for a while, then one call
    # released several uplinks of a device at once. Taking the first moved its limit to the release clock (now - λ)
    # past the others, still queued: each was then placed at that limit, after its instant, and a MAX final answer
    # stood across their changes. The release clock never passes an uplink due but not applied yet.
    h, devs, answers, truth, pump, sample = _fleet()
    pump(1.0, h.record(1.0, "d0", "up", sample("d0", "a", 1.0, 9.0)))
    for now in (2.0, 3.0, 4.0):
        pump(now, h.timer(now))
    for t, v in ((5.0, 20.0), (5.2, 12.0), (5.4, 25.0), (5.6, 14.0)):      # each heard at once, applied λ later
        pump(t, h.record(t, "d0", "up", sample("d0", "a", t, v)))
    pump(8.0, h.record(8.0, "d1", "up", sample("d1", "b", 8.0, 40.0)))     # the next call: all released at once
    for now in (9.0, 10.5, 12.0):
        pump(now, h.record(now, "d1", "up", sample("d1", "b", now, 40.0 + 4 * now)))
    fin = [a for a in answers if a.get("final")]
    got = _check(fin, truth)
    assert got["finals"] >= 4 and got["final_violations"] == 0 and got["final_revoked"] == 0, (got, fin)
