"""``quietfleet bench``: the product measured as a user would judge it (DESIGN.md §8), as a report.

Every figure is a ratio or sits beside its baseline from the same run, with workload and seed.
Sections: messages and bytes per protocol on shared workloads; the clairvoyant limit for one
source; guarantee violations; simulator throughput as the fleet grows; the real-trace suite
(``backend.bench.traces``); and, where their modules are
present, edge cost and Spark backend figures. Writes ``REPORT.md``, CSV tables and PNG plots.
"""
import csv
import importlib
import json
import os
import platform
import sys
import tempfile
import time

from backend.coordinator.protocols import PROTOCOLS
from backend.sim import engine
from backend.bench import synthetic
from backend.sim.clairvoyant import minimum_reports
from backend.sim.sources import samples
from backend.sim.workload import load


def workloads(scale, data_dir=None):
    """The shared workloads: (name, spec). ``scale`` shrinks durations for quick and smoke runs; traces
    that no generator makes are written (seeded) to ``data_dir`` (default: the temp folder)."""
    d = lambda x: max(60, int(x * scale))
    ids = ["s%d" % i for i in range(40)]
    data_dir = data_dir or os.path.join(tempfile.gettempdir(), "quietfleet-bench")
    os.makedirs(data_dir, exist_ok=True)
    days = max(3, int(137 * scale))
    years = max(2, int(18 * scale))
    weeks = max(2, int(11 * scale))
    hid = ids[:24]
    return [
        ("single-avg-10", {"seed": 11, "duration": d(3000),
                           "sources": {"generator": "random_walk", "count": 10, "start": [90, 110], "step": [0.1, 2.0]},
                           "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 8.0}]}),
        ("overlapping-5q", {"seed": 12, "duration": d(3000),
                            "sources": {"generator": "random_walk", "count": 40, "per_device": 4, "start": [90, 110],
                                        "step": [0.05, 3.0]},
                            "queries": [{"id": "q%d" % j, "kind": "avg", "sources": ids[j * 6: j * 6 + 16],
                                         "precision": p} for j, p in enumerate([4.0, 0.5, 6.0, 1.0, 3.0])]}),
        ("mixed-aggregates", {"seed": 13, "duration": d(2000),
                              "sources": {"generator": "random_walk", "count": 40, "per_device": 2,
                                          "start": [90, 110], "step": [0.1, 2.0]},
                              "queries": [
                                  {"id": "total", "kind": "sum", "sources": "all", "precision": 80.0},
                                  {"id": "diff", "kind": "sum", "sources": ["s1", "s2"], "weights": [1, -1],
                                   "precision": 3.0},
                                  {"id": "coldest", "kind": "min", "sources": ids[20:], "precision": 5.0},
                                  {"id": "in_band", "kind": "count", "sources": "all", "range": [95, 105]}]}),
        ("real-temps-24", {"seed": 0, "duration": d(744), "sources": {"dataset": "temps"},
                           "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 2.0},
                                       {"id": "sea_max", "kind": "max", "precision": 3.0,
                                        "sources": ["sea-%02d" % m for m in range(1, 13)]},
                                       {"id": "sf_avg", "kind": "avg", "precision": 1.0,
                                        "sources": ["sf-%02d" % m for m in range(1, 13)]}]}),
        ("hetero-24", {"seed": 21, "duration": d(6000),
                       "sources": {"generator": "random_walk", "count": 24, "per_device": 2, "start": [90, 110],
                                   "step": [0.25, 8.0], "steps": "normal"},
                       "queries": _hetero_queries(hid)}),
        ("changing-rates", {"seed": 0, "duration": d(6000) - 1, "queries": _hetero_queries(hid),
                            "sources": {"trace": synthetic.changing_rates(data_dir, 24, d(6000), seed=22)}}),
        # irregular readings on an integer lattice with overnight gaps (car-park counts): SUM over all, MAX over 4
        ("occupancy-30", {"seed": 0, "duration": weeks * 7 * 86400.0,
                          "sources": {"trace": synthetic.occupancy(data_dir, 30, weeks * 7, seed=25)},
                          "queries": [{"id": "total", "kind": "sum", "sources": "all", "precision": 825.0},
                                      {"id": "busiest", "kind": "max", "precision": 27.5,
                                       "sources": ["p%02d" % i for i in range(4)]}]}),
        ("slow-temps-%dd" % days, {"seed": 0, "duration": days * 86400.0,
                                   "sources": {"trace": synthetic.slow_temperatures(data_dir, 10, days, seed=23)},
                                   "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 1.0},
                                               {"id": "warmest", "kind": "max", "precision": 1.0,
                                                "sources": ["t%d" % i for i in range(5)]}]}),
        ("daily-%dy" % years, {"seed": 0, "duration": years * 365 * 86400.0,
                               "sources": {"trace": synthetic.daily_walks(data_dir, 12, years, seed=24)},
                               "queries": [{"id": "sum", "kind": "sum", "sources": "all", "precision": 30.0},
                                           {"id": "half", "kind": "avg", "precision": 2.0,
                                            "sources": ["p%d" % i for i in range(6)]}]}),
        # query-aware slack: extremes over walks at different levels; a mix where a COUNT needs no width,
        # a weighted difference is allocated by weight and half the fleet is in no query
        ("extremes-20", {"seed": 32, "duration": d(2000),
                         "sources": {"generator": "random_walk", "count": 20, "start": [0, 200], "step": [0.5, 2.0]},
                         "queries": [{"id": "top", "kind": "max", "sources": "all", "precision": 4.0},
                                     {"id": "low", "kind": "min", "sources": "all", "precision": 4.0}]}),
        ("query-mix-20", {"seed": 35, "duration": d(2000),
                          "sources": {"generator": "random_walk", "count": 20, "start": [80, 120], "step": [0.1, 1.0],
                                      "steps": "normal"},
                          "queries": [{"id": "band", "kind": "count", "sources": ids[:10], "range": [95, 105]},
                                      {"id": "diff", "kind": "sum", "sources": ids[:4], "weights": [4, -1, 2, -0.5],
                                       "precision": 8.0},
                                      {"id": "top", "kind": "max", "sources": ids[:10], "precision": 3.0}]}),
    ]


def _hetero_queries(ids):
    """Three overlapping SUM/AVG queries and one MAX over 24 sources (the heterogeneous workloads)."""
    return [{"id": "a", "kind": "avg", "sources": ids[2:14], "precision": 30.0},
            {"id": "b", "kind": "sum", "sources": ids[8:20], "precision": 250.0},
            {"id": "c", "kind": "avg", "sources": ids[14:], "precision": 20.0},
            {"id": "m", "kind": "max", "sources": ids[:8], "precision": 40.0}]


def _variants():
    """(label, protocol, extra params): every registered protocol plus deadband with a heartbeat."""
    out = [(name, name, {}) for name in sorted(PROTOCOLS)
           if getattr(PROTOCOLS[name], "topology", "star") == "star"]   # relays: `experiment relay`
    out.append(("deadband+heartbeat60", "deadband", {"heartbeat": 60}))
    return out


# The heterogeneous and long-span workloads run the precision protocols only: the Brownian and SWAT
# protocols tick every period, and a heartbeat sends a message per minute over years.
PRECISION = ("naive", "deadband", "optimal_static", "adaptive")
FIRST_PRECISION_ONLY = "hetero-24"


def protocol_table(scale, log):
    rows = []
    only = False
    for wname, spec in workloads(scale):
        kinds = {q["kind"] for q in spec["queries"]}
        runs = {}
        only = only or wname == FIRST_PRECISION_ONLY
        for label, proto, extra in _variants():
            if not kinds <= set(PROTOCOLS[proto].kinds) or (only and label not in PRECISION):
                continue
            w = dict(spec, protocol=proto, params=dict(spec.get("params", {}), **extra))
            log("  %s / %s" % (wname, label))
            runs[label] = engine.run(w)
        total = lambda r: r["messages"]["up"] + r["messages"]["down"]
        base, dead = total(runs["naive"]), total(runs["deadband"])
        opt = total(runs["optimal_static"]) if "optimal_static" in runs else None
        for label, r in runs.items():
            m = total(r)
            rows.append({"workload": wname, "seed": r["seed"], "protocol": label, "samples": r["samples"],
                         "up": r["messages"]["up"], "down": r["messages"]["down"],
                         "bytes": r["bytes"]["up"] + r["bytes"]["down"],
                         "vs_naive": round(m / base, 4), "vs_deadband": round(m / dead, 4),
                         "vs_optimal_static": round(m / opt, 4) if opt else "",
                         "violations": r["violations"], "samples_per_s": int(r["samples_per_s"] or 0)})
    return rows


def clairvoyant_table(scale, log):
    """Single source, fixed width W (an AVG over one source with precision W): reports / minimum."""
    rows = []
    for seed in (1, 2, 3):
        for width in (2.0, 8.0):
            spec = {"seed": seed, "duration": max(200, int(5000 * scale)),
                    "sources": {"generator": "random_walk", "count": 1, "step": 1.0, "steps": "normal"},
                    "queries": [{"id": "v", "kind": "avg", "sources": ["s0"], "precision": width}]}
            w = load(dict(spec, protocol="deadband"))
            _, _, vals = samples(w)
            best = minimum_reports(vals.tolist(), width)
            for proto in ("deadband",) + (("adaptive",) if "adaptive" in PROTOCOLS else ()):
                r = engine.run(dict(spec, protocol=proto))
                log("  clairvoyant seed %d W=%g %s" % (seed, width, proto))
                rows.append({"workload": "walk-1 N(0,1)", "seed": seed, "width": width, "protocol": proto,
                             "reports": r["reports"], "clairvoyant_min": best,
                             "ratio": round(r["reports"] / best, 3), "violations": r["violations"]})
    return rows


def throughput_table(sizes, log):
    rows = []
    for n in sizes:
        duration = max(20, int(400000 / n))
        spec = {"seed": 5, "duration": duration, "protocol": "deadband",
                "sources": {"generator": "random_walk", "count": n, "per_device": 4, "step": [0.1, 1.0]},
                "queries": [{"id": "avg", "kind": "avg", "sources": "all", "precision": 6.0}]}
        for vec in (True, False) if n <= 1000 else (True,):
            sim = engine.Simulation(spec, vectorised=vec)
            r = sim.run()
            log("  throughput %d sources %s: %.0f samples/s" % (n, "vectorised" if vec else "scalar", r["samples_per_s"]))
            rows.append({"sources": n, "path": "vectorised" if vec else "scalar", "samples": r["samples"],
                         "seconds": round(r["runtime_s"], 3), "samples_per_s": int(r["samples_per_s"]),
                         "reports_per_sample": round(r["reports"] / r["samples"], 4),
                         "violations": r["violations"]})
    return rows


def state_table(sizes, log):
    """Backend state per 1000 sources: the pickled host the Spark job keeps per query group."""
    import pickle
    from backend.host import Host
    from edge.agent import Agent
    rows = []
    for n in sizes:
        for proto in ("deadband", "adaptive"):
            ids = ["s%d" % i for i in range(n)]
            host = Host(protocol=proto, period=10.0, shrink=0.05, t0=0.0)
            for d in range(0, n, 4):
                a = Agent("d%d" % d, ids[d:d + 4], boot=1)
                for _, p in a.start(0.0):
                    host.uplink(0.0, a.device, p)
                for j in range(len(a.names)):
                    for _, p in a.handle_sample(0.0, j, 100.0 + j):
                        host.uplink(0.0, a.device, p)
            host.spec(0.0, "avg", {"kind": "avg", "sources": "all", "precision": 5.0})
            size = len(pickle.dumps(host, protocol=pickle.HIGHEST_PROTOCOL))
            log("  state %d sources %s: %d bytes" % (n, proto, size))
            rows.append({"sources": n, "protocol": proto, "state_bytes": size,
                         "bytes_per_1000_sources": int(size * 1000 / n)})
    return rows


def _optional(module, fn, log, **kw):
    """Figures from another part of the product, if it is installed here; else a note why not."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        return None, "%s is not present in this build" % module
    try:
        return getattr(mod, fn)(**kw), None
    except Exception as e:          # a failing optional section is reported, not fatal
        log("  %s.%s failed: %s" % (module, fn, e))
        return None, "%s.%s failed: %s" % (module, fn, e)


def _write_csv(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _md(rows):
    if not rows:
        return "(no rows)\n"
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _plots(out, proto_rows, thr_rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    wls = sorted({r["workload"] for r in proto_rows})
    fig, axes = plt.subplots(1, len(wls), figsize=(5 * len(wls), 4), squeeze=False)
    for ax, wl in zip(axes[0], wls):
        rs = [r for r in proto_rows if r["workload"] == wl]
        ax.bar([r["protocol"] for r in rs], [r["up"] + r["down"] for r in rs], color="tab:blue")
        ax.set_yscale("log")
        ax.set_title(wl)
        ax.set_ylabel("messages (up + down)")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "messages.png"), dpi=90)
    files.append("messages.png")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 4))
    for path in ("vectorised", "scalar"):
        rs = [r for r in thr_rows if r["path"] == path]
        if rs:
            ax.plot([r["sources"] for r in rs], [r["samples_per_s"] for r in rs], marker="o", label=path)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sources in the fleet")
    ax.set_ylabel("simulated samples / s")
    ax.axhline(1e6, color="grey", linestyle="--", label="target 1M/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=90)
    files.append("throughput.png")
    plt.close(fig)
    return files


def main(out_dir, quick=False, smoke=False, log=None):
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    scale = 0.05 if smoke else (0.3 if quick else 1.0)
    sizes = (10, 100) if smoke else ((10, 100, 1000) if quick else (10, 100, 1000, 10000))
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    log("[bench] protocols on shared workloads")
    proto = protocol_table(scale, log)
    log("[bench] clairvoyant limit")
    clair = clairvoyant_table(scale, log)
    log("[bench] simulator throughput")
    thr = throughput_table(sizes, log)
    log("[bench] backend state size")
    state = state_table(sizes, log)
    log("[bench] lagged and real-time queries on the shared workloads")
    from backend.bench.mixed import shared_table
    lagged = shared_table(workloads(scale), log)
    log("[bench] real traces")
    from backend.bench.traces import section as traces_section
    trace_lines, trace_viol = traces_section(out_dir, quick=quick, smoke=smoke, log=log)
    edge, edge_note = (None, "skipped in smoke runs") if smoke else _optional("backend.bench.edge", "figures", log, quick=quick)
    spark, spark_note = (None, "skipped in smoke runs") if smoke else _optional("backend.spark.bench_job", "figures", log, quick=quick)
    for name, rows in (("protocols", proto), ("clairvoyant", clair), ("throughput", thr), ("state", state),
                       ("lagged", lagged)):
        _write_csv(os.path.join(out_dir, name + ".csv"), rows)
    plots = _plots(out_dir, proto, thr)
    viol = sum(r["violations"] for r in proto + clair + thr) + trace_viol + sum(
        r[k] for r in lagged for k in r if k.startswith("violations"))
    lines = ["# QuietFleet benchmark report", "",
             "Command: `quietfleet bench%s` — %s, Python %s, %d cores, %s; took %.0f s." % (
                 " --smoke" if smoke else (" --quick" if quick else ""), platform.machine(),
                 platform.python_version(), os.cpu_count() or 0, time.strftime("%Y-%m-%d"), time.time() - t0), "",
             "Guarantee violations across every run below: **%d**." % viol, "",
             "## Messages per protocol", "",
             "Same workload and seed for every protocol; `vs_naive` and `vs_deadband` are ratios of "
             "(uplink + downlink) messages measured in the same run.", "", _md(proto),
             "![messages](messages.png)", "",
             "## The clairvoyant limit (one source, fixed width)", "",
             "`clairvoyant_min` is the offline minimum (greedy segmentation of the trace); the DESIGN target "
             "is ratio ≤ 1.5. For a driftless random walk the centred online filter's expected ratio is about 2 "
             "(exit time of a centred interval a²/4 versus range time a²/2), so no centred filter reaches 1.5 there.",
             "", _md(clair),
             "## Simulator throughput as the fleet grows", "",
             "Deadband, one AVG over all sources, ~400k samples per run; the scalar path runs every reading "
             "through the agent objects, the vectorised (default) path gives an agent only the readings that "
             "leave its filter's bound and skips the silent ones across instants (`backend/sim/screen.py`); the "
             "two are checked equal (messages, answers, agent state) in the tests.", "", _md(thr), "![throughput](throughput.png)", "",
             "## Backend state as the fleet grows", "",
             "Pickled coordinator (bound cache, queries, protocol state) that the Spark job keeps per query "
             "group, after every source's birth and first report; one AVG over all sources.", "", _md(state),
             "## Lagged and real-time queries on the same sources", "",
             "Each shared workload with SUM/AVG queries beside others: the SUM/AVG lagged by 10 sampling intervals "
             "(final answers from segments) while the rest stay real time, against every query real time under "
             "deadband; the ratio must never exceed 1.", "", _md(lagged)]
    lines += trace_lines
    for title, data, note in (("Edge cost", edge, edge_note), ("Spark backend", spark, spark_note)):
        lines += ["## " + title, ""]
        if data:
            lines += [_md(data) if isinstance(data, list) else "```\n%s\n```\n" % json.dumps(data, indent=2)]
        else:
            lines += ["Not measured: %s." % note, ""]
    with open(os.path.join(out_dir, "REPORT.md"), "w") as fh:
        fh.write("\n".join(lines))
    log("[bench] wrote %s (%d plots)" % (os.path.join(out_dir, "REPORT.md"), len(plots)))
    return 0 if viol == 0 else 1
