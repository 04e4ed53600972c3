"""Spool records -> Coordinator calls, deterministically (Olston et al. 2003 §4 event time; DESIGN.md §6 State).

A ``Feed`` is the sans-IO heart of one Spark query group: it owns a ``Coordinator`` (unchanged) and
turns spool records, taken in offset order, into the coordinator's calls. The coordinator's ``now``
is the record's arrival time (the bridge's clock, made monotone), never a clock read here, so the
same records give the same calls, answers and downlink sequence numbers however they are cut into
micro-batches and however often a batch is replayed after a crash. Idle time arrives as the
bridge's tick records. Query specs (retained, from the ``spec`` topics) are JSON; an empty payload
removes the query; a spec naming sources that have not been born yet waits until they are.
Without an explicit ``t0`` the adjustment ticks start at the first record's arrival (whole seconds).
"""
import json
import math

from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import make
from backend.coordinator.core.queries import QueryError


class Feed:
    def __init__(self, protocol="deadband", period=10.0, shrink=0.0, latency=0.0, beat=0.0, t0=None, **params):
        proto = make(protocol, **params)
        self.protocol = protocol
        self.coord = Coordinator(proto, period=period, shrink=shrink if proto.shrinks else 0.0,
                                 latency=latency, beat=beat, t0=t0 or 0.0)
        self.t0 = t0
        self.now = -math.inf
        self.pending = {}        # query id -> spec waiting for its sources
        self.records = 0
        self.stats = {"foreign": 0, "bad_specs": 0}

    def record(self, arrival, device, channel, payload, retained=False):
        """Apply one spool record; return the coordinator's actions plus
        ``("error", query, message)`` for a refused spec and ``("retract", query)`` for a removal."""
        self.records += 1
        if self.t0 is None:
            self.t0 = self.coord.t0 = float(math.floor(arrival))
        if arrival > self.now:
            self.now = arrival
        now = self.now
        coord = self.coord
        if channel == "up" or channel == "state":
            known = len(coord.cache.sources)
            out = coord.handle_uplink(now, device, bytes(payload), retained=bool(retained))
            if self.pending and len(coord.cache.sources) != known:
                out += self._retry(now)
            return out
        if channel == "tick":
            return coord.handle_timer(now)
        if channel == "spec":
            return self._spec(now, device, bytes(payload))
        self.stats["foreign"] += 1
        return []

    # -- query specs ----------------------------------------------------------------
    def _spec(self, now, qid, payload):
        out = []
        self.pending.pop(qid, None)
        if qid in self.coord.queries:
            out += self.coord.remove_query(qid, now)
        if not payload.strip():
            out.append(("retract", qid))
            return out
        try:
            spec = json.loads(payload)
        except ValueError as e:
            return out + self._bad(qid, "query spec is not JSON: %s" % e)
        if not isinstance(spec, dict):
            return out + self._bad(qid, "query spec must be a JSON object")
        if spec.setdefault("id", qid) != qid:
            return out + self._bad(qid, "spec id %r differs from its topic's query id" % (spec["id"],))
        return out + self._add(now, qid, spec)

    def _missing(self, spec):
        """Sources of ``spec`` not born yet (``["all"]`` while no source at all is known)."""
        srcs, known = spec.get("sources", "all"), self.coord.cache.sources
        if srcs == "all":
            return [] if known else ["all"]
        return [s for s in srcs if isinstance(s, str) and s not in known] if isinstance(srcs, list) else []

    def _add(self, now, qid, spec):
        missing = self._missing(spec)
        if missing:
            self.pending[qid] = spec
            return [("error", qid, "waiting for sources %s to be born" % ", ".join(missing[:5]))]
        try:
            return self.coord.add_query(spec, now)
        except QueryError as e:
            return self._bad(qid, str(e))

    def _bad(self, qid, message):
        self.stats["bad_specs"] += 1
        return [("error", qid, message)]

    def _retry(self, now):
        out = []
        for qid, spec in sorted(self.pending.items()):
            if not self._missing(spec):
                del self.pending[qid]
                out += self._add(now, qid, spec)
        return out


def guarantee(fields):
    """What an answer guarantees: ``degraded``, or the protocol's own word, or ``interval``."""
    if fields.get("degraded"):
        return "degraded"
    return fields.get("guarantee", "interval" if "lo" in fields else "set")


def summary(coord, sources=True):
    """A JSON-able digest of a coordinator: clock, counters, latest answers and (optionally) every
    source's mirrored filter. Two coordinators that took the same calls have equal digests."""
    d = {"clock": coord.clock if math.isfinite(coord.clock) else None, "stats": dict(coord.stats),
         "sources_known": len(coord.cache.sources),
         "online": sum(1 for s in coord.cache.sources.values() if s.online),
         "queries": {qid: coord.last.get(qid) for qid in sorted(coord.queries)}}
    if sources:
        d["sources"] = {k: [s.device, s.value, s.filt.lo, s.filt.hi, s.filt.width, s.filt.epoch, s.online,
                            s.last_t, len(s.old)] for k, s in sorted(coord.cache.sources.items())}
    return d
