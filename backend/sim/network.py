"""The simulator's network model (DESIGN.md §5): per-hop delay and jitter, FIFO per link, counts per hop.

A hop (``up``, ``down``, a relay's ``hop1``) has a delay and a uniform jitter; every link (hop,
endpoint) delivers in the order it was sent, so a message never overtakes an earlier one on its
link. Messages and bytes are counted per hop, and per codec kind, from ``warmup`` on.

A hostile network (``faults``, issue #20) applies per-message probabilities in both directions:
``loss`` drops a message, ``duplicate`` delivers it twice (the copy a jitter later), ``reorder``
holds it back by up to twice the hop's delay plus jitter outside the FIFO so later messages
overtake it, and a partition schedule ``[(start, end, devices or None for all)]`` drops every
message to or from a partitioned endpoint.

Draws are paired across runs (common random numbers): every link (hop, endpoint) has its own stream seeded
from the run's seed and the link's name, and each message takes the same number of draws from it, so the
k-th message on a link meets the same jitter and the same fate in any two runs of one seed — what one run
sends on other links, or how many messages it sends here, changes nothing for it. Two protocols compared on
one seed then differ by what they send, not by which of their messages the network happened to drop.
"""
import random

from edge.core import codec


class Network:
    DRAWS = 6           # per message with faults: jitter, loss, reorder, its hold, duplicate, the copy's lag

    def __init__(self, hops, seed, warmup=0.0, faults=None):
        self.hops = {h: dict(d) for h, d in hops.items()}   # hop -> {"delay": s, "jitter": s}
        self.seed = seed
        self.streams = {}                       # (hop, endpoint) -> its random.Random
        self.warmup = warmup
        self.fifo = {}
        self.messages = {h: 0 for h in hops}
        self.bytes = {h: 0 for h in hops}
        self.by_kind = {}
        self.faults = faults or {}
        self.counts = {"lost": 0, "duplicated": 0, "reordered": 0, "partitioned": 0}

    def set(self, hop, delay=None, jitter=None):
        """Change a hop's delay or jitter from now on (a workload ``delay`` event)."""
        if delay is not None:
            self.hops[hop]["delay"] = delay
        if jitter is not None:
            self.hops[hop]["jitter"] = jitter

    def draws(self, hop, end, n):
        """The next message's ``n`` uniform draws in [0, 1) on link (``hop``, ``end``)."""
        key = (hop, end)
        r = self.streams.get(key)
        if r is None:
            r = self.streams[key] = random.Random("%s/%s/%s" % (self.seed, hop, end))
        return [r.random() for _ in range(n)]

    def arrival(self, now, hop, end, payload, u):
        """When a message sent at ``now`` on ``hop`` to or from ``end`` arrives (``u``: its jitter draw); counts it."""
        h = self.hops[hop]
        delay = h["delay"] + u * h["jitter"]
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
            return [self.arrival(now, hop, end, payload, self.draws(hop, end, 1)[0])]
        jitter, loss, reorder, hold, dup, lag = self.draws(hop, end, self.DRAWS)
        if self.partitioned(now, end):
            self.counts["partitioned"] += 1
            return []
        if f.get("loss") and loss < f["loss"]:
            self.counts["lost"] += 1
            return []
        h = self.hops[hop]
        if f.get("reorder") and reorder < f["reorder"]:
            self.counts["reordered"] += 1
            at = [now + h["delay"] + hold * (2 * (h["delay"] + h["jitter"]) + 1e-3)]
            self.arrival(now, hop, (hop, "held"), payload, jitter)      # counted; not on the FIFO link
        else:
            at = [self.arrival(now, hop, end, payload, jitter)]
        if f.get("duplicate") and dup < f["duplicate"]:
            self.counts["duplicated"] += 1
            at.append(at[0] + lag * (h["jitter"] + 1e-3))
        return at
