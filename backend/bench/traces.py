"""``quietfleet bench`` section: the real-trace suite (issue #18 item 6), each split (dev, held-out, ...) apart.

For every trace of ``backend.bench.suite`` with its default AVG query: messages (up + down) of each protocol
column in ``COLUMNS``, the clairvoyant piecewise-constant and piecewise-linear minima per source at
the deadband width, ratios to deadband, their geometric means, simulator samples/s, and plots. Columns of
other query sets (``backend.bench.mixed``: the AVG beside a MAX, lagged or not) are compared with their own
baseline (``base``), and a probabilistic column shows its measured fidelity beside its messages.
Each simulation runs in a child process under a wall-clock limit, so a run that stalls shows as a
timeout instead of stalling the report. ``main`` is ``scripts/traces.py`` (convert, optionally ``--bench``).
"""
import csv
import math
import multiprocessing
import os
import time

from backend.bench import mixed, suite
from backend.coordinator.core import aggregate
from backend.coordinator.core.queries import parse_query
from backend.coordinator.protocols import PROTOCOLS
from backend.sim import engine
from backend.sim.clairvoyant import minimum_reports, minimum_segments
from backend.sim.sources import samples
from backend.sim.workload import load

def _top4(c, spec):
    """A MAX over the trace's first four sources at the precision of its AVG."""
    return [{"id": "top", "kind": "max", "sources": load(spec).source_ids[:4], "precision": c["queries"][0]["precision"]}]


# The protocol columns, each run with default parameters unless it says otherwise. More (filter models,
# segment mode at two lags) are appended here, one entry each: ``params`` and ``query`` may be dicts or
# functions of the catalogue entry, e.g. a segment column
# {"label": "segment L=10", "protocol": ..., "query": lambda c: {"lag": 10 * c["interval_s"]}}. ``queries``
# (a function of the entry and the trace folder) replaces the trace's queries, ``more`` (a function of the
# entry and its workload) adds queries to them, ``base`` names the column its ratio is to (default
# deadband), ``fidelity`` shows the measured fidelity of a probabilistic query.
COLUMNS = [
    {"label": "deadband", "protocol": "deadband", "params": {"models": "constant"}},
    {"label": "optimal_static", "protocol": "optimal_static"},
    {"label": "adaptive", "protocol": "adaptive"},
    # the shape users give: the AVG over all plus a MAX over a few (4) at the same precision, real-time
    {"label": "deadband-2q", "protocol": "deadband", "params": {"models": "constant"}, "more": _top4,
     "base": "deadband-2q"},
    {"label": "adaptive-2q", "protocol": "adaptive", "more": _top4, "base": "deadband-2q"},
    {"label": "linear", "protocol": "deadband", "params": {"models": "linear"}},
    {"label": "choose", "protocol": "deadband", "params": {"models": "choose"}},
    # segment mode (backend/coordinator/core/segments.py): final answers by t + L, L = 3 and 10 sampling intervals
    {"label": "segment L=3", "protocol": "deadband", "query": lambda c: {"lag": 3 * c["interval_s"]}},
    {"label": "segment L=10", "protocol": "deadband", "query": lambda c: {"lag": 10 * c["interval_s"]}},
    # the same query as a MAX (its final answers: backend/coordinator/core/finals.py), each source within δ
    {"label": "segment MAX L=10", "protocol": "deadband", "query": lambda c: {"lag": 10 * c["interval_s"], "kind": "max"}},
    # the AVG and a real-time MAX over a third of the sources (backend/bench/mixed.py): both real time under
    # deadband (the baseline), the AVG lagged by 10 sampling intervals for reports and the MAX live for
    # alarms, and both lagged; default parameters of the product's protocol
    {"label": "deadband-mixed", "protocol": "deadband", "params": {"models": "constant"}, "queries": mixed.queries()},
    {"label": "mixed", "protocol": "adaptive", "queries": mixed.queries(10), "base": "deadband-mixed"},
    {"label": "all-lagged", "protocol": "adaptive", "queries": mixed.queries(10, 10), "base": "deadband-mixed"},
    {"label": "max-alone", "protocol": "deadband", "params": {"models": "constant"},
     "queries": mixed.queries(avg=False), "base": "deadband-mixed"},
    {"label": "max-adaptive", "protocol": "adaptive", "queries": mixed.queries(avg=False), "base": "deadband-mixed"},
    # Zhu & Ravishankar 2004 at confidence 0.95: its adjustment tick at the sampling interval (at most a day),
    # deferrals up to 100 intervals (its defaults, 10 s and 600 s, fit second-scale data only)
    {"label": "brownian", "protocol": "brownian", "query": {"confidence": 0.95}, "fidelity": True,
     "params": lambda c: {"period": min(c["interval_s"], 86400.0), "tmax": 100 * c["interval_s"]}},
]
MINIMA = (("clairvoyant_pc", lambda t, v, w: minimum_reports(v, w)), ("clairvoyant_pl", minimum_segments))
TITLES = {"dev": "Development traces", "held-out": "Held-out traces (never tuned on)",
          "held-out-2": "Held-out traces, second set (added 2026-11-24, never tuned on)",
          "held-out-3": "Held-out traces, third set (added 2026-11-26, kept from the engineers until the final run)",
          "held-out-4": "Held-out traces, fourth set (added 2026-11-28, run once, on the round's final code)",
          "synthetic": "Synthetic traces (seeded stand-ins for larger fleets, `backend/bench/synthetic.py`)"}   # one per suite.SPLITS


def _of(x, c):
    """A column's ``params``/``query``: a dict, a function of the catalogue entry, or None."""
    return (x(c) if callable(x) else x) or {}


FINALS = ("finals", "final_violations", "final_revoked", "final_precision_misses", "final_degraded", "final_through")


def _child(spec, conn):
    r = engine.run(spec)
    out = {k: r[k] for k in ("messages", "samples", "violations", "runtime_s", "samples_per_s")}
    out["fidelity"] = min([q["fidelity"] for q in r["queries"].values() if q.get("fidelity") is not None] or [None])
    q = r["queries"][spec["queries"][0]["id"]]
    out.update({k: q.get(k) for k in FINALS}, final_p99=(q.get("final_latency") or {}).get("p99"))
    conn.send(out)
    conn.close()


def run_limited(spec, limit):
    """engine.run(spec) in a child process; its figures, or None if it did not finish within ``limit`` s."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(spec, child), daemon=True)
    p.start()
    child.close()
    try:
        out = parent.recv() if parent.poll(limit) else None
    except EOFError:        # the child died before it sent anything: its exit code says how
        out = None
    if out is None:
        p.terminate()
    p.join()
    if out is None and p.exitcode not in (0, -15, None):
        raise RuntimeError("simulation of %s failed in its child process (exit %s)" % (spec["name"], p.exitcode))
    return out


def minima(spec):
    """{label: fewest reports summed over sources} at each source's deadband width for ``spec``'s queries."""
    w = load(dict(spec, protocol="deadband"))
    width = {}
    for q in w.queries:
        pq = parse_query(q, w.source_ids)
        for s in pq.sources:
            width[s] = min(width.get(s, math.inf), aggregate.uniform_width(pq))
    t, s, v = samples(w)
    out = {}
    for label, fn in MINIMA:
        total = 0
        for i, name in enumerate(w.source_ids):
            m = s == i
            if name in width and m.any():
                total += fn(t[m].tolist(), v[m].tolist(), width[name])
        out[label] = total
    return out


def measure(cat, trace_dir, limit, duration=None, columns=None, log=print):
    """One row per trace and one run record per (trace, column)."""
    rows, runs = [], []
    columns = [col for col in columns or COLUMNS if col["protocol"] in PROTOCOLS]
    for c in cat:
        row = {"trace": c["name"], "split": c["split"], "domain": c["domain"], "sources": c["sources"],
               "span": suite.human(duration if duration is not None else c["span_s"]),
               "interval": suite.human(c["interval_s"])}
        for col in columns:
            label, proto = col["label"], col["protocol"]
            p = dict(_of(col.get("params"), c))
            rec = {"trace": c["name"], "split": c["split"], "column": label, "protocol": proto,
                   "params": p, "limit_s": limit}
            spec = suite.workload(c, trace_dir, proto, p, duration)
            if "queries" in col:
                spec["queries"] = col["queries"](c, trace_dir)
            extra = _of(col.get("query"), c)
            spec["queries"] = [dict(q, **extra) for q in spec["queries"]]
            if col.get("more"):
                spec["queries"] += col["more"](c, spec)
            r = run_limited(spec, limit)
            if r is None:
                rec.update(status="timeout")
                row[label] = "> %g s" % limit
                log("  %-16s %-18s timeout (> %g s)" % (c["name"], label, limit))
            else:
                m = r["messages"]["up"] + r["messages"]["down"]
                rec.update(status="ok", samples=r["samples"], up=r["messages"]["up"], down=r["messages"]["down"],
                           messages=m, violations=r["violations"], runtime_s=round(r["runtime_s"], 3),
                           samples_per_s=int(r["samples_per_s"] or 0), fidelity=r["fidelity"] if col.get("fidelity") else "",
                           final_p99=r["final_p99"], **{k: r[k] for k in FINALS})
                row["samples"] = r["samples"]
                row[label] = m
                row[label + " samples/s"] = rec["samples_per_s"]
                if col.get("fidelity"):
                    row[label + " fidelity"] = r["fidelity"]
                log("  %-16s %-18s %7d messages (%d up, %d down), %d violations, %6.2f s, %7d samples/s, "
                    "%s finals (%s degraded, through %s)%s" % (
                        c["name"], label, m, rec["up"], rec["down"], rec["violations"], rec["runtime_s"],
                        rec["samples_per_s"], rec["finals"], rec["final_degraded"], rec["final_through"],
                        ", fidelity %s" % r["fidelity"] if col.get("fidelity") else ""))
            runs.append(rec)
        row.update(minima(suite.workload(c, trace_dir, "deadband", duration=duration)))
        bases = dict({m[0]: "deadband" for m in MINIMA}, **{col["label"]: col.get("base", "deadband") for col in columns})
        for label, base in bases.items():
            if isinstance(row.get(label), int) and isinstance(row.get(base), int) and row[base]:
                row[label + "/db"] = round(row[label] / row[base], 4)
        rows.append(row)
    return rows, runs


def geomeans(rows):
    """Geometric mean of each ratio column over the traces of each split that have it: [(split, {col: (g, n)})]."""
    out = []
    keys = [k for k in rows[0] if k.endswith("/db")] if rows else []
    for split in suite.SPLITS:
        got = {}
        for k in keys:
            xs = [r[k] for r in rows if r["split"] == split and r.get(k)]
            if xs:
                got[k] = (math.exp(sum(math.log(x) for x in xs) / len(xs)), len(xs))
        if got:
            out.append((split, got))
    return out


def _table(rows, labels, protocols):
    head = ["trace", "samples", "span", "interval", "sources"] + labels + ["samples/s (%s)" % ", ".join(protocols)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["trace"], str(r.get("samples", "")), r["span"], r["interval"], str(r["sources"])]
        for lab in labels:
            v = r.get(lab, "")
            cell = "%s (%.3f)" % (v, r[lab + "/db"]) if lab + "/db" in r else str(v)
            if r.get(lab + " fidelity") is not None:
                cell += ", fidelity %.3f" % r[lab + " fidelity"]
            cells.append(cell)
        cells.append(" / ".join(str(r.get(p + " samples/s", "timeout")) for p in protocols))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _means(rows, labels, title):
    """A table of ``geomeans`` of ``labels`` per split."""
    out = ["### " + title, "", "| split | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 1)]
    for split, got in geomeans(rows):
        out.append("| %s | %s |" % (split, " | ".join(
            "%.3f (%d traces)" % got[lab + "/db"] if lab + "/db" in got else "–" for lab in labels)))
    return out + [""]


def split_tables(rows, labels, protocols):
    """A titled table per split of ``suite.SPLITS`` that has rows, in that order."""
    lines = []
    for split in suite.SPLITS:
        part = [r for r in rows if r["split"] == split]
        if part:
            lines += ["### " + TITLES[split], ""] + _table(part, labels, protocols) + [""]
    return lines


def _bars(plt, path, rows, labels, key, ylabel, title, line, log=False):
    """Grouped bars per trace: one bar per label of ``row[label + key]`` (missing: no bar), a reference line."""
    labels = [lab for lab in labels if any(isinstance(r.get(lab + key), (int, float)) for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.5))
    width = 0.8 / max(1, len(labels))
    for j, lab in enumerate(labels):
        got = [(i, r[lab + key]) for i, r in enumerate(rows) if isinstance(r.get(lab + key), (int, float))]
        ax.bar([i + j * width for i, _ in got], [y for _, y in got], width, label=lab)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels(["%s%s" % (r["trace"], "" if r["split"] == "dev" else "\n(%s)" % r["split"]) for r in rows],
                       rotation=30, ha="right")
    if log:
        ax.set_yscale("log")
    ax.axhline(line, color="grey", linestyle="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plots(out_dir, rows, labels, pairs, cat, trace_dir, duration):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _bars(plt, os.path.join(out_dir, "traces_ratio.png"), rows, labels, "/db", "messages / deadband",
          "Real traces: messages relative to deadband (missing bar = timeout)", 1.0)
    _bars(plt, os.path.join(out_dir, "traces_mixed.png"), rows, pairs, "/db", "messages / deadband-mixed",
          "AVG + MAX over the same sources, relative to both real time under deadband", 1.0)
    _bars(plt, os.path.join(out_dir, "traces_speed.png"), rows, labels + pairs, " samples/s", "simulated samples / s",
          "Simulator throughput per trace and protocol (dashed: 200k samples/s)", 200000, log=True)
    cols = 3
    nrow = int(math.ceil(len(rows) / cols))
    fig, axes = plt.subplots(nrow, cols, figsize=(4.5 * cols, 2.6 * nrow), squeeze=False)
    for ax, r, c in zip(axes.ravel(), rows, cat):
        w = load(suite.workload(c, trace_dir, "deadband", duration=duration))
        t, s, v = samples(w)
        unit, size = next((u, k) for u, k in (("years", suite.YEAR), ("days", suite.DAY), ("hours", 3600.0),
                                              ("s", 1.0)) if t[-1] >= 2 * k or u == "s")
        for i in range(min(4, len(w.source_ids))):
            m = s == i
            ax.plot(t[m] / size, v[m], linewidth=0.6, label=w.source_ids[i])
        ax.set_xlabel(unit, fontsize=7)
        ax.set_title("%s (%s, every %s)" % (r["trace"], r["split"], r["interval"]), fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(rows):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "traces_data.png"), dpi=80)
    plt.close(fig)
    return ["traces_ratio.png", "traces_speed.png", "traces_data.png", "traces_mixed.png"]


def _write_csv(path, rows):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def section(out_dir, quick=False, smoke=False, log=print, trace_dir=None, limit=None):
    """Run the suite; write CSVs and plots into ``out_dir``. Returns (Markdown lines, violations)."""
    trace_dir = trace_dir or (os.path.join(out_dir, "traces") if smoke else os.path.join("results", "traces"))
    names = ["seismic-rjob"] if smoke else None
    limit = limit or (60.0 if smoke or quick else 300.0)
    t0 = time.time()
    cat = suite.convert(trace_dir, names, log=log)
    rows, runs = measure(cat, trace_dir, limit, duration=5.0 if smoke else None, log=log)
    _write_csv(os.path.join(out_dir, "traces.csv"), rows)
    _write_csv(os.path.join(out_dir, "traces_runs.csv"), runs)
    cols = [c for c in COLUMNS if c["protocol"] in PROTOCOLS]
    protocols = [c["label"] for c in cols if "queries" not in c]
    labels = protocols + [m[0] for m in MINIMA]
    pairs = [c["label"] for c in cols if "queries" in c]
    plots = _plots(out_dir, rows, labels, pairs, cat, trace_dir, 5.0 if smoke else None)
    viol = sum(r.get("violations", 0) for r in runs)
    lines = ["## Real traces (issue #18)", "",
             "Public recordings shipped inside pinned packages, converted by `scripts/traces.py` (catalogue with "
             "licences below). Every trace runs its default query: one AVG over all sources, precision %g × the "
             "median per-source 5–95 %% spread. Cells are messages (up + down) and, in brackets, the ratio to "
             "deadband on the same trace. `deadband-2q` / `adaptive-2q`: the same AVG plus a MAX over the "
             "trace's first four sources at its precision (the shape users give), ratios to deadband-2q. Every "
             "protocol runs with its default parameters. `clairvoyant_pc` / "
             "`clairvoyant_pl`: fewest reports any sender could make with constant / linear pieces at the deadband "
             "width per source (offline, exact). samples/s: simulator throughput of each run (wall clock, the "
             "whole run including the ground-truth check); the simulator works per event (a reading that must be "
             "reported, a message, a due timer), so it is lowest on traces where most readings are reported. A run "
             "over its wall-clock limit (%g s) would show `> limit`. Every run also gives final answers "
             "(DESIGN.md §4; `segment MAX L=10`: the same query as a MAX); violations count wrong or withdrawn "
             "final answers too, and each run's finals are in `traces_runs.csv`. Violations in these runs: **%d**. "
             "Section took %.0f s on %d cores at a load average of %.1f (other work shares the cores; "
             "samples/s scale with it)." % (suite.PRECISION_FRACTION, limit, viol, time.time() - t0,
                                           os.cpu_count() or 1, os.getloadavg()[0]), "",
             "`brownian`: Zhu & Ravishankar's probes at confidence 0.95, with the fidelity measured (the share of "
             "time its answer held the exact AVG; its violations are not counted above).", ""]
    lines += split_tables(rows, labels, protocols)
    lines += _means(rows, labels, "Geometric mean of the ratio to deadband")
    lines += ["## Lagged and real-time queries on the same sources", "",
              "Each trace's AVG and a MAX over the ⌈n/3⌉ most variable of its n sources (largest mean change between "
              "readings; same precision): `deadband-mixed` both real time under deadband, the baseline of the others; "
              "`mixed` the AVG lagged by 10 sampling intervals (final answers by then, from segments) and the MAX in "
              "real time (alarms); `all-lagged` both lagged; `max-alone` the real-time MAX alone under deadband and "
              "`max-adaptive` under the default protocol (what the alarm costs by itself: `mixed` pays it and "
              "segments for the rest; below `max-alone` where the MAX's sources sit apart, so that cuts pay, or a "
              "filter model does). Brackets: the ratio to `deadband-mixed` on the same trace; "
              "`mixed` never sends more messages than `deadband-mixed` on %d of %d traces." % (
                  sum(1 for r in rows if r.get("mixed/db", 2) <= 1.0), sum(1 for r in rows if "mixed/db" in r)), ""]
    lines += split_tables(rows, pairs, pairs)
    lines += _means(rows, pairs, "Geometric mean of the ratio to deadband-mixed")
    lines += ["![mixed](%s)" % plots[3], ""]
    lines += ["Every run's figures (samples/s, runtime, up/down, status) are in `traces_runs.csv`.", ""]
    lines += ["![ratios](%s)" % plots[0], "", "![speed](%s)" % plots[1], "", "![traces](%s)" % plots[2], "",
              "### Catalogue", "",
              suite.catalogue_md(cat)]
    return lines, viol


def main(argv=None):
    """``scripts/traces.py``: convert the suite into CSV traces, and with ``--bench DIR`` run this section there."""
    import argparse
    ap = argparse.ArgumentParser(description="Convert the real-trace suite into simulator CSV traces.")
    ap.add_argument("--out", default=os.path.join("results", "traces"))
    ap.add_argument("names", nargs="*", help="traces to convert (default: all)")
    ap.add_argument("--bench", metavar="DIR", help="also run the bench's real-trace section into DIR/TRACES.md")
    ap.add_argument("--quick", action="store_true", help="with --bench: the quick wall-clock limit")
    args = ap.parse_args(argv)
    cat = suite.convert(args.out, args.names or None, log=print)
    print(suite.catalogue_md(cat))
    if args.bench:
        os.makedirs(args.bench, exist_ok=True)
        lines, viol = section(args.bench, quick=args.quick, trace_dir=args.out)
        with open(os.path.join(args.bench, "TRACES.md"), "w") as fh:
            fh.write("# QuietFleet real-trace benchmark\n\nCommand: `python scripts/traces.py --bench %s%s`\n\n%s"
                     % (args.bench, " --quick" if args.quick else "", "\n".join(lines)))
        print("wrote %s" % os.path.join(args.bench, "TRACES.md"))
        return 0 if viol == 0 else 1
    return 0
