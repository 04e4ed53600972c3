"""Helpers of the ``Host`` tests (test_host, test_births, test_guarantees): a device's birth, actions by kind, a
small fleet's records."""
import drivers
from edge.agent import Agent
from edge.core import topics

FLEET = drivers.FLEET


def born(device, names, values, now, boot=1):
    """A device's birth payload carrying ``values`` as its last readings."""
    a = Agent(device, names, boot=boot)
    for i, v in enumerate(values):
        a.handle_sample(now, i, v)
    return a, a.start(now)[0][1]


def kinds(out):
    return [a[0] for a in out]


def answers(out):
    return [a[1] for a in out if a[0] == "answer"]


def fleet_records():
    """Two devices born, a range (entity) or sum query, then device d2's Last Will."""
    a1, b1 = born("d1", ["a", "b"], [100.0, 130.0], 1.0)
    a2, b2 = born("d2", ["c"], [101.0], 1.0)
    return [(1.0, topics.device(FLEET, "d1", "state"), b1), (1.0, topics.device(FLEET, "d2", "state"), b2),
            (2.0, topics.query(FLEET, "r", "spec"), b'{"kind": "range", "range": [90, 110], "fp_tolerance": 0.2}'),
            (2.0, topics.query(FLEET, "s", "spec"), b'{"kind": "sum", "sources": ["a", "c"], "precision": 1}'),
            (3.0, topics.tick(FLEET), b""), (4.0, topics.device(FLEET, "d2", "state"), a2.will())]
