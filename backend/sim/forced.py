"""The time the injected faults force answers to be unknowable (issue #20), to set beside the degraded time.

A source is unknowable from the moment an uplink about it (a report, a probe reply, a birth) is lost
until the next one that gets through is sent, and from the moment a late one is sent (it arrives
more than λ after) until λ before it arrives: no coordinator, however clever, could have stated its
current bound meanwhile. A query's forced time is the measure of the union of its sources' unknowable
spans within the run. Lost beats and downlinks force nothing (a hull or a retry covers them).
"""
from edge.core import codec


class Forced:
    def __init__(self, latency, duration, source_keys):
        self.latency = latency          # λ of the workload (the delay bound)
        self.duration = duration
        self.keys = source_keys         # device -> [source key by index]
        self.open = {}                  # key -> since when it is unknowable
        self.spans = {}                 # key -> [(start, end)]

    def uplink(self, now, device, payload, arrivals):
        """An uplink sent at ``now``: lost (no ``arrivals``), late, or on time."""
        try:
            kind, m = codec.decode(payload)
        except codec.CodecError:
            return
        names = self.keys.get(device, ())
        if codec.PLAIN.get(kind, kind) in ("report", "reply", "rsegs"):
            keys = names[m["src"]:m["src"] + 1]
        elif kind == "birth":
            keys = names[m["first"]:m["first"] + len(m["sources"])]
        else:
            return
        known = max(now, min(arrivals) - self.latency) if arrivals else None
        for key in keys:
            if known is None:
                self.open.setdefault(key, now)
                continue
            start = self.open.pop(key, now)
            if known > start:
                self.spans.setdefault(key, []).append((start, known))

    def time(self, sources):
        """Measure of the union of the unknowable spans of ``sources`` within [0, duration]."""
        sources = set(sources)
        spans = [s for key in sorted(sources) for s in self.spans.get(key, ())]
        spans += [(t, self.duration) for key, t in self.open.items() if key in sources]
        total, reach = 0.0, 0.0
        for a, b in sorted(spans):
            a, b = max(a, reach), min(b, self.duration)
            if b > a:
                total += b - a
                reach = b
        return total
