"""One aggregate workload through every driver (DESIGN.md §2 determinism): simulator, live adapter, Spark feed.

``record(case)`` runs the simulator (``engine.Simulation(...).run()``) and records, by wrapping its
coordinator's entry points, every input it gave the coordinator: uplinks, timer calls and query
additions/removals, each with its time. ``spool_records`` turns them into what the broker (and so the
bridge's spool) would carry: ``(arrival, topic, payload)`` with births and wills on ``state``, reports
on ``up``, specs (JSON without the id; empty to remove) on ``q/<id>/spec`` and timer calls as the
bridge's ``tick``. ``live_answers`` replays those through ``backend.live.coordinator.LiveCoordinator`` (its message
and timer entry points, no broker) and ``feed_answers`` through the Spark job's ``run_batch`` in
micro-batches with the host pickled between them, exactly as the processor keeps it.

The queries arrive as events after the devices are born, so no driver needs sources declared ahead.
"""
import hashlib
import json
import pickle
import random

from backend import host
from backend.coordinator.precision.adaptive import REFINED
from backend.sim import engine
from backend.spark import job
from edge.core import codec, topics

FLEET = "det"
IDS = ["s%d" % i for i in range(16)]
# every protocol that runs on aggregate workloads (relay protocols need relay workloads), and the refined adaptive
CASES = {"naive": ("naive", {}), "deadband": ("deadband", {}), "uniform": ("uniform", {}),
         "adaptive": ("adaptive", {}), "adaptive-refined": ("adaptive", dict(REFINED, rule="shrink")),
         "optimal_static": ("optimal_static", {"steps": {s: 0.5 + (i % 5) * 0.4 for i, s in enumerate(IDS)}}),
         "brownian": ("brownian", {"min_obs": 5}),
         "lines": ("deadband", {"models": "linear"}),       # linear dual prediction (edge.core.predict)
         "segment": ("deadband", {}),      # lag queries (segment mode, final answers) beside a lag-free max
         "segment-adaptive": ("adaptive", {})}     # the same under adaptive: the max's cuts let segment sources go


def workload(case):
    protocol, params = CASES[case]
    kinds = ("sum", "avg", "min", "max") if protocol == "brownian" else ("sum", "avg", "min", "max", "count")
    queries = [
        {"id": "tot", "kind": "sum", "sources": "all", "precision": 40.0},
        {"id": "mix", "kind": "sum", "sources": IDS[2:11], "weights": [1, -1, 0.5, 2, -2, 1, 1, -0.5, 1.5],
         "precision": 9.0},
        {"id": "mean", "kind": "avg", "sources": IDS[:12], "precision": 2.5},
        {"id": "low", "kind": "min", "sources": IDS[4:14], "precision": 3.0},
        {"id": "top", "kind": "max", "sources": IDS[6:], "precision": 4.0},
        {"id": "band", "kind": "count", "sources": "all", "range": [95.0, 105.0]},
    ]
    lag = {}
    if case.startswith("segment"):      # s0..s11 run segments; the max's s6.. keep their filters beside them
        queries = [dict(q, lag=3.0 + 2 * (q["id"] == "mix"), segment="constant" if q["id"] == "mean" else "line")
                   if q["kind"] in ("sum", "avg") else q for q in queries if q["kind"] in ("sum", "avg", "max")]
        lag = {"lag": 4.0}
    events = [{"time": 1.0 + 0.5 * j, "add_query": q} for j, q in enumerate(q for q in queries if q["kind"] in kinds)]
    events.append({"time": 150.0, "remove_query": "mean"})
    events.append({"time": 160.0, "add_query": dict({"id": "mean2", "kind": "avg", "sources": IDS[3:], "precision": 2.0},
                                                   **lag)})
    return {"name": "determinism-" + case, "seed": 5, "duration": 300, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": len(IDS), "per_device": 2, "start": [90, 110],
                        "step": [0.1, 2.0], "arrival": "exponential", "interval": 1.0},
            "queries": [], "events": events, "params": dict(params, period=10, shrink=0.05)}


def settings(case, extra=None):
    protocol, params = CASES[case]
    params = dict(params, **(extra or {}))
    return host.settings(protocol=protocol, period=10.0, shrink=0.05, latency=0.0, params=params or None)


def record(case, spec=None):
    """``(answers, inputs)`` of one simulator run (of ``spec``, default the case's workload); inputs are
    ``(kind, time, *args)`` in call order."""
    sim = engine.Simulation(spec or workload(case))
    coord = getattr(sim.coord, "coord", sim.coord)     # a bare Coordinator, or the one a Host holds
    inputs = []
    up, timer, add, remove = coord.handle_uplink, coord.handle_timer, coord.add_query, coord.remove_query

    def handle_uplink(now, device, payload, retained=False):
        inputs.append(("up", now, device, payload))
        return up(now, device, payload, retained)

    def handle_timer(now):
        inputs.append(("tick", now))
        return timer(now)

    def add_query(spec, now=None):
        inputs.append(("add", now, spec))
        return add(spec, now)

    def remove_query(qid, now=None):
        inputs.append(("remove", now, qid))
        return remove(qid, now)

    coord.handle_uplink, coord.handle_timer = handle_uplink, handle_timer
    coord.add_query, coord.remove_query = add_query, remove_query
    sim.run()
    return sim.answers, inputs


def spool_records(inputs):
    """The broker's view of the recorded inputs: ``(arrival, topic, payload)``."""
    out = []
    for rec in inputs:
        kind, now = rec[0], rec[1]
        if kind == "up":
            channel = "state" if codec.decode(rec[3])[0] in ("birth", "gone") else "up"
            out.append((now, topics.device(FLEET, rec[2], channel), bytes(rec[3])))
        elif kind == "tick":
            out.append((now, topics.tick(FLEET), b""))
        elif kind == "add":
            spec = {k: v for k, v in rec[2].items() if k != "id"}
            out.append((now, topics.query(FLEET, rec[2]["id"], "spec"), json.dumps(spec).encode()))
        else:
            out.append((now, topics.query(FLEET, rec[2], "spec"), b""))
    return out


def live_answers(case, records):
    """Answers of the live adapter fed ``records`` (no broker: its message and timer entry points)."""
    from backend.live.coordinator import LiveCoordinator
    answers = []
    live = LiveCoordinator(host.Host(settings(case)), FLEET, "127.0.0.1", 9, "unused", answers=answers)
    for now, topic, payload in records:
        if topic == topics.tick(FLEET):
            live.timer(now)
        else:
            live.message(now, topic, payload)
    live.close()
    assert live.stats["errors"] == 0
    return answers


def feed_answers(case, records, seed=0, extra=None):
    """Answers of the Spark processor's path: ``job.run_batch`` over random micro-batches, the host
    pickled between batches; answers as the job stores them (JSON bodies); ``extra``: protocol params."""
    from backend.spark.source import parse_topic
    rng = random.Random(seed)
    blob = pickle.dumps(host.Host(settings(case, extra)))
    answers, i = [], 0
    while i < len(records):
        n = rng.randint(1, 400)
        h = pickle.loads(blob)
        cols = job.run_batch(h, [(t, *parse_topic(topic), payload, False) for t, topic, payload in records[i:i + n]])
        blob = pickle.dumps(h)
        answers += [json.loads(b) for k, b in zip(cols["kind"], cols["body"]) if k == "answer"]
        i += n
    return answers


def fingerprint(answers):
    """Bit-exact identity of an answer list (floats by their repr, which round-trips exactly)."""
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":          # one process per hash seed: print each case's fingerprint
    print(json.dumps({case: fingerprint(record(case)[0]) for case in CASES}))
