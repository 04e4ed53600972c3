"""A device whose heap keeps running out (edge/runtime/pump.py, DESIGN.md §9) through backend/host.py as every driver
runs it: each MemoryError loses what its step was sending and skips a sequence number; the birth it owes goes at most
one a heartbeat B, and meanwhile the backend, which sees the gap, degrades the device and asks for a birth itself.
Oracles: the device's own readings (every provisional answer not degraded holds them) and the exact MAX at every
instant (``backend.sim.final_truth``: every final answer not degraded holds it)."""
import math
import random

from backend.host import Host
from backend.sim import final_truth
from edge.agent import Agent
from edge.runtime.outbox import Outbox
from edge.runtime.pump import Pump
from test_watchdog import wrong

BEAT, LATENCY, PRECISION = 1.0, 2.0, 2.0
OOM = (3.0, 9.0)            # a MemoryError every third loop pass in here


class _Feed:
    """The device's sensor: the reading the test sets is taken by the next poll."""
    def __init__(self):
        self.due = []

    def poll(self, now):
        out, self.due = self.due, []
        return out

    def next_time(self):
        return None


def _run():
    h = Host(protocol="deadband", period=5.0, shrink=0.0, latency=LATENCY, beat=BEAT, t0=0.0)
    agent = Agent("d1", ["x"], boot=7, width=1.0)
    feed, clock, births, answers, finals = _Feed(), [0.0], [], [], []
    asked = [False]             # inside the device's handling of a downlink (a birth there is the backend's ask)

    def handle(acts):
        for a in acts:
            if a[0] == "down":
                asked[0] = True
                pump.message(clock[0], a[2])
                asked[0] = False
            elif a[0] == "answer":
                (finals if a[1].get("final") else answers).append(a[1])

    def send(channel, payload):
        if channel == "state":
            births.append((clock[0], asked[0]))
        handle(h.record(clock[0], "d1", channel, payload))
        return True
    pump = Pump(agent, [feed], Outbox(8), send)
    rng = random.Random(3)
    v, truth = 0.0, []
    handle(h.spec(0.0, "top", {"kind": "max", "sources": ["x"], "precision": PRECISION}))
    pump.online(0.0)
    for k in range(200):
        now = clock[0] = k / 10
        v += rng.uniform(-0.6, 0.6)
        truth.append((now, v))
        if OOM[0] <= now < OOM[1] and k % 3 == 0:
            agent.handle_sample(now, 0, v)      # the step ran out of memory: what it sent is lost
            pump.oom()
        else:
            feed.due = [(0, v)]
            pump.poll(now)
        if h.next_deadline() <= now:
            handle(h.timer(now))
    return h, pump, births, answers, finals, truth


def test_a_device_out_of_memory_owes_a_birth_a_heartbeat_and_every_answer_holds():
    h, pump, births, answers, finals, truth = _run()
    assert pump.ooms == 20
    # the oracle: a birth the device sends on its own (owed) comes a heartbeat or more after the birth before it
    # (any: on connecting, asked for by the backend, owed), and one comes within a heartbeat and a pass of an oom
    for (a, _), (b, ask) in zip(births, births[1:]):
        assert ask or b - a >= BEAT - 1e-9, births
    owed = [t for t, ask in births[1:] if not ask]
    assert 3 <= len(owed) <= (OOM[1] - OOM[0]) / BEAT + 1, births
    settled = [(t, x) for t, x in truth if t <= truth[-1][0] - LATENCY]     # (answered within λ)
    assert wrong(answers, settled) == []                        # provisional answers: degraded or holding the truth
    assert any(a["degraded"] and "lost uplink" in a["reason"] for a in answers)
    exact = [(t, x, 0.0) for t, x in truth]
    got = final_truth.check_final(exact, [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], a["degraded"],
                                           a["watermark"]) for a in finals], finals[-1]["watermark"], [(-math.inf, PRECISION)])
    assert got["final_violations"] == 0 and got["final_revoked"] == 0, got
    assert any(not a["degraded"] and a["time"] > OOM[1] for a in finals), got       # resynchronised after it
