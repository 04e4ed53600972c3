"""The trace suite's query sets beyond its one AVG (backend/bench/traces.py): lagged and real-time queries on the same
sources (segment mode beside the sources' filters, backend/coordinator/core/segments.py; Olston et al. 2003 §1.2,
App. A), and Zhu & Ravishankar 2004's probabilistic answers.

Per trace: the default AVG (``suite.describe``) and a MAX over ⌈n/3⌉ of its n sources, the most variable ones
(largest mean absolute change between successive readings), with the precision the suite's rule gives the AVG.
``queries(lag_avg, lag_max)`` builds the set with each query lagged by that many sampling intervals (None: real
time): both real time (the deadband baseline ``deadband-mixed``), the AVG lagged for reports and the MAX live for
alarms (``mixed``), or both lagged (``all-lagged``);
and the real-time MAX alone under deadband (``max-alone``) and under the default protocol (``max-adaptive``):
what the alarm costs by itself, the floor under ``mixed`` (which pays it and the other sources' segments).
"""
import math
import os

import numpy as np


_PICKED = {}        # (trace path, n) -> the sources of the MAX


def extremes(c, trace_dir):
    """The ⌈n/3⌉ most variable sources of trace ``c`` (ties by name), read once per trace file."""
    path = os.path.abspath(os.path.join(trace_dir, c["name"] + ".csv"))
    k = max(1, math.ceil(c["sources"] / 3))
    got = _PICKED.get((path, k))
    if got is None:
        vals = {}
        with open(path) as fh:
            next(fh)
            for line in fh:
                _, s, v = line.rstrip("\n").split(",")
                vals.setdefault(s, []).append(float(v))
        score = sorted((-float(np.mean(np.abs(np.diff(v)))) if len(v) > 1 else 0.0, s) for s, v in vals.items())
        got = _PICKED[(path, k)] = [s for _, s in score[:k]]
    return got


def queries(lag_avg=None, lag_max=None, avg=True):
    """A column's ``queries``: f(catalogue entry, trace folder) -> the AVG and the MAX, lagged by those many
    sampling intervals (None: real time); without the AVG (``avg`` False): what the MAX costs alone."""
    def make(c, trace_dir):
        mean = dict(c["queries"][0])
        top = {"id": "max", "kind": "max", "sources": extremes(c, trace_dir), "precision": mean["precision"]}
        for q, lag in ((mean, lag_avg), (top, lag_max)):
            if lag is not None:
                q["lag"] = lag * c["interval_s"]
        return [mean, top] if avg else [top]
    return make


def shared_table(workloads, log):
    """Each shared bench workload (``report.workloads``) with SUM/AVG queries and a lag-free one: its SUM/AVG
    lagged by 10 sampling intervals (the others live), under deadband and adaptive, next to every query real
    time under deadband; rows of messages and the ratio (``quietfleet bench``)."""
    from backend.sim import engine
    from backend.sim.sources import samples
    from backend.sim.workload import load
    rows = []
    for name, spec in workloads:
        kinds = [q["kind"] for q in spec["queries"]]
        if not any(k in ("sum", "avg") for k in kinds) or all(k in ("sum", "avg") for k in kinds):
            continue
        t, s, _ = samples(load(dict(spec, protocol="deadband")))
        step = float(np.median(np.diff(t[s == 0]))) if (s == 0).sum() > 1 else 1.0
        lagged = [dict(q, lag=10 * step) if q["kind"] in ("sum", "avg") else q for q in spec["queries"]]
        base = engine.run(dict(spec, protocol="deadband", params={"models": "constant"}))
        row = {"workload": name, "lag_s": 10 * step, "all real time (deadband)": base["messages"]["up"] + base["messages"]["down"]}
        for proto in ("deadband", "adaptive"):
            r = engine.run(dict(spec, protocol=proto, queries=lagged))
            m = r["messages"]["up"] + r["messages"]["down"]
            row["lagged SUM/AVG, %s" % proto] = m
            row["ratio (%s)" % proto] = round(m / row["all real time (deadband)"], 4)
            row["violations (%s)" % proto] = r["violations"]
        log("  mixed %s: %s" % (name, row))
        rows.append(row)
    return rows
