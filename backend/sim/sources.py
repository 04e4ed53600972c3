"""Source streams of a fleet workload (DESIGN.md §5): synthetic generators from the papers, CSV traces, outages.

``samples(w)`` materialises every reading as arrays ``(time, source index, value)`` sorted by time;
``outages(w)`` draws the devices' offline spans (Zhu §1.2); ``read_trace`` reads a ``time,source,value`` CSV.
"""
import csv
import math
import os

import numpy as np

from backend.sim.spec import WorkloadError, number, pair


def read_trace(path):
    """(times, source names, values) of a CSV trace in time order; WorkloadError names the bad line."""
    if not os.path.exists(path):
        raise WorkloadError("trace file %s does not exist" % path)
    times, names, values = [], [], []
    with open(path, newline="") as fh:
        rd = csv.reader(fh)
        header = next(rd, None)
        if header is None or [h.strip() for h in header[:3]] != ["time", "source", "value"]:
            raise WorkloadError("trace %s must start with the header time,source,value" % path)
        last = -math.inf
        for n, row in enumerate(rd, start=2):
            if not row:
                continue
            try:
                t, name, v = float(row[0]), row[1].strip(), float(row[2])
            except (ValueError, IndexError):
                raise WorkloadError("trace %s line %d: expected time,source,value, got %r" % (path, n, row))
            if not (math.isfinite(t) and math.isfinite(v)) or not name:
                raise WorkloadError("trace %s line %d: non-finite number or empty source" % (path, n))
            if t < last:
                raise WorkloadError("trace %s line %d: rows must be in time order" % (path, n))
            last = t
            times.append(t)
            names.append(name)
            values.append(v)
    if not times:
        raise WorkloadError("trace %s has no rows" % path)
    return times, names, values




def outages(w):
    """{device: [(start, end), ...]} from ``sources.outages`` (Poisson starts, exponential lengths)."""
    spec = w.sources.get("outages")
    if not spec or spec["rate"] <= 0:
        return {}
    rng = np.random.default_rng(w.seed + 2)
    out = {}
    for dev, _ in w.devices():
        spans = []
        t = rng.exponential(1.0 / spec["rate"])
        while t < w.duration:
            length = rng.exponential(spec["mean_length"])
            spans.append((float(t), float(t + length)))
            t += length + rng.exponential(1.0 / spec["rate"])
        out[dev] = spans
    return out


def samples(w):
    """All source readings of workload ``w`` as (times, source indices, values), sorted by time."""
    if w.trace is not None:
        times, names, values = w.trace
        idx = {s: i for i, s in enumerate(w.source_ids)}
        t = np.asarray(times, dtype=float)
        keep = t <= w.duration
        return t[keep], np.asarray([idx[n] for n in names], dtype=np.int64)[keep], np.asarray(values, dtype=float)[keep]
    src = w.sources
    rng = np.random.default_rng(w.seed)
    n = len(w.source_ids)
    interval = number(src, "interval", 1.0, "sources", positive=True)
    gen = src["generator"]
    if src.get("arrival", "periodic") == "periodic":
        steps = int(math.floor(w.duration / interval)) + 1
        t = np.repeat(np.arange(steps) * interval, n)
        s = np.tile(np.arange(n), steps)
        shape = (steps, n)
    else:
        per = int(math.ceil(w.duration / interval * 1.5)) + 10
        gaps = rng.exponential(interval, size=(per, n))
        gaps[0] = 0.0
        tt = np.cumsum(gaps, axis=0)
        shape = (per, n)
        t, s = tt.ravel(), np.tile(np.arange(n), per)
    if gen == "uniform":
        lo, hi = pair(src, "range", [0.0, 1000.0], "sources")
        v = rng.uniform(lo, hi, size=shape)
    elif gen == "brownian":
        # drifted Brownian motion (Zhu §4.2 Eq. 4): per-source μ and σ, increments over the real gaps
        a, b = pair(src, "start", 0.0, "sources")
        start = rng.uniform(a, b, size=n)
        mu = rng.uniform(*pair(src, "drift", 0.0, "sources"), size=n)
        sigma = rng.uniform(*pair(src, "volatility", 1.0, "sources"), size=n)
        gap = np.diff(t.reshape(shape), axis=0, prepend=0.0)
        d = mu * gap + sigma * np.sqrt(gap) * rng.normal(0.0, 1.0, size=shape)
        v = start + np.cumsum(d, axis=0)
    else:
        a, b = pair(src, "start", 0.0, "sources")
        start = rng.uniform(a, b, size=n)
        sa, sb = pair(src, "step", 1.0, "sources")
        step = rng.uniform(sa, sb, size=n)
        if src.get("steps", "binary") == "normal":
            d = rng.normal(0.0, 1.0, size=shape) * step
        else:
            d = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0) * step
        d[0] = 0.0
        v = start + np.cumsum(d, axis=0)
    v = v.ravel()
    order = np.argsort(t, kind="stable")
    t, s, v = t[order], s[order], v[order]
    keep = t <= w.duration
    return t[keep], s[keep], v[keep]
