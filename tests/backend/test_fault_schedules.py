"""Property (issue #20): over 1,000 random fault schedules, a non-degraded answer is never wrong.

Each schedule is a small fleet in the simulator under a random mix of loss, duplication, reordering,
clock skew, reboots and partitions, with a heartbeat; the ground-truth checker (``backend.sim.truth``
and ``entity_truth``, honouring revoked windows) must find 0 violations. Aggregate queries run under
the default adaptive protocol and deadband; the entity range query runs under ``nofilter`` with λ = 0
(with any delay the entity protocols degrade every answer, which would prove nothing). The run also
shows that the faults did something: messages were lost, answers were degraded and revoked, and the
degraded time is at least the time the faults forced.
"""
import random

from backend.sim import engine

SCHEDULES = 1000


def schedule(seed):
    r = random.Random(seed)
    entity = r.random() < 0.2
    ndev = r.randint(2, 3)
    dur = r.choice([20, 30, 40])
    net = {"delay": 0.0 if entity else r.choice([0.05, 0.1, 0.2]),
           "jitter": 0.0 if entity else r.choice([0.0, 0.05, 0.1]),
           "loss": r.choice([0, 0.02, 0.05, 0.1]), "duplicate": r.choice([0, 0.05, 0.1]),
           "reorder": r.choice([0, 0.1, 0.2, 0.3]), "skew": 0.0 if entity else r.choice([0, 0.1, 0.3]),
           "reboots": r.choice([0, 0, 60, 240]), "partitions": []}
    for _ in range(r.choice([0, 0, 1, 2])):
        a = r.uniform(0, dur - 2)
        devs = "all" if r.random() < 0.3 else ["d%d" % r.randrange(ndev)]
        net["partitions"].append([a, a + r.uniform(1, 10), devs])
    if entity:
        protocol, queries = "nofilter", [{"id": "q", "kind": "range", "sources": "all", "range": [95, 105]}]
    else:
        protocol = r.choice(["adaptive", "deadband"])
        queries = [{"id": "q", "kind": r.choice(["sum", "avg", "max", "min"]), "sources": "all",
                    "precision": r.choice([2.0, 6.0, 12.0])},
                   {"id": "p", "kind": "sum", "sources": ["s0", "s1"], "weights": [1, -1], "precision": 3.0}]
    per = r.randint(1, 2)
    return {"name": "schedule-%d" % seed, "seed": seed, "duration": dur, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": ndev * per, "per_device": per, "start": [90, 110],
                        "step": [0.1, 3.0], "interval": r.choice([0.5, 1.0])},
            "queries": queries, "network": net, "params": {"heartbeat": r.choice([2.0, 5.0])}}


def test_no_violation_outside_degraded_or_revoked_windows_over_1000_fault_schedules():
    bad, kinds = [], set()
    lost = revoked = degraded = forced = 0.0
    for seed in range(SCHEDULES):
        w = schedule(seed)
        res = engine.run(w)
        kinds.add((w["protocol"], w["queries"][0]["kind"]))
        if res["violations"]:
            bad.append((seed, w["protocol"], res["violations"]))
        lost += res["network"]["lost"] + res["network"]["partitioned"]
        f = res["faults"]
        if f is not None:       # None: this schedule drew no fault at all
            revoked += f["integrity"]["lost"] + f["integrity"]["silent"]
            degraded += f["degraded_share"]
            forced += f["forced_share"]
    assert bad == [], "violations outside degraded windows (seed, protocol, count): %s" % bad[:20]
    assert {p for p, _ in kinds} == {"adaptive", "deadband", "nofilter"} and ("nofilter", "range") in kinds
    assert lost > 1000 and revoked > 1000          # the faults happened and were detected
    assert degraded >= forced > 0                  # degraded where it had to be, and not only there
