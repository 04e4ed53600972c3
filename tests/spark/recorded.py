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


def record(settings, devices=4, per_device=2, duration=40.0, dt=0.25, tick=0.5, seed=1, queries=QUERIES):
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
    for q in queries:
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


GROUP_QUERIES = [   # three independent groups over devices d0-d1, d2-d3, d4-d5 (two sources each)
    {"id": "g0sum", "kind": "sum", "sources": ["s0", "s1", "s2", "s3"], "precision": 3.0},
    {"id": "g0band", "kind": "count", "sources": ["s0", "s1"], "range": [98, 102], "precision": 0},
    {"id": "g1avg", "kind": "avg", "sources": ["s4", "s5", "s6", "s7"], "precision": 1.0},
    {"id": "g2max", "kind": "max", "sources": ["s8", "s9", "s10", "s11"], "precision": 2.0},
]
EXACT = {"sum": sum, "avg": lambda v: sum(v) / len(v), "max": max}


def record_groups(settings, queries=GROUP_QUERIES, later=(), devices=6, per_device=2, duration=30.0, dt=0.25,
                  tick=0.5, seed=1):
    """Like ``record``, with the job's group keying done in process: every record goes through a
    ``groups.Router`` to one ``Host`` per query group (retired and adopted as the router says), whose
    downlinks go back to the agents. ``later``: ``(time, query)`` specs registered mid-run (``{"id": ..., "remove": True}``: removed). Returns
    ``(records, reference)``, the reference holding ``answers`` per query, ``downs`` per device, the ``hosts`` at the end and
    ``checked``: how many answers were compared with the exact aggregate of the agents' readings
    (each in force at the end of an instant and not degraded must contain it)."""
    from backend.spark.groups import Router
    from backend.spark.source import parse_topic
    router, hosts = Router(), {}
    agents, walks, value = {}, [], {}
    for d in range(devices):
        names = ["s%d" % (d * per_device + j) for j in range(per_device)]
        agents["d%d" % d] = Agent("d%d" % d, names, boot=7)
        walks += [("d%d" % d, RandomWalk(n, 0.0, dt, 100.0, 0.6, seed * 100 + i)) for i, n in enumerate(names)]
    records, answers, downs, checked = [], {}, {}, [0]

    def feed(now, topic, payload):
        records.append((now, topic, payload))
        device, channel = parse_topic(topic)
        sent = []           # every row of this record is applied before its downlinks reach the agents
        for grp, name, chan, pl in router.route(device, channel, payload)[0]:
            if chan == "retire":
                del hosts[grp]
                continue
            h = hosts.get(grp) or hosts.setdefault(grp, host.Host(settings))
            for a in h.record(now, name, chan, pl):
                if a[0] == "answer":
                    answers.setdefault(a[1]["query"], []).append(a[1])
                elif a[0] == "down":
                    downs.setdefault(a[1], []).append(a[2])
                    sent.append(a)
        for _, dev, p in sent:
            for ch, up in agents[dev].handle_message(now, p):
                feed(now, topics.device(FLEET, dev, ch), up)

    def check():
        for h in hosts.values():
            for qid, spec in h.specs.items():
                last = h.coord.last.get(qid)
                if spec["kind"] in EXACT and last and not last["degraded"] and all(s in value for s in spec["sources"]):
                    exact = EXACT[spec["kind"]]([value[s] for s in spec["sources"]])
                    assert last["lo"] - 1e-9 <= exact <= last["hi"] + 1e-9, (qid, last, exact)
                    checked[0] += 1

    for device, agent in agents.items():
        for ch, p in agent.start(0.0):
            feed(0.0, topics.device(FLEET, device, ch), p)
    for q in queries:
        feed(0.0, topics.query(FLEET, q["id"], "spec"), json.dumps({k: v for k, v in q.items() if k != "id"}).encode())
    later = sorted(later, key=lambda x: x[0])
    t, next_tick = 0.0, tick
    while t < duration:
        t = round(t + dt, 9)
        while later and later[0][0] <= t:
            q = later.pop(0)[1]
            spec = b"" if q.get("remove") else json.dumps({k: v for k, v in q.items() if k != "id"}).encode()
            feed(t, topics.query(FLEET, q["id"], "spec"), spec)
        for device, walk in walks:
            for source, v in walk.poll(t):
                value[source] = v
                for ch, p in agents[device].handle_sample(t, source, v):
                    feed(t, topics.device(FLEET, device, ch), p)
        while next_tick <= t:
            feed(next_tick, topics.tick(FLEET), b"")
            next_tick = round(next_tick + tick, 9)
        check()
    return records, {"answers": answers, "downs": downs, "hosts": hosts, "checked": checked[0]}
