"""Reproduce Bulut & Singh 2003 §2.7 and §5: SWAT vs Histogram accuracy and response time, error
by approximation level, and SWAT-ASR vs Divergence Caching and Adaptive Precision messages.

``quietfleet experiment swat [--out DIR] [--quick]`` writes CSV and Markdown tables and PNG plots.
"""
import csv
import os
import random
import time

from backend.experiments.histogram import approximate
from backend.coordinator.swat.asr import weights_for
from backend.sim.engine import run
from backend.sim.summary import stream
from edge.core.swat import Swat


def _write(out_dir, name, header, rows):
    with open(os.path.join(out_dir, name + ".csv"), "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(header)
        wr.writerows(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(("%.4g" % x) if isinstance(x, float) else str(x) for x in r) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, name + ".md"), "w") as fh:
        fh.write(text)
    print("\n## %s\n%s" % (name, text))


def _queries(mode, window, count, rng):
    fixed_m = window // 4
    for _ in range(count):
        if mode == "fixed":
            yield 0, fixed_m
        else:
            a = rng.randrange(window)
            yield a, rng.randrange(1, window - a + 1)


def accuracy(out_dir, quick):
    """Fig. 5 / Fig. 6b: relative error of inner product queries and response time."""
    window = 256 if quick else 1024
    nq = 30 if quick else 60
    epss = (0.1, 0.01) if quick else (0.1, 0.01, 0.001)
    buckets = 3 * (window.bit_length() - 1)
    rows, timing = [], []
    for gen in ("weather", "uniform"):
        data = stream(gen, 2 * window + 4 * nq, 3)
        for mode in ("fixed", "random"):
            for wk in ("exponential", "linear"):
                rng = random.Random(11)
                sw = Swat(window)
                for v in data[:2 * window]:
                    sw.update(v)
                errs = {"swat": 0.0}
                bound = 0.0
                viol = 0
                t_swat = t_hist = 0.0
                for e in epss:
                    errs[e] = 0.0
                pos = 2 * window
                for a, m in _queries(mode, window, nq, rng):
                    for _ in range(4):                   # data arrive between queries
                        sw.update(data[pos])
                        pos += 1
                    win = data[pos - window:pos][::-1]   # newest first
                    ws = weights_for(wk, m)
                    idx = list(range(a, a + m))
                    exact = sum(w * win[i] for w, i in zip(ws, idx))
                    t0 = time.perf_counter()
                    est, lo_, hi_ = sw.window_values()
                    approx = sum(w * est[i] for w, i in zip(ws, idx))
                    lo = sum(w * lo_[i] for w, i in zip(ws, idx))
                    hi = sum(w * hi_[i] for w, i in zip(ws, idx))
                    t_swat += time.perf_counter() - t0
                    viol += not lo - 1e-9 <= exact <= hi + 1e-9
                    bound += (hi - lo) / 2 / abs(exact)
                    errs["swat"] += abs(approx - exact) / abs(exact)
                    for e in epss:
                        t0 = time.perf_counter()
                        h = approximate(win, buckets, e)
                        got = sum(w * h[i] for w, i in zip(ws, idx))
                        if e == epss[0]:
                            t_hist += time.perf_counter() - t0
                        errs[e] += abs(got - exact) / abs(exact)
                rows.append([gen, mode, wk, errs["swat"] / nq, bound / nq, viol] + [errs[e] / nq for e in epss]
                            + [(errs[epss[-1]] / max(errs["swat"], 1e-300))])
                timing.append([gen, mode, wk, 1e3 * t_swat / nq, 1e3 * t_hist / nq, t_hist / max(t_swat, 1e-12)])
    _write(out_dir, "swat_accuracy",
           ["data", "mode", "query", "swat_rel_err", "swat_rel_bound", "swat_bound_violations"]
           + ["hist_rel_err_eps%g" % e for e in epss] + ["hist/swat_err"], rows)
    _write(out_dir, "swat_response_time",
           ["data", "mode", "query", "swat_ms", "hist_ms_eps%g" % epss[0], "speedup"], timing)
    return rows, timing


def levels(out_dir, quick):
    """Fig. 4c: average absolute error against the approximation level used (fixed queries)."""
    window = 256 if quick else 512
    data = stream("weather", 6 * window, 5)
    sw = Swat(window)
    rows = []
    res = {}
    for v in data[:2 * window]:
        sw.update(v)
    steps = window if quick else 2 * window
    m = window // 4
    for t in range(2 * window, 2 * window + steps):
        sw.update(data[t])
        win = data[t + 1 - window:t + 1][::-1]
        for lvl in range(sw.n):
            est = sw.window_values(lvl)[0]
            for wk in ("exponential", "linear"):
                ws = weights_for(wk, m)
                err = abs(sum(w * (est[i] - win[i]) for i, w in enumerate(ws)))
                res[(lvl, wk)] = res.get((lvl, wk), 0.0) + err
    for lvl in range(sw.n):
        rows.append([lvl, res[(lvl, "exponential")] / steps, res[(lvl, "linear")] / steps])
    _write(out_dir, "swat_levels", ["min_level", "exp_abs_err", "linear_abs_err"], rows)
    return rows


def _asr(window, gen, clients, td, prec, duration, proto, seed=1):
    return run({"window": window, "protocol": proto, "clients": clients, "duration": duration, "phase": 10,
                "seed": seed, "data": {"generator": gen, "interval": td},
                "queries": [{"id": "q", "kind": "summary", "type": "inner", "weights": "linear",
                             "rate": 1.0, "precision": prec}],
                "params": {"value_range": 100.0} if proto == "dc" else {}})


PROTOS = ("swat-asr", "dc", "aps")


def replication(out_dir, quick):
    """Fig. 9 and 10: messages of SWAT-ASR, Divergence Caching and Adaptive Precision."""
    dur = 400 if quick else 2000
    tables = {}
    rows = []
    for gen, prec in (("weather", 10.0), ("uniform", 40.0)):
        for ratio in (0.25, 0.5, 1, 2, 4):          # Td/Tq with Tq = 1 s
            r = {p: _asr(32, gen, 1, ratio, prec, dur, p) for p in PROTOS}
            rows.append([gen, ratio] + [r[p]["messages"] for p in PROTOS] + [sum(r[p]["violations"] for p in PROTOS)])
    _write(out_dir, "swat_asr_rates", ["data", "Td/Tq", "swat_asr_msgs", "dc_msgs", "aps_msgs", "violations"], rows)
    tables["rates"] = rows
    rows = []
    for prec in (2.5, 5.0, 10.0, 20.0, 40.0):
        r = {p: _asr(32, "weather", 1, 2.0, prec, dur, p) for p in PROTOS}
        rows.append([prec] + [r[p]["messages"] for p in PROTOS] + [r["swat-asr"]["answered_locally"]])
    _write(out_dir, "swat_asr_precision", ["precision", "swat_asr_msgs", "dc_msgs", "aps_msgs", "swat_local_frac"], rows)
    tables["precision"] = rows
    rows = []
    for clients in (1, 2, 3, 5, 7):
        r = {p: _asr(64, "weather", clients, 1.0, 10.0, dur, p) for p in PROTOS}
        rows.append([clients] + [r[p]["messages"] for p in PROTOS] + [r["swat-asr"]["cached_approximations"]])
    _write(out_dir, "swat_asr_clients", ["clients", "swat_asr_msgs", "dc_msgs", "aps_msgs", "swat_cached_segments"], rows)
    tables["clients"] = rows
    rows = []
    for prec in (20.0, 40.0, 60.0, 80.0):
        r = {p: _asr(64, "uniform", 6, 1.0, prec, dur, p) for p in PROTOS}
        rows.append([prec] + [r[p]["messages"] for p in PROTOS])
    _write(out_dir, "swat_asr_multi_precision", ["precision", "swat_asr_msgs", "dc_msgs", "aps_msgs"], rows)
    tables["multi_precision"] = rows
    return tables


def fleet(out_dir, quick):
    """The three protocols through the main simulator (real agents, coordinator, codec, checker)."""
    rows = []
    for prec in (5.0, 20.0, 80.0):
        for proto in ("swat", "swat-dc", "swat-aps"):
            r = run({"name": "swat-fleet", "seed": 3, "duration": 300 if quick else 1500, "protocol": proto,
                     "sources": {"generator": "random_walk", "count": 4, "step": 1.0, "interval": 1.0},
                     "queries": [{"id": "q%d" % j, "kind": "summary", "sources": ["s%d" % j], "type": "inner",
                                  "weights": "linear", "window": "random", "precision": prec} for j in range(4)],
                     "network": {"delay": 0.1}, "params": {"period": 2.0, "window": 32, "phase": 10}})
            checked = sum(q["checked"] for q in r["queries"].values())
            rows.append([prec, proto, r["messages"]["up"], r["messages"]["down"], r["bytes"]["up"], checked,
                         r["violations"], r["precision_misses"]])
    _write(out_dir, "swat_fleet", ["precision", "protocol", "up_msgs", "down_msgs", "up_bytes", "answers",
                                   "violations", "precision_misses"], rows)
    return rows


def _plots(out_dir, acc, lv, rep):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    for k, gen in enumerate(("weather", "uniform")):
        sub = [r for r in rep["rates"] if r[0] == gen]
        for j, p in enumerate(PROTOS):
            ax[0][k].plot([r[1] for r in sub], [r[2 + j] for r in sub], marker="o", label=p)
        ax[0][k].set_xscale("log", base=2)
        ax[0][k].set_title("single client, N=32, %s: messages vs Td/Tq" % gen)
        ax[0][k].legend()
    for j, p in enumerate(PROTOS):
        ax[0][2].plot([r[0] for r in rep["precision"]], [r[1 + j] for r in rep["precision"]], marker="o", label=p)
        ax[1][0].plot([r[0] for r in rep["clients"]], [r[1 + j] for r in rep["clients"]], marker="o", label=p)
        ax[1][1].plot([r[0] for r in rep["multi_precision"]], [r[1 + j] for r in rep["multi_precision"]], marker="o", label=p)
    ax[0][2].set_title("single client, weather: messages vs precision")
    ax[1][0].set_title("binary tree, N=64, weather: messages vs clients")
    ax[1][1].set_title("6 clients, uniform: messages vs precision")
    ax[1][2].plot([r[0] for r in lv], [r[1] for r in lv], marker="o", label="exponential")
    ax[1][2].plot([r[0] for r in lv], [r[2] for r in lv], marker="o", label="linear")
    ax[1][2].set_yscale("log")
    ax[1][2].set_title("avg abs error vs approximation level")
    for a in ax.flat:
        a.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "swat_replication_levels.png"), dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 5))
    labels = ["%s/%s/%s" % (r[0][:3], r[1][:3], r[2][:3]) for r in acc]
    xs = range(len(acc))
    ax.bar([x - 0.2 for x in xs], [r[3] for r in acc], width=0.4, label="SWAT")
    ax.bar([x + 0.2 for x in xs], [r[6] for r in acc], width=0.4, label="Histogram (eps=0.1)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel("average relative error")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "swat_accuracy.png"), dpi=90)
    plt.close(fig)


def main(out_dir, quick=False):
    out_dir = out_dir or "results/swat"
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    sw = Swat(1024)
    data = stream("uniform", 50000, 1)
    t = time.perf_counter()
    for v in data:
        sw.update(v)
    upd = (time.perf_counter() - t) / len(data) * 1e6
    print("SWAT maintenance: %.2f us per reading (N=1024, CPython); %d numbers stored" % (upd, sw.stored()))
    acc, timing = accuracy(out_dir, quick)
    lv = levels(out_dir, quick)
    rep = replication(out_dir, quick)
    fleet(out_dir, quick)
    _plots(out_dir, acc, lv, rep)
    print("\nwrote tables and plots to %s in %.0f s" % (out_dir, time.perf_counter() - t0))
