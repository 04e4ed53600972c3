"""Cheng et al. 2005 §6 synthetic experiments: FT-NRP / ZT-NRP (Figs 12-14), FT-RP / ZT-RP (Fig 15), RTP (Fig 9).

Streams start uniform in [0, 1000], readings arrive with exponential gaps of mean 20 and move by
N(0, σ) steps (σ = 20 unless swept). Every run goes through the simulator (real agents, codec,
coordinator, ground-truth checker with zero network delay). ``messages`` counts every uplink and
downlink message except device births and the configuration message each device gets at birth:
reports, filter installs, probes and probe replies, initialisation included. Each row states the
scale it ran at (streams, simulated duration). Writes CSV + Markdown tables and PNG plots to
``out_dir``.
"""
import csv
import os
import time

from backend.sim import engine

FULL = {"streams": 5000, "range_duration": 1000.0, "knn_streams": 1000, "knn_duration": 200.0}
QUICK = {"streams": 1000, "range_duration": 400.0, "knn_streams": 500, "knn_duration": 200.0}


def workload(protocol, query, streams, duration, sigma=20.0, seed=7, params=None):
    return {"name": "cheng-%s" % protocol, "seed": seed, "duration": duration, "protocol": protocol,
            "sources": {"generator": "random_walk", "count": streams, "start": [0, 1000], "step": sigma,
                        "steps": "normal", "arrival": "exponential", "interval": 20},
            "queries": [dict(query, id="q", sources="all")], "params": params or {}}


def run_row(table, protocol, query, streams, duration, sigma=20.0, params=None, **labels):
    t = time.perf_counter()
    r = engine.run(workload(protocol, query, streams, duration, sigma, params=params))
    kinds = r["by_kind"]
    setup = kinds.get("birth", 0) + kinds.get("config", 0) + kinds.get("setup", 0)
    msgs = r["messages"]["up"] + r["messages"]["down"] - setup
    q = r["queries"]["q"]
    row = dict(labels, protocol=protocol, streams=streams, duration=duration, sigma=sigma, messages=msgs,
               reports=kinds.get("report", 0), filters=kinds.get("filter", 0), probes=kinds.get("probe", 0),
               samples=r["samples"], violations=r["violations"], max_fp=round(q["max_fp"], 4),
               max_fn=round(q["max_fn"], 4), mean_size=round(q["mean_size"], 1),
               max_rank_misses=q["max_rank_misses"], runtime_s=round(time.perf_counter() - t, 1))
    print("  %-8s %-40s messages=%-8d violations=%d max F+=%.3f F-=%.3f (%.1fs)"
          % (table, " ".join("%s=%s" % kv for kv in labels.items()) + " " + protocol, msgs, r["violations"],
             q["max_fp"], q["max_fn"], row["runtime_s"]), flush=True)
    return row


def experiments(scale):
    rows = {"fig12_14_range": [], "fig13_sigma": [], "fig15_knn": [], "fig9_rtp": []}
    n, dur = scale["streams"], scale["range_duration"]
    rng = {"kind": "range", "range": [400, 600]}
    rows["fig12_14_range"].append(run_row("range", "nofilter", rng, n, dur, tolerance=0.0, choice="-"))
    rows["fig12_14_range"].append(run_row("range", "zt-nrp", rng, n, dur, tolerance=0.0, choice="-"))
    for eps in (0.1, 0.2, 0.3, 0.4):
        for choice in ("boundary", "random"):
            q = dict(rng, fp_tolerance=eps, fn_tolerance=eps)
            rows["fig12_14_range"].append(run_row("range", "ft-nrp", q, n, dur, params={"choice": choice},
                                                  tolerance=eps, choice=choice))
    for sigma in (10.0, 20.0, 40.0):
        rows["fig13_sigma"].append(run_row("sigma", "zt-nrp", rng, n, dur, sigma, tolerance=0.0))
        q = dict(rng, fp_tolerance=0.2, fn_tolerance=0.2)
        rows["fig13_sigma"].append(run_row("sigma", "ft-nrp", q, n, dur, sigma, tolerance=0.2))
    kn, kdur = scale["knn_streams"], scale["knn_duration"]
    for k in (20, 60, 100):
        q = {"kind": "knn", "k": k, "point": 500}
        rows["fig15_knn"].append(run_row("knn", "nofilter", q, kn, kdur, k=k, tolerance=0.0))
        rows["fig15_knn"].append(run_row("knn", "zt-rp", q, kn, kdur, k=k, tolerance=0.0))
        for eps in (0.1, 0.2, 0.3):
            rows["fig15_knn"].append(run_row("knn", "ft-rp", dict(q, fp_tolerance=eps, fn_tolerance=eps),
                                             kn, kdur, k=k, tolerance=eps))
    for k in (20, 60):
        q = {"kind": "knn", "k": k, "point": 500}
        for r in (0, 5, 10, 20):
            rows["fig9_rtp"].append(run_row("rtp", "rtp", dict(q, rank_tolerance=r), kn, kdur, k=k, r=r))
    return rows


def write_table(out_dir, name, rows):
    cols = list(rows[0])
    with open(os.path.join(out_dir, name + ".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, name + ".md"), "w") as fh:
        fh.write(md)
    return md


def plot(out_dir, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    rr = rows["fig12_14_range"]
    for choice in ("boundary", "random"):
        pts = [(0.0, next(r["messages"] for r in rr if r["protocol"] == "zt-nrp"))]
        pts += [(r["tolerance"], r["messages"]) for r in rr if r["choice"] == choice]
        ax.plot(*zip(*pts), marker="o", label="FT-NRP " + choice)
    ax.axhline(next(r["messages"] for r in rr if r["protocol"] == "nofilter"), ls="--", c="k", label="no filter")
    ax.set(title="Range [400,600] (Figs 12, 14)", xlabel="ε+ = ε−", ylabel="messages", yscale="log")
    ax.legend()
    ax = axes[1]
    rs = rows["fig13_sigma"]
    for p in ("zt-nrp", "ft-nrp"):
        ax.plot([r["sigma"] for r in rs if r["protocol"] == p], [r["messages"] for r in rs if r["protocol"] == p],
                marker="o", label=p.upper() + (" ε=0.2" if p == "ft-nrp" else ""))
    ax.set(title="Data fluctuation (Fig 13)", xlabel="σ", ylabel="messages")
    ax.legend()
    ax = axes[2]
    rk = rows["fig15_knn"]
    for k in sorted({r["k"] for r in rk}):
        pts = [(r["tolerance"], r["messages"]) for r in rk if r["k"] == k and r["protocol"] != "nofilter"]
        ax.plot(*zip(*pts), marker="o", label="k=%d (ZT-RP at 0)" % k)
    ax.set(title="k-NN, q=500 (Fig 15)", xlabel="ε+ = ε−", ylabel="messages", yscale="log")
    ax.legend()
    ax = axes[3]
    rt = rows["fig9_rtp"]
    for k in sorted({r["k"] for r in rt}):
        ax.plot([r["r"] for r in rt if r["k"] == k], [r["messages"] for r in rt if r["k"] == k], marker="o",
                label="RTP k=%d" % k)
        ax.axhline(next(r["messages"] for r in rk if r["k"] == k and r["protocol"] == "nofilter"), ls="--",
                   label="no filter k=%d" % k, c="C%d" % (sorted({r["k"] for r in rt}).index(k)))
    ax.set(title="Rank tolerance (Fig 9)", xlabel="r", ylabel="messages", yscale="log")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(out_dir, "cheng.png")
    fig.savefig(path, dpi=110)
    return path


def main(out_dir, quick=False):
    scale = QUICK if quick else FULL
    os.makedirs(out_dir, exist_ok=True)
    t = time.perf_counter()
    print("Cheng 2005 experiments (%s scale: range %d streams x %g, k-NN %d streams x %g simulated time)"
          % ("quick" if quick else "full", scale["streams"], scale["range_duration"], scale["knn_streams"],
             scale["knn_duration"]), flush=True)
    rows = experiments(scale)
    for name, rs in rows.items():
        print("\n## %s\n\n%s" % (name, write_table(out_dir, name, rs)))
    print("plot:", plot(out_dir, rows))
    bad = sum(r["violations"] for rs in rows.values() for r in rs)
    print("total violations: %d; wall time %.0f s" % (bad, time.perf_counter() - t))
    return 1 if bad else 0
