"""The live ground-truth checker (DESIGN.md §4): every answer change against the agents' own logs.

``violations`` replays the readings every agent logged through the simulator's ``Truth`` and checks each
provisional answer change of each query at every instant, honouring revoked windows as the simulator does,
and every final answer without exemption (``backend.sim.final_truth``);
``explain`` prints the first violating instants with the readings and answers around them;
``deadband_reports`` replays the same readings through plain deadband (what the demo and the dashboard compare with). Used by
``quietfleet fleet`` (``fleet.py``) and ``quietfleet demo`` (``demo.py``).
"""
import math

from backend.coordinator.core import aggregate
from backend.coordinator.core.queries import parse_query
from backend.sim import final_truth, truth as truth_mod
from edge.core.interval import IntervalFilter


def time_of(row):
    """A reading's time (a sort key)."""
    return row[0]


def violations(queries, readings, answers, end, wrong=None, finals=None, wrong_finals=None):
    """Check every provisional answer change against the agents' ground truth, honouring revoked windows as the
    simulator's checker does; returns {query: (violations, violation seconds, degraded seconds)}. ``readings``: [(t, source, value)] of every agent,
    each agent's in its log order (a gateway stamps a backlog of board frames with one time: the last sample at
    a time is the value from then on). ``wrong``: a dict that gets {query: [(t, lo, hi, exact)]} of every
    violating instant; ``finals``: a dict that gets {query: ``final_truth.check_final``'s figures} of its final
    answers up to ``end``; ``wrong_finals``: a dict that gets {query: [(final answer, τ, exact, lo, hi)]} of every
    final answer that misses the truth (with ``finals``)."""
    sources = sorted({s for _, s, _ in readings})
    truth = truth_mod.Truth(sources)
    qs = [parse_query(q, set(sources)) for q in queries]
    for q in qs:
        truth.add_query(q, -math.inf)
    index = truth.index
    readings = sorted(readings, key=time_of)      # stable: samples sharing a stamp keep their log order
    i = 0
    while i < len(readings):
        t = readings[i][0]
        while i < len(readings) and readings[i][0] == t:
            truth.update(index[readings[i][1]], readings[i][2])
            i += 1
        truth.flush(t)
    out = {}
    for q in qs:
        fin = [a for a in answers if a["query"] == q.id and a.get("final") and a["time"] <= end]
        if finals is not None:
            missed = []
            finals[q.id] = final_truth.check_final(
                truth.tracks[q.id].timeline, [(a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], a["degraded"],
                                               a["watermark"]) for a in fin],
                min(end, fin[-1]["watermark"]) if fin else end, [(-math.inf, q.precision)], wrong=missed)
            if wrong_finals is not None and missed:
                wrong_finals[q.id] = [(fin[w[0]],) + w[1:] for w in missed]
        answers_q = [a for a in answers if a["query"] == q.id and not a.get("final")]
        mine = [(a["time"], a["lo"], a["hi"], a["degraded"]) for a in answers_q if a["time"] <= end]
        revoked = [a["revoked"] for a in answers_q if "revoked" in a]
        mine = truth_mod.revoke(mine, revoked)      # answers withdrawn later count as degraded (issue #20)
        bad = [] if wrong is not None else None
        v, vt, _, dt = truth_mod.check(truth.tracks[q.id].timeline, mine, q.precision, end, bad)
        if bad:
            wrong[q.id] = bad
        out[q.id] = (v, vt, dt)
    return out


def explain(queries, readings, answers, wrong, out, show=3, around=0.3):
    """Print the first ``show`` violating instants of each query with its sources' readings and its
    answers from the one in force to ``around`` s after each (what a failed run must leave behind to be diagnosed)."""
    rows = sorted(readings, key=time_of) if wrong else []
    for q in queries:
        for t, lo, hi, x in wrong.get(q["id"], [])[:show]:
            out("VIOLATION %s at %.3f: answer [%r, %r], truth %r" % (q["id"], t, lo, hi, x))
            srcs = set(q.get("sources") or ())
            for r in rows:
                if abs(r[0] - t) <= around and (not srcs or r[1] in srcs):
                    out("    reading %.3f %s %r" % r)
            mine = [a for a in answers if a["query"] == q["id"]]
            held = max((a["time"] for a in mine if a["time"] <= t), default=t)     # the answer in force
            for a in mine:
                if held <= a["time"] <= t + around or abs(a["time"] - t) <= around:
                    out("    answer  %.3f %s" % (a["time"], {k: v for k, v in a.items() if k not in ("query", "time")}))


def deadband_reports(queries, readings, start=None):
    """(reports, control messages) plain deadband would send for the same readings: each source keeps
    the narrowest uniform share of its queries (and their count ranges), replayed through the edge
    filter; a control message goes to a source whenever registering the next query changes its filter.
    With ``start``: from that instant on, every filter installed and centred on its source's last
    reading before it (so no control messages, and no report for the registration transient)."""
    sources = sorted({s for _, s, _ in readings})
    width, cons = {s: math.inf for s in sources}, {s: [] for s in sources}
    control = 0
    for q in queries:
        q = parse_query(q, set(sources))
        for s in q.sources:
            w, c = min(width[s], aggregate.uniform_width(q)), list(cons[s])
            if q.kind == "count" and q.range is not None and q.range not in c:
                c.append(q.range)
            control += (w, c) != (width[s], cons[s])
            width[s], cons[s] = w, c
    filt = {s: IntervalFilter(width[s], cons[s]) for s in sources}
    n = 0
    for t, s, v in sorted(readings, key=time_of):
        if start is not None and t < start:
            filt[s].recenter(v)
        elif filt[s].check(v):
            filt[s].recenter(v)
            n += 1
    return n, (0 if start is not None else control)
