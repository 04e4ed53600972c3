"""A deterministic, closed-loop uplink stream for the Spark job tests, with its plain-Coordinator reference.

Real ``edge.agent.Agent`` objects sample seeded random walks; their uplinks become spool records and
go to a plain ``Coordinator`` at the same instant, whose downlinks go straight back to the agents.
So the recorded stream is one a coordinator fed exactly these records produces, and the reference's
answers, downlinks and final state are what the Spark job must reproduce from the spool.
"""
import json

from backend import host
from edge.agent import Agent
from edge.core import codec, topics
from edge.runtime.sensors import RandomWalk

FLEET = "rec"
QUERIES = [
    {"id": "total", "kind": "sum", "sources": "all", "precision": 12.0},
    {"id": "mean", "kind": "avg", "sources": ["s0", "s1", "s2", "s3"], "precision": 1.0},
    {"id": "top", "kind": "max", "sources": "all", "precision": 2.0},
    {"id": "band", "kind": "count", "sources": "all", "range": [98, 102], "precision": 0},
]


def record(settings, devices=4, per_device=2, duration=40.0, dt=0.25, tick=0.5, seed=1):
    """Returns ``(records, reference)``: spool records ``(arrival, topic, payload)`` and a dict with the
    reference coordinator (built from the job's ``settings``, t0 = 0), its answers and its downlinks
    ``(device, payload)``."""
    coord = host.build(settings, t0=0.0)
    proto = coord.protocol
    agents, walks = {}, []
    for d in range(devices):
        names = ["s%d" % (d * per_device + j) for j in range(per_device)]
        agents["d%d" % d] = Agent("d%d" % d, names, boot=7)
        walks += [("d%d" % d, RandomWalk(n, 0.0, dt, 100.0, 0.6, seed * 100 + i)) for i, n in enumerate(names)]
    records, answers, downs = [], [], []

    def coordinator(actions, now):
        for a in actions:
            if a[0] == "answer":
                answers.append(a[1])
            else:
                downs.append((a[1], a[2]))
                uplink(now, a[1], agents[a[1]].handle_message(now, a[2]))

    def uplink(now, device, out):
        for channel, payload in out:
            records.append((now, topics.device(FLEET, device, channel), payload))
            coordinator(coord.handle_uplink(now, device, payload), now)

    for device, agent in agents.items():
        uplink(0.0, device, agent.start(0.0))
    for q in QUERIES:
        if q["kind"] in proto.kinds:
            spec = {k: v for k, v in q.items() if k != "id"}
            records.append((0.0, topics.query(FLEET, q["id"], "spec"), json.dumps(spec).encode()))
            coordinator(coord.add_query(q, 0.0), 0.0)
    t, next_tick = 0.0, tick
    while t < duration:
        t = round(t + dt, 9)
        for device, walk in walks:
            for source, value in walk.poll(t):
                uplink(t, device, agents[device].handle_sample(t, source, value))
        while next_tick <= t:
            records.append((next_tick, topics.tick(FLEET), b""))
            coordinator(coord.handle_timer(next_tick), next_tick)
            next_tick = round(next_tick + tick, 9)
    return records, {"coord": coord, "answers": answers, "downs": downs,
                     "reports": sum(1 for _, topic, p in records if topic.endswith("/up") and codec.decode(p)[0] == "report")}
