"""The simulator's network model (DESIGN.md §5): per-hop delay and jitter, FIFO per link, counts per hop.

A hop (``up``, ``down``, a relay's ``hop1``) has a delay and a uniform jitter; every link (hop,
endpoint) delivers in the order it was sent, so a message never overtakes an earlier one on its
link. Messages and bytes are counted per hop, and per codec kind, from ``warmup`` on.

A hostile network (``faults``, issue #20) applies per-message probabilities in both directions:
``loss`` drops a message, ``duplicate`` delivers it twice (the copy a jitter later), ``reorder``
holds it back by up to twice the hop's delay plus jitter outside the FIFO so later messages
overtake it, and a partition schedule ``[(start, end, devices or None for all)]`` drops every
message to or from a partitioned endpoint. Every draw comes from the seeded ``random`` given.
"""
from edge.core import codec


class Network:
    def __init__(self, hops, uniform, warmup=0.0, faults=None, rng=None):
        self.hops = {h: dict(d) for h, d in hops.items()}   # hop -> {"delay": s, "jitter": s}
        self.uniform = uniform                  # uniform(a, b): the jitter draw
        self.warmup = warmup
        self.fifo = {}
        self.messages = {h: 0 for h in hops}
        self.bytes = {h: 0 for h in hops}
        self.by_kind = {}
        self.faults = faults or {}
        self.rng = rng
        self.counts = {"lost": 0, "duplicated": 0, "reordered": 0, "partitioned": 0}

    def set(self, hop, delay=None, jitter=None):
        """Change a hop's delay or jitter from now on (a workload ``delay`` event)."""
        if delay is not None:
            self.hops[hop]["delay"] = delay
        if jitter is not None:
            self.hops[hop]["jitter"] = jitter

    def arrival(self, now, hop, end, payload):
        """When a message sent at ``now`` on ``hop`` to or from ``end`` arrives; counts it."""
        h = self.hops[hop]
        delay = h["delay"]
        if h["jitter"]:
            delay += self.uniform(0.0, h["jitter"])
        key = (hop, end)
        at = max(now + delay, self.fifo.get(key, now))
        self.fifo[key] = at
        if now >= self.warmup:
            self.messages[hop] += 1
            self.bytes[hop] += len(payload)
            kind = codec.NAMES.get(payload[1], "?")
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return at

    def partitioned(self, now, end):
        for start, stop, devices in self.faults.get("partitions", ()):
            if start <= now < stop and (devices is None or end in devices):
                return True
        return False

    def arrivals(self, now, hop, end, payload):
        """The arrival times of a message sent at ``now`` (none if lost, two if duplicated)."""
        f = self.faults
        if not f:
            return [self.arrival(now, hop, end, payload)]
        if self.partitioned(now, end):
            self.counts["partitioned"] += 1
            return []
        rnd = self.rng.random
        if f.get("loss") and rnd() < f["loss"]:
            self.counts["lost"] += 1
            return []
        if f.get("reorder") and rnd() < f["reorder"]:
            self.counts["reordered"] += 1
            h = self.hops[hop]
            at = [now + h["delay"] + self.rng.uniform(0.0, 2 * (h["delay"] + h["jitter"]) + 1e-3)]
            self.arrival(now, hop, (hop, "held"), payload)       # counted; not on the FIFO link
        else:
            at = [self.arrival(now, hop, end, payload)]
        if f.get("duplicate") and rnd() < f["duplicate"]:
            self.counts["duplicated"] += 1
            at.append(at[0] + self.rng.uniform(0.0, self.hops[hop]["jitter"] + 1e-3))
        return at
