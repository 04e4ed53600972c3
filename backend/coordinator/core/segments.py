"""Segment mode: our extension of Olston et al. 2003 §1.2.3 bounds to the lagged line segments of Elmeleegy et al.
2009 (swing/slide filters; not one of the five papers), device side ``edge/core/segment.py``.

A query with ``"lag": L`` (seconds) puts its sources in segment mode when no lag-free query reads them (a source
in both keeps reporting). The device sends data of time τ by τ + D, D = L − λ (``send_lag``), as segments whose
line ± W/2 holds the value at every instant (W its width, ≤ δ per source for MIN/MAX: App. A); the final mirror
(``replay.py``) takes them as its pieces and the finals engine (``finals.py``) answers every aggregate kind from
them. COUNT (with or without a range) keeps its sources reporting: a range constraint (Cheng et al. 2005 §3)
already reports only membership changes, which a segment of width W could not decide near the range's ends.
This module decides who is in segment mode and tells the devices. Segments are stamped by the device, so lag
queries need skew 0. The interface the final mirror uses: ``mode`` (key -> (D seconds, model)) and
``replay.mode(key, t, D, model)`` on every change sent.
"""
import math

from backend.coordinator.core.queries import QueryError

INF = math.inf
LINE, CONST = 1, 2
MODELS = {"line": LINE, "constant": CONST}
PAD = {True: 2.0 ** -20, False: 1e-12}     # relative slack of a float32 / float64 device's line
SEGMENTED = ("sum", "avg", "min", "max")   # kinds whose lag puts sources in segment mode


def lag_of(q):
    return q.extra.get("lag")


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
        self.mode = {}          # key -> (D seconds, model) of a source in segment mode

    def check(self, coord, q):
        """A lag query ``coord`` can run (QueryError otherwise): L beyond the latency tolerance λ."""
        if lag_of(q) is not None and send_lag(coord, q) <= 0:
            raise QueryError("query %s: lag %g s must exceed the latency tolerance λ = %g s by 1 ms at least"
                             % (q.id, lag_of(q), coord.latency))
        if lag_of(q) is not None and not coord.protocol.finals:
            raise QueryError("query %s: lag asks for final answers, and protocol %s gives none (its answers are not "
                             "bounds of the devices' filters: README, final answers)" % (q.id, coord.protocol.name))
        if lag_of(q) is not None and coord.integrity.sigma > 0:
            raise QueryError("query %s: segment mode needs synchronised device clocks (skew 0, have %g s): "
                             "segments are stamped by the device" % (q.id, coord.integrity.sigma))

    @staticmethod
    def _want(coord, qids, want, plain, only=None):
        for qid in qids:
            q = coord.queries[qid]
            for key in q.sources if only is None else (only,):
                if lag_of(q) is None or q.kind not in SEGMENTED:
                    plain[key] = None
                elif key not in want or send_lag(coord, q) < want[key][0]:
                    want[key] = (send_lag(coord, q), MODELS[q.extra.get("segment", "line")])

    def born(self, coord, key):
        """A new source: segment mode if the lag queries naming it want it."""
        want, plain = {}, {}
        self._want(coord, sorted(coord.by_source.get(key, ())), want, plain, key)
        if key in want and key not in plain:
            self.mode[key] = want[key]
            self.send(coord, key, *want[key])

    def queries_changed(self, coord):
        """Put sources in or out of segment mode as the lag queries over them require."""
        want, plain = {}, {}
        self._want(coord, sorted(coord.queries), want, plain)
        for key in list(self.mode):
            if key not in want or key in plain:
                del self.mode[key]
                if key in coord.cache.sources:
                    self.send(coord, key, 0, 0)
        for key, (d, model) in want.items():
            if key not in plain and self.mode.get(key) != (d, model) and key in coord.cache.sources:
                self.mode[key] = (d, model)
                self.send(coord, key, d, model)

    def send(self, coord, key, d, model):
        s = coord.cache.sources[key]
        coord.send(s.device, "segment", {"src": s.index, "lag": round(d * 1000), "model": model})
        coord.finals.replay.mode(key, coord._event_now(), d, model)

    def resync(self, coord, key):
        """A device born again: it restarts its segments when it hears its mode again."""
        if key in self.mode:
            self.send(coord, key, *self.mode[key])
