"""The simulator's network model (DESIGN.md §5): per-hop delay and jitter, FIFO per link, counts per hop.

A hop (``up``, ``down``, a relay's ``hop1``) has a delay and a uniform jitter; every link (hop,
endpoint) delivers in the order it was sent, so a message never overtakes an earlier one on its
link. Messages and bytes are counted per hop, and per codec kind, from ``warmup`` on.
"""
from edge.core import codec


class Network:
    def __init__(self, hops, uniform, warmup=0.0):
        self.hops = {h: dict(d) for h, d in hops.items()}   # hop -> {"delay": s, "jitter": s}
        self.uniform = uniform                  # uniform(a, b): the jitter draw
        self.warmup = warmup
        self.fifo = {}
        self.messages = {h: 0 for h in hops}
        self.bytes = {h: 0 for h in hops}
        self.by_kind = {}

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
