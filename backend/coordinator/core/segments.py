"""Segment mode: our extension of Olston et al. 2003 §1.2.3 bounds to the lagged line segments of Elmeleegy et al.
2009 (swing/slide filters; not one of the five papers), device side ``edge/core/segment.py``.

A SUM/AVG/MIN/MAX query with ``"lag": L`` (seconds) puts its sources in segment mode, at the width the protocol
gives the lag queries (``Protocol.segment_width``; ≤ δ per source for MIN/MAX: App. A), unless a lag-free query
holds the source's filter to no wider than that for good (``Protocol.segments_needed``): its bounds then serve
the lag queries too, at no message of their own. Otherwise the lag-free queries are served by the source's
filter, whose width and constraints the protocol allocates over them only, and its reports carry the device's
pending segments (kind ``rsegs``); a source served by its filter that the protocol wants to let go (a MIN/MAX
cut) is asked for segments first (``ready``). COUNT (with or without a range) keeps its sources reporting: a
range constraint (Cheng et al. 2005 §3) already reports only membership changes, which a segment of width W
could not decide near the range's ends. The device sends data of time τ by τ + D, D = L − λ (``send_lag``);
the final mirror (``replay.py``) takes the segments as its pieces and the finals engine (``finals.py``) answers
every aggregate kind from them. This module decides who is in segment mode and tells the devices. Segments
are stamped by the device: the final mirror places them within its clock's bounds (``sequence._segment``,
``replay._band``), so lag queries run under any skew σ. The interface the final mirror uses: ``mode`` (key ->
(D seconds, model, width)) and ``replay.mode(key, t, D, model)`` on every change sent.
"""
import math

from backend.coordinator.core.integrity import RETRY
from backend.coordinator.core.queries import QueryError

INF = math.inf
LINE, CONST = 1, 2
MODELS = {"line": LINE, "constant": CONST}
PAD = {True: 2.0 ** -20, False: 1e-12}     # relative slack of a float32 / float64 device's line
SEGMENTED = ("sum", "avg", "min", "max")   # kinds whose lag puts sources in segment mode


def lag_of(q):
    return q.extra.get("lag")


def segmented(q):
    """Whether ``q`` is served by its sources' segments: a lag query of a ``SEGMENTED`` kind."""
    return lag_of(q) is not None and q.kind in SEGMENTED


def before(t, d):
    """The largest time τ with τ + ``d`` < ``t`` in floats: data of τ is sent by τ + D as the device adds
    it, so a message stamped exactly τ + D may still be on its way at clock ``t`` (t − D may round above)."""
    if t == -INF or t == INF:
        return t
    h = t - d
    while h + d >= t:       # by an ulp of h or of t, whichever is coarser: h + d rounds at t's scale
        h -= max(math.ulp(h), math.ulp(t))
    return h


def send_lag(coord, q):
    """D = L − λ in whole milliseconds, rounded down: what the device is told and the mirror assumes."""
    return math.floor((lag_of(q) - coord.latency) * 1000 + 1e-6) / 1000


class Mirror:
    def __init__(self):
        self.mode = {}          # key -> (D seconds, model, width) of a source in segment mode
        self.plain = {}         # key -> None: sources of lag queries served by their filter's bounds (no segments)
        self.asked = {}         # key -> downlink number of its segment mode, until a segment shows it in force
        self.sent = {}          # key -> (event time its segment mode left, times it was sent again)
        self.blind = {}         # key -> downlink number of a segment mode sent before it had a reading (no wait)
        self.alone = {}         # device -> its segment messages that no report carried

    def check(self, coord, q):
        """A lag query ``coord`` can run (QueryError otherwise): L beyond the latency tolerance λ."""
        if lag_of(q) is not None and send_lag(coord, q) <= 0:
            raise QueryError("query %s: lag %g s must exceed the latency tolerance λ = %g s by 1 ms at least"
                             % (q.id, lag_of(q), coord.latency))
        if lag_of(q) is not None and not coord.protocol.finals:
            raise QueryError("query %s: lag asks for final answers, and protocol %s gives none (its answers are not "
                             "bounds of the devices' filters: README, final answers)" % (q.id, coord.protocol.name))

    @staticmethod
    def _want(coord, qids, want, only=None):
        """(D, model, width) of every source of the segmented lag queries among ``qids`` (or of ``only``): the
        shortest D, the model of the query that asks it, the width the protocol gives the lag queries."""
        for qid in qids:
            q = coord.queries[qid]
            for key in q.sources if only is None else (only,):
                if segmented(q) and (key not in want or send_lag(coord, q) < want[key][0]):
                    want[key] = (send_lag(coord, q), MODELS[q.extra.get("segment", "line")])
        for key in want:
            want[key] += (coord.protocol.segment_width(coord, key),)

    def born(self, coord, key):
        """A new source: segment mode if a lag query names it and its filter does not serve it."""
        want = {}
        self._want(coord, sorted(coord.by_source.get(key, ())), want, key)
        if key in want and coord.protocol.segments_needed(coord, key, want[key][2]):
            self.mode[key] = want[key]
            self.send(coord, key, *want[key])
        elif key in want:
            self.plain[key] = None
        self._ceilings(coord, (coord.cache.sources[key].device,))

    def _ceilings(self, coord, devices):
        """Each of ``devices`` may stay silent up to its shortest D when every source of it a query reads
        serves lag queries alone, in segment mode: a final answer over it is due no sooner (``heartbeat.py``);
        for ever (34 years) when no query reads it: nothing over it is due."""
        for dev in devices:
            ds = [self.mode[k][0] if k in self.mode and all(segmented(coord.queries[q]) for q in coord.by_source[k])
                  else None for k in coord.devices.get(dev, {}).get("keys", ()) if coord.by_source.get(k)]
            was = coord.integrity.capped(dev, math.inf if not ds else None if None in ds else min(ds),
                                         coord._event_now() + coord.latency)     # (when its controls have left)
            if was is not None:
                coord._beat_moved(dev, was)     # (its queries state the B waited now)

    def ready(self, coord, key):
        """Whether a lag query over ``key`` may lose its filter's bounds: not before its segments flow (a
        source served by its filter is asked for them now; its filter must stay as it is until then)."""
        if key not in self.plain:
            return True
        if key not in self.mode:
            want = {}
            self._want(coord, sorted(coord.by_source.get(key, ())), want, key)
            self.mode[key] = want[key]
            self.send(coord, key, *want[key])
        return False

    def queries_changed(self, coord, changed):
        """Put sources in or out of segment mode as the lag queries over them require: those of the queries
        ``changed`` (the new one and the one it replaces, or None), of them only those in segment mode or
        served by their filter when neither is a lag query, so registering n queries costs O(their sources)."""
        qs = [q for q in changed if q is not None]
        keys = list(dict.fromkeys(k for q in qs for k in q.sources))
        if not any(segmented(q) for q in qs):
            keys = [k for k in keys if k in self.mode or k in self.plain]
        want = {}
        for key in keys:
            one = {}
            self._want(coord, sorted(coord.by_source.get(key, ())), one, key)
            want.update(one)
        for key in keys:
            if key in self.mode and key not in want:
                del self.mode[key]
                if key in coord.cache.sources:
                    self.send(coord, key, 0, 0, 0.0)
        for key, m in want.items():
            if key not in coord.cache.sources:
                continue        # (joins when it is born)
            if key in self.mode or coord.protocol.segments_needed(coord, key, m[2]):
                if self.mode.get(key) != m:
                    self.mode[key] = m
                    self.send(coord, key, *m)
            elif key not in self.plain:
                self.plain[key] = None
        for key in keys:
            if key in self.plain and key not in want:
                del self.plain[key]
        cache, links = coord.cache.sources, coord.integrity.links
        keys += [k for q in qs for k in q.sources         # (and every source that is or was read by no query)
                 if k in cache and (not coord.by_source.get(k) or links.idle(cache[k].device))]
        self._ceilings(coord, sorted({cache[k].device for k in keys if k in cache}))

    def send(self, coord, key, d, model, width, tries=0):
        """Tell ``key``'s device its segment mode (the final mirror too); a device with a reading answers at
        once with a segment starting then, and is told again until it has (``resend``)."""
        s = coord.cache.sources[key]
        coord.send(s.device, "segment", {"src": s.index, "lag": round(d * 1000), "model": model, "width": width})
        now = coord._event_now()
        coord.finals.replay.mode(key, now, d, model)
        self.sent[key] = (now, tries)
        self.blind.pop(key, None)
        if model and s.value is not None:
            self.asked[key] = coord.devices[s.device]["down"]
            coord._leave(s.device, ("segment", key), self.asked[key], wait=(None, RETRY, tries, False))
        elif model:
            self.blind[key] = coord.devices[s.device]["down"]

    def reported(self, coord, key, t):
        """A plain report of ``key`` stamped ``t``: from a source in segment mode, sent too long after its mode
        left to have crossed it, the device never got it (it had no reading to answer with then)."""
        if key in self.mode and t > self.sent[key][0] + 2 * coord.latency + coord.integrity.margin:
            self.resend(coord, key, self.sent[key][1] + 1)
        elif key in self.blind:     # it may have crossed its mode, which found no reading to answer with: it
            self.asked[key] = self.blind.pop(key)      # answers now that it has one, else it never got it
            coord._leave(coord.cache.sources[key].device, ("segment", key), self.asked[key],
                         wait=(None, RETRY, self.sent[key][1], False))

    def resend(self, coord, key, tries):
        """No segment of ``key`` since its mode was sent (``send``): the control or the answer was lost."""
        if key in self.mode:
            self.send(coord, key, *self.mode[key], tries=tries)

    def resync(self, coord, key):
        """A device born again: it restarts its segments when it hears its mode again."""
        if key in self.mode:
            self.send(coord, key, *self.mode[key])

    def receive(self, coord, device, m):
        """A ``segs`` or ``rsegs`` message from ``device`` (its pieces are the final mirror's): a source whose
        segments flow is served by them from here on, and its segment mode is in force."""
        if "why" not in m:
            self.alone[device] = self.alone.get(device, 0) + 1
        for r in m["segs"]:
            key = coord.key_of(device, r["src"])
            if key not in self.mode:
                continue
            self.plain.pop(key, None)
            self.blind.pop(key, None)
            if key in self.asked:
                coord.integrity.answered(device, ("segment", key), self.asked.pop(key))
