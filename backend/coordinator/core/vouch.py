"""What an answer says about itself (DESIGN.md §4): its heartbeat, its withdrawal bound, and why it is not
the interval it should be. A mixin of ``Coordinator``.

* ``heartbeat``: the largest heartbeat B among the devices of the query's sources (``heartbeat.py``), kept
  per query as a count of sources per B (a device's B takes few values), so a change costs the sources
  it moves; ``withdraw_within``: the longest a wrong provisional answer can stand before a ``revoked``
  withdraws it (a loss unseen for B, then the watchdog's or the resend's wait).
* An answer without a bound yet (``[-inf, inf]`` at start, after a restart or a birth) is degraded
  "no bound yet: waiting for <sources>", never a plain interval.
* An interval answer wider than its precision δ is degraded "wider than precision: width W, precision δ
  (cause)": a report whose instant is uncertain by its device clock's bounds keeps the bound from before
  it in the hull meanwhile ("clock skew", what ``reserve.py`` budgets for), or a narrowing the device has
  not confirmed keeps the wider mirror in it ("a narrowing not confirmed yet").
"""
import math

WIDTH_TOL = 1e-9        # relative: a width over δ by float rounding only is within it
F32_TOL = 2.0 ** -18    # the same for a query over a float32 board (its mirror pads one float32 step, 2**-20)
NAMED = 5               # sources named in a reason at most
WIDER = "wider than precision: width %.6g, precision %.6g"     # an answer's reason (final ones too: lines.py)
SCAN = 64               # sources looked at for the cause of a wide answer at most


class Vouch:
    def _count_beats(self, qid, keys, sign):
        """Sources ``keys`` (born ones count) join (+1) or leave (-1) query ``qid``'s heartbeat counts."""
        levels = self.beats.setdefault(qid, {})
        links = self.integrity.links
        for key in keys:
            s = self.cache.sources.get(key)
            if s is not None:
                b = links.beat(s.device)
                n = levels.get(b, 0) + sign
                if n:
                    levels[b] = n
                else:
                    levels.pop(b, None)

    def _requeried(self, q, old):
        """``q`` replaced ``old`` (None: new): its heartbeat counts follow its sources."""
        if old is None:
            self.beats.pop(q.id, None)
            self._count_beats(q.id, q.sources, 1)
        else:
            self._count_beats(q.id, [k for k in q.sources if k not in old.weights], 1)
            self._count_beats(q.id, [k for k in old.sources if k not in q.weights], -1)

    def _beat_moved(self, device, was):
        """``device``'s heartbeat moved from ``was``: every query over its sources recounts it."""
        d = self.devices.get(device)
        now = self.integrity.links.beat(device)
        for key in d["keys"] if d else ():
            for qid in self.by_source.get(key, ()):
                levels = self.beats.setdefault(qid, {})
                n = levels.get(was, 0) - 1
                if n > 0:
                    levels[was] = n
                else:
                    levels.pop(was, None)
                levels[now] = levels.get(now, 0) + 1
                self.dirty[qid] = None

    def _vouch(self, q, fields, t):
        """Add what ``q``'s answer ``fields`` (from event time ``t``) must say about itself (see the module);
        measure how far it reaches past its budget (``reserve.py``)."""
        levels = self.beats.get(q.id)
        b = max(levels) if levels else 0.0
        if b > 0:
            fields["heartbeat"] = b
            fields["withdraw_within"] = self.integrity.links.bound(b)
        if fields["degraded"] or "lo" not in fields:
            return
        lo, hi = fields["lo"], fields["hi"]
        budgeted = fields.get("guarantee") != "probabilistic" and q.kind in ("sum", "avg", "min", "max", "count") \
            and "lag" not in q.extra
        width = hi - lo
        if budgeted and width > q.precision - self.reserve.get(q.id) and (not self._held(q)[0] or self._gapped(q)):
            width = q.precision - self.reserve.get(q.id)    # wide for another cause (a precision being reached by
            # shrinking, a narrowing not confirmed, a hull across lost uplinks): not the clock skew the reserve is for
        if budgeted and self.reserve.pending(q.id):
            self.reserve.settled(q.id, t, self._held(q)[1])
        if budgeted and self.reserve.observe(q, t, width):
            self.replan[q.id] = None
        waiting = [k for k in q.sources if -math.inf in self.cache.known(k) or math.inf in self.cache.known(k)] \
            if lo == -math.inf or hi == math.inf else ()
        if waiting or budgeted and (lo == -math.inf or hi == math.inf):     # never a plain [-inf, inf]
            fields["degraded"] = True
            fields["reason"] = "no bound yet: waiting for %s" % ", ".join(waiting[:NAMED] or ["a first report"])
        elif budgeted and hi - lo > q.precision + WIDTH_TOL * (1.0 + abs(lo) + abs(hi)) and not (
                hi - lo <= q.precision + F32_TOL * (abs(lo) + abs(hi)) and self._single(q)):
            fields["degraded"] = True
            fields["reason"] = "%s (%s)" % (WIDER % (hi - lo, q.precision), self._cause(q))

    def _single(self, q):
        """Whether a source of ``q`` is on a float32 board (asked only of an answer a hair over δ)."""
        return any(self.cache.sources[k].filt.pad for k in q.sources if k in self.cache.sources)

    def _held(self, q):
        """(Whether a source of ``q`` states a report's hull while its instant is uncertain, whether one keeps
        a mirror of a narrowing not confirmed yet), its first ``SCAN`` sources looked at."""
        held = narrowing = False
        for key in q.sources[:SCAN]:
            s = self.cache.sources.get(key)
            if s is not None:
                held = held or bool(s.prior) or s.tight is not None and s.tight[0] > self.cache.now
                narrowing = narrowing or bool(s.old)
        return held or len(q.sources) > SCAN and self.integrity.offsets.sigma > 0, narrowing

    def _gapped(self, q):
        """Whether a device of ``q``'s first ``SCAN`` sources has uplinks missing: a report after them is held
        against a bound from before the loss, so its hull spans what the lost ones said (a partition's 20 s of
        drift: width up to 40 past δ − R, seed 5006), which their withdrawal answers, not a reserve."""
        dev = self.integrity.dev
        for key in q.sources[:SCAN]:
            s = self.cache.sources.get(key)
            d = None if s is None else dev.get(s.device)
            if d is not None and d["missing"]:
                return True
        return False

    def _cause(self, q):
        """Why ``q``'s answer is wider than its widths."""
        held, narrowing = self._held(q)
        causes = (["clock skew"] if held else []) \
            + (["a narrowing not confirmed yet"] if narrowing or len(q.sources) > SCAN else [])
        return " or ".join(causes) or "rounding"
