"""What real-time per-source filters could save on the real traces (issue #18): offline replays at a fixed width.

Each variant replays one source's readings at the deadband width W (the default AVG query's per-source
width) and counts its reports; no network, no backend. They answer "would this filter model pay if we
built it?" before it is built into edge.core.predict and the backend's mirror:

- ``deadband``: Olston's constant bound, centred on the reading at each report (equals the simulator's
  deadband uplink reports minus births, which ``tests/backend/test_headroom.py`` checks);
- ``lead``: a constant bound centred α·W/2 beyond the reading, towards the side the reading left by;
- ``hull``: today's linear dual prediction: the backend states the hull of the line over the window in
  which the latest reading lies, so the band about the line is h = W/2 − |s|·(gap + H)/2 (gap = 1.5 P,
  H = gap/4, P the median sampling interval; a line without band is constant) — its gap reports left out;
- ``cells``: the backend states the line at the start of the sampling cell its time lies in (see ``Cells``);
- ``exact``: the statement is the line at the latest reading's time ± W/2 (a schedule the backend knows);
  the slope from the previous report to this reading (``two``), the last interval (``last``), or least
  squares over the last k readings, times a damping factor; ``timer``: see ``Timed``;
- ``seasonal``: pred(t) = c0 + x(t − D) − x(t0 − D), D one day, both sides assumed to know x(t − D)
  (optimistic: the backend does not hold those readings);
- ``chooser``: the device's online choice (edge.core.predict.Chooser's rule: shadow report counts over
  a window of ``WINDOW``, a non-constant model only when it saves a quarter plus ``MARGIN``) among
  deadband and three exact variants, and the same over every exact variant with a longer window;
- ``oracle``: per source, the fewest of the exact variants and deadband (or of every variant above),
  chosen after the fact.

``python -m backend.sim.headroom --traces results/traces [--split dev] [--out FILE.md]`` prints one
row per variant (reports relative to deadband per trace, and their geometric mean), with the
clairvoyant minima for reference (relative to these replays' deadband, which leaves births out).
"""
import argparse
import csv
import json
import math
import os
import sys

from backend.sim.clairvoyant import minimum_reports, minimum_segments
from edge.core.predict import GAP, MARGIN, WINDOW

DAY = 86400.0


class Constant:
    """A constant bound ±h about the centre; ``lead``: the centre moves α·h past the reading on a report."""

    def __init__(self, h, lead=0.0):
        self.h, self.lead, self.c = h, lead, None

    def miss(self, i, t, v):
        return self.c is None or abs(v[i] - self.c) > self.h

    def report(self, i, t, v):
        x = v[i]
        self.c = x if self.c is None else x + self.lead * self.h * ((x > self.c) - (x < self.c))


class Line:
    """A line from the latest report; ``slope(i, t, v, t0, c0)`` estimates its slope; ``hull``: the
    statement window in sampling intervals P (0: the line at the reading's time)."""

    def __init__(self, h, slope, damp=1.0, hull=0.0, p=1.0):
        self.h0, self.slope, self.damp, self.cut = h, slope, damp, hull * p / 2
        self.t0, self.c0, self.s, self.h = None, 0.0, 0.0, h

    def miss(self, i, t, v):
        return self.t0 is None or abs(v[i] - (self.c0 + self.s * (t[i] - self.t0))) > self.h

    def report(self, i, t, v):
        s = self.slope(i, t, v, self.t0, self.c0) * self.damp if self.t0 is not None else 0.0
        h = self.h0 - abs(s) * self.cut
        if h < 0:
            s, h = 0.0, self.h0
        self.t0, self.c0, self.s, self.h = t[i], v[i], s, h


class Timed(Line):
    """An exact line whose device checks its held reading at each next sampling instant before the
    reading due there (a timer that runs first, as the simulator runs timers before same-instant
    readings): a held reading outside the line there is reported as a constant — what an exact
    statement costs when the device cannot tell a late reading from one about to come."""

    def before(self, i, t, v):
        if self.t0 is None or not self.s or abs(v[i - 1] - (self.c0 + self.s * (t[i] - self.t0))) <= self.h:
            return 0
        self.t0, self.c0, self.s, self.h = t[i], v[i - 1], 0.0, self.h0
        return 1


class Cells(Line):
    """A statement per sampling cell: the backend states the line at the start of the cell of P its time
    lies in, so a reading must fit its own cell and the next (the device reports at the next cell
    boundary if no reading came): the band is 2h − |s|·P wide, centred half a cell ahead."""

    def __init__(self, h, slope, damp, p):
        Line.__init__(self, h, slope, damp, 1.0, p)
        self.ahead = p / 2

    def miss(self, i, t, v):
        return self.t0 is None or abs(v[i] - (self.c0 + self.s * (t[i] - self.t0 + self.ahead))) > self.h

    def report(self, i, t, v):
        Line.report(self, i, t, v)
        self.c0 = v[i] - self.s * self.ahead


class Seasonal:
    """Dual prediction by the change over the same time one period earlier (optimistic, see above)."""

    def __init__(self, h, lag):
        self.h, self.lag, self.i0, self.c0 = h, lag, None, 0.0

    def pred(self, i, v):
        i0, k = self.i0, self.lag
        return self.c0 + v[i - k] - v[i0 - k] if k and i0 >= k else self.c0

    def miss(self, i, t, v):
        return self.i0 is None or abs(v[i] - self.pred(i, v)) > self.h

    def report(self, i, t, v):
        self.i0, self.c0 = i, v[i]


def two(i, t, v, t0, c0):
    """Slope from the previous report (t0, c0) to this reading (today's edge.core.predict.slope)."""
    return (v[i] - c0) / (t[i] - t0) if t[i] > t0 else 0.0


def last(i, t, v, t0, c0):
    """Slope of the last sampling interval."""
    return (v[i] - v[i - 1]) / (t[i] - t[i - 1]) if i and t[i] > t[i - 1] else 0.0


def least_squares(k):
    def fit(i, t, v, t0, c0):
        a = max(0, i - k + 1)
        n = i + 1 - a
        if n < 2:
            return 0.0
        mt, mv = sum(t[a:i + 1]) / n, sum(v[a:i + 1]) / n
        den = sum((x - mt) ** 2 for x in t[a:i + 1])
        return sum((x - mt) * (y - mv) for x, y in zip(t[a:i + 1], v[a:i + 1])) / den if den else 0.0
    return fit


def replay(model, t, v):
    """Reports ``model`` sends over the readings (t, v)."""
    n = 0
    timed = isinstance(model, Timed)
    for i in range(len(v)):
        if timed and i:
            n += model.before(i, t, v)
        if model.miss(i, t, v):
            n += 1
            model.report(i, t, v)
    return n


def chooser(models, t, v, window=WINDOW, margin=MARGIN):
    """The device's online choice among ``models`` (factories, the first constant): every model runs in
    shadow, its reports counted and the counts halved when they sum to ``window`` per extra model; at
    each real report the one with the fewest starts from that report (another than the first only when
    it saves a quarter plus ``margin``)."""
    shadows = [m() for m in models]
    cost = [0] * len(models)
    real, at, n = None, None, 0
    for i in range(len(v)):
        for j, g in enumerate(shadows):
            if g.miss(i, t, v):
                cost[j] += i > 0
                g.report(i, t, v)
        if sum(cost) >= window * (len(models) - 1):
            cost = [c >> 1 for c in cost]
        if real is None or real.miss(i, t, v):
            n += 1
            best = min(range(1, len(models)), key=lambda j: cost[j])
            nxt = models[best if cost[best] + (cost[best] >> 2) + margin <= cost[0] else 0]()
            if real is not None and isinstance(nxt, Line):      # its slope from the previous report
                nxt.t0, nxt.c0 = at
            elif real is not None:                              # its lead from the side the reading left by
                nxt.c = real.c if isinstance(real, Constant) else real.c0 + real.s * (t[i] - real.t0)
            nxt.report(i, t, v)
            real, at = nxt, (t[i], v[i])
    return n


def variants(h, p, span):
    """{name: factory of a model} for band h = W/2, median interval p, trace span."""
    lag = int(round(DAY / p)) if p < DAY / 4 and span > 2 * DAY else 0
    return {
        "deadband": lambda: Constant(h),
        "lead 0.5": lambda: Constant(h, 0.5),
        "hull two": lambda: Line(h, two, 1.0, GAP * 1.25, p),
        "hull two ×0.25": lambda: Line(h, two, 0.25, GAP * 1.25, p),
        "exact two": lambda: Line(h, two),
        "exact two ×0.75": lambda: Line(h, two, 0.75),
        "exact two ×0.5": lambda: Line(h, two, 0.5),
        "exact last": lambda: Line(h, last),
        "cells two": lambda: Cells(h, two, 1.0, p),
        "cells two ×0.25": lambda: Cells(h, two, 0.25, p),
        "exact two, timer": lambda: Timed(h, two),
        "exact two ×0.5, timer": lambda: Timed(h, two, 0.5),
        "exact ls3": lambda: Line(h, least_squares(3)),
        "exact ls5": lambda: Line(h, least_squares(5)),
        "exact ls10": lambda: Line(h, least_squares(10)),
        "seasonal 1 d": lambda: Seasonal(h, lag),
    }


EXACT = ("exact two", "exact two ×0.75", "exact two ×0.5", "exact last", "exact ls3", "exact ls5", "exact ls10")


def measure(t, v, width, p, span):
    """{variant: reports} for one source."""
    h = width / 2
    vs = variants(h, p, span)
    out = {k: replay(f(), t, v) for k, f in vs.items()}
    out["oracle (exact, deadband)"] = min(out[k] for k in EXACT + ("deadband",))
    out["oracle (all)"] = min(out.values())
    three = [vs["deadband"], vs["exact two ×0.5"], vs["exact last"], vs["exact two"]]
    out["chooser (exact, 3)"] = chooser(three, t, v)
    out["chooser (exact, all, window 128)"] = chooser([vs["deadband"]] + [vs[k] for k in EXACT], t, v, 128)
    out["clairvoyant_pc"] = minimum_reports(v, width)
    out["clairvoyant_pl"] = minimum_segments(t, v, width)
    return out


def load(path):
    """{source: (times, values)} of a trace CSV (time,source,value)."""
    out = {}
    with open(path) as fh:
        r = csv.reader(fh)
        next(r)
        for a, b, c in r:
            ts, vs = out.setdefault(b, ([], []))
            ts.append(float(a))
            vs.append(float(c))
    return out


def trace(c, trace_dir):
    """{variant: reports} summed over the sources of catalogue entry ``c``."""
    width = c["queries"][0]["precision"]      # AVG over all sources: the uniform width is the precision
    tot = {}
    for _, (t, v) in sorted(load(os.path.join(trace_dir, c["name"] + ".csv")).items()):
        for k, n in measure(t, v, width, c["interval_s"], c["span_s"]).items():
            tot[k] = tot.get(k, 0) + n
    return tot


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=os.path.join("results", "traces"), help="converted traces (scripts/traces.py)")
    ap.add_argument("--split", default="dev", help="dev, held-out, held-out-2, held-out-3, held-out-4 or all")
    ap.add_argument("--out", help="also write the Markdown table here")
    a = ap.parse_args(argv)
    with open(os.path.join(a.traces, "catalogue.json")) as fh:
        cat = [c for c in json.load(fh) if a.split == "all" or c["split"] == a.split]
    rows = [(c["name"], trace(c, a.traces)) for c in cat]
    lines = ["| variant | " + " | ".join(name for name, _ in rows) + " | geomean |", "|" + "---|" * (len(rows) + 2)]
    for k in rows[0][1]:
        r = [tot[k] / tot["deadband"] for _, tot in rows]
        lines.append("| %s | %s | **%.3f** |" % (k, " | ".join("%.3f" % x for x in r),
                                                 math.exp(sum(math.log(x) for x in r) / len(r))))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
