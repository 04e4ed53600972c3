"""Protocol interface: the policy half of the coordinator (Olston et al. 2003 §1.2.3).

A protocol is the policy half of the coordinator: it decides filters and answers, the coordinator
does messaging, ordering and caching. Hooks get the coordinator and act through
``coord.assign_width``, ``coord.assign_filter`` and ``coord.probe``.

A lag query of a segmented kind (SUM/AVG/MIN/MAX with ``"lag"``) is served by its sources' segments (segment
mode, ``core/segments.py``), never by their filters: a protocol allocates filters over the other queries only
(``realtime``; a lagged COUNT keeps its sources reporting), and gives the segments their width (``segment_width``).
"""
import math

from backend.coordinator.core.aggregate import uniform_width
from backend.coordinator.core.queries import AGGREGATES
from backend.coordinator.core.segments import segmented as lagged


def realtime(coord):
    """The queries sources' filters serve (all but the segmented lag queries), {id: query} in id order."""
    return {qid: coord.queries[qid] for qid in sorted(coord.queries) if not lagged(coord.queries[qid])}


class Protocol:
    name = "protocol"
    kinds = AGGREGATES
    shrinks = False                    # whether the coordinator runs periodic shrinking
    local = False                      # a source's target depends only on the queries over it
    replaces = False                   # queries_changed rebuilds all per-query state: replace in place
    finals = True                      # its answers are bounds of the mirror: final answers (core/finals.py)
    marks = True                       # devices send heartbeat marks by default (core/heartbeat.py); a protocol
                                       # that asks for every value finds a silent device by its probe's timeout

    def may_choose(self, coord, device):
        """Whether ``device`` may choose among its filter models (edge.core.predict): yes, unless the protocol
        guards against regret and cannot weigh that device's choice (``precision.regret.Guard``)."""
        return True

    def source_added(self, coord, key):
        self.apply(coord, key)

    def queries_changed(self, coord, now):
        """Re-apply targets: of every source, or (``local``) of the changed query's sources only, so
        a query change costs the query's size, not the fleet's."""
        keys = coord.cache.sources
        if self.local and coord.changed is not None:
            keys = [k for k in coord.changed if k in keys]
        for key in keys:
            self.apply(coord, key)

    def resync(self, coord, key, want):
        self.apply(coord, key, force=True)

    def reported(self, coord, key, m):
        pass

    def superseded(self, coord, key, m):
        """A report ``m`` of ``key`` reordered behind a newer one (not applied): it was sent all the same."""

    def unseen(self, coord, device, n):
        """``n`` more numbered uplinks of ``device`` are missing (sent, not received: ``Integrity.unseen``); fewer
        when ``n`` < 0 (a missing one arrived)."""

    def blob(self, coord, device, m):
        pass

    def period(self, coord, t):
        pass

    def quiet(self, coord):
        """Whether an adjustment tick changes nothing now (the coordinator may then skip it)."""
        return type(self).period is Protocol.period

    def queue_latency(self, latency):
        """How long the serialising queue holds uplinks, given the latency tolerance λ (§4)."""
        return latency

    def workload_samples(self, keys, times, sources, values):
        """Simulator hook: the whole workload before the run (offline baselines measure it)."""

    static = False                     # a source's filter is ``target``'s for as long as the queries stay

    def segments_needed(self, coord, key, width):
        """Whether a lag query over ``key`` needs its segments (at ``width``): not when its filter is held to no
        wider than that, without constraints, for as long as the queries stay (a static protocol's target)."""
        if not self.static:
            return True
        w, cons = self.target(coord, key)
        return bool(cons) or w > width

    def segment_width(self, coord, key):
        """The width of ``key``'s segments: the narrowest uniform share (§1.2) of the lag queries over it."""
        width = math.inf
        for qid in coord.by_source.get(key, ()):
            if lagged(coord.queries[qid]):
                width = min(width, uniform_width(coord.queries[qid]))
        return width

    def answer(self, coord, q):
        """The answer fields for ``q``: an interval ``{"lo", "hi"}`` (entity protocols: ``members``)."""
        lo, hi = coord.interval(q)
        return {"lo": lo, "hi": hi}

    # -- the static filter a source should carry ---------------------------------------
    def target(self, coord, key):
        """(width, constraints) this protocol wants on ``key``."""
        raise NotImplementedError

    def apply(self, coord, key, force=False):
        width, cons = self.target(coord, key)
        f = coord.cache.sources[key].filt
        if cons != f.cons or (force and cons):
            coord.assign_filter(key, width, cons)
        elif f._r(width) != f.width or force:      # as the mirror stores it (float32 boards)
            coord.assign_width(key, width)


def range_constraints(coord, key):
    """Count-in-range queries over ``key`` need its membership of each range exactly."""
    cons = []
    for qid in sorted(coord.by_source.get(key, ())):
        q = coord.queries[qid]
        if q.kind == "count" and q.range is not None and q.range not in cons and not lagged(q):
            cons.append(q.range)
    return cons
