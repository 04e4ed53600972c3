"""Reproduce Olston et al. 2003 (§3.3 Fig. 3/4, §5 Fig. 8, T/S settings, §4 latency) on synthetic workloads.

``quietfleet experiment olston [--quick]`` writes ``olston.csv``, ``olston.md`` and PNG plots. Every row
names its workload, seed and parameters. Cost is messages per time unit after a warm-up; "stream"
counts uplink messages only (the paper's idealized §3.3 measure, growth messages free), "total" counts
uplink + downlink (growth messages included, as in §5).

Random walks (§3.3) run with Gaussian steps N(0, s²) over seeds 1–5, the setting of the App. E model
P(W) ≈ W²/(2s)² that the optimal static baseline optimises; ±s steps are run too, but with widths of a
few steps the real rate of a ±s walk is a staircase in W/2s, and the App. F "optimum" can be far from
the best static widths (``lattice_gap`` measures it), so the comparison there measures lattice luck.

Multi-query stand-in for §5.2 (10 hosts × 31 measurement groups, 5 AVG queries Q1–Q5): object (h, g)
counts the packets of host h that satisfy exactly the predicates in g ⊆ {1..5} (1 remote login from
outside, 2 incoming, 3 incoming SYN, 4 outgoing DNS, 5 to/from outside); Qj averages the 160 objects
whose group contains j. Groups no packet can satisfy (1 without 2 and 5, 3 without 2, 4 with an incoming
predicate) stay 0. Groups within {2, 5} carry ~100× the volume of the others, hosts differ by a
log-normal activity factor and (unless ``stationary``) alternate busy/quiet phases; values are random
walks (a one-minute moving rate). Q2 and Q5 get precision δ, Q1, Q3, Q4 get δ/100, as in the paper.
"""
import csv
import itertools
import math
import os
import random
import sys
import tempfile
import time

import numpy as np

from backend.coordinator.precision.adaptive import REFINED
from backend.sim import engine

PAPER = {"multi_adaptive": 1.6, "multi_uniform": 5.4}
# The protocol as shipped (``precision.estimate``: measured rates, the static optimum, priced moves, no
# shrink), the §3.2 shrink rule refined (pooled burden estimate, capped growth, growth messages priced)
# and the paper's §3.2 exactly (per-period counts, the top object takes all the slack): ``precision.Adaptive``.
SHRINK = dict(REFINED, rule="shrink")
ADAPTIVE = (("adaptive", {}), ("adaptive (refined §3.2)", SHRINK),
            ("adaptive (paper)", {"rule": "shrink", "reports": 0, "cap": None, "growth_cost": 0.0}))
SEEDS = (1, 2, 3, 4, 5)
# At δ=20 a source reports ~0.07 times per period; there the paper's S=0.05 shrink itself costs reports.
LOW_RATE = ("adaptive (refined §3.2, S=0.01)", dict(SHRINK, shrink=0.01))


def _possible(g):
    if 1 in g and not (2 in g and 5 in g):
        return False
    if 3 in g and 2 not in g:
        return False
    return not (4 in g and g & {1, 2, 3})


def multiquery_trace(path, seed, duration, stationary=False):
    """Write the §5.2 stand-in trace to ``path``; return the five AVG query specs (without precision)."""
    rng = np.random.default_rng(seed)
    groups = [frozenset(c) for r in range(1, 6) for c in itertools.combinations(range(1, 6), r)]
    hosts = 10
    activity = rng.lognormal(0.0, 0.7, hosts)
    n = int(duration) + 1
    phase = np.ones((n, hosts))
    if not stationary:
        for h in range(hosts):
            t, busy = 0, rng.random() < 0.5
            while t < n:
                d = int(rng.exponential(600.0)) + 1
                phase[t:t + d, h] = 2.5 if busy else 0.4
                t, busy = t + d, not busy
    objs, walks, consts = [], [], []
    for h in range(hosts):
        for g in groups:
            name = "h%d.g%s" % (h, "".join(str(p) for p in sorted(g)))
            high = g <= {2, 5}
            start = (300.0 if high else 3.0) * activity[h]
            objs.append((name, g))
            if not _possible(g):
                consts.append((name, 0.0))
                continue
            step = 0.3 * (1.0 if high else 0.01) * activity[h] * rng.lognormal(0.0, 0.5)
            d = rng.normal(0.0, 1.0, n) * step * phase[:, h]
            d[0] = 0.0
            walks.append((name, np.abs(start + np.cumsum(d))))
    with open(path, "w") as fh:
        fh.write("time,source,value\n")
        for name, v in consts:
            fh.write("0,%s,0\n" % name)
        for t in range(n):
            fh.write("".join("%d,%s,%.6f\n" % (t, name, v[t]) for name, v in walks))
    return [{"id": "Q%d" % j, "kind": "avg", "sources": [o for o, g in objs if j in g]} for j in range(1, 6)]


def random_walk_queries(seed, delta, multi):
    """§3.3: one AVG over 10 sources (Fig. 3), or 5 AVG queries over random 2–5 of them (Fig. 4)."""
    ids = ["s%d" % i for i in range(10)]
    if not multi:
        return [{"id": "avg", "kind": "avg", "sources": ids, "precision": delta}]
    r = random.Random(seed)
    return [{"id": "q%d" % j, "kind": "avg", "sources": r.sample(ids, r.randint(2, 5)),
             "precision": round(r.uniform(0.0, delta), 4)} for j in range(5)]


def _rw_spec(seed, delta, multi, steps):
    return {"name": "randomwalk", "seed": seed, "queries": random_walk_queries(seed, delta, multi),
            "sources": {"generator": "random_walk", "count": 10, "step": [0.1, 2.0], "start": [0.0, 100.0],
                        "steps": steps}}


def _row(exp, workload, seed, protocol, params, res, delta, extra=""):
    span = res["duration"] - res["warmup"]
    return {"experiment": exp, "workload": workload, "seed": seed, "protocol": protocol,
            "delta": delta, "T": params.get("period", 10.0), "S": params.get("shrink", 0.05),
            "params": extra, "stream_per_s": round(res["messages"]["up"] / span, 4),
            "total_per_s": round((res["messages"]["up"] + res["messages"]["down"]) / span, 4),
            "violations": res["violations"], "precision_misses": res["precision_misses"],
            "late": res["late"]}


def _run(spec):
    return engine.run(spec)


def _say(msg):
    print("olston: " + msg, file=sys.stderr, flush=True)


def _run_all(specs):
    """Run independent simulations on every core; results in order, progress on stderr."""
    from multiprocessing import get_context
    out = []
    with get_context("fork").Pool(min(len(specs), os.cpu_count() or 1)) as pool:
        for i, res in enumerate(pool.imap(_run, specs, chunksize=1), 1):
            out.append(res)
            if i % 20 == 0 or i == len(specs):
                _say("random walks %d/%d runs" % (i, len(specs)))
    return out


def lattice_gap(seed, delta):
    """±s walks: expected reports per time unit of the App. F widths vs the best static widths.

    A ±s walk leaves a bound of width W after m² steps on average, m = ⌊W/(2s)⌋ + 1 (exit of a simple
    walk from (−m, m)), not the App. E model's W²/(2s)². The best static allocation under that exact rate
    (greedy on the integer m_i by gain per unit of width) is a static allocation that exists, so the
    ratio is a lower bound on how far the model's optimum is from the real one when W is a few steps wide.
    """
    from backend.coordinator.precision import optimal
    from backend.coordinator.precision.rows import Rows
    from backend.coordinator.core.queries import parse_query
    from backend.sim.sources import samples
    from backend.sim.workload import load
    w = load(dict(_rw_spec(seed, delta, False, "binary"), protocol="uniform", duration=10))
    keys = list(w.source_ids)
    var = optimal.step_variance(keys, *samples(w))     # a ±s walk: every squared step is s² exactly
    step = [var[k] ** 0.5 for k in keys]
    rows = Rows({"avg": parse_query(w.queries[0], keys)})
    widths = optimal.solve(rows, var, lambda k: 1.0)
    model = sum(1.0 / (math.floor(widths[k] / (2 * step[i])) + 1) ** 2 for i, k in enumerate(keys))
    m, used = [1] * len(keys), 0.0            # width 2s(m-1) makes the walk exit after m steps out
    while True:
        fits = [i for i in range(len(keys)) if used + 2 * step[i] <= rows.budget[0]]
        if not fits:
            break
        i = max(fits, key=lambda i: (1 / m[i] ** 2 - 1 / (m[i] + 1) ** 2) / step[i])
        m[i] += 1
        used += 2 * step[i]
    return model, sum(1.0 / x ** 2 for x in m)


def main(out_dir, quick=False, smoke=False):
    """Run everything (``quick``: shorter runs and fewer δ; ``smoke``: seconds, for the test suite)."""
    wall = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = _experiments(tmp, quick, smoke)
    _write(out_dir, rows, quick, time.perf_counter() - wall)
    return 0


def _experiments(tmp, quick, smoke):
    """All runs; traces of the multi-query stand-in go to ``tmp``. Returns the table rows."""
    rows = []
    seed = 1
    # -- §5.2 multi-query workload: adaptive vs uniform ----------------------------------------
    _say("multi-query workload (uniform and the adaptive rules)")
    dur, warm = (300, 100) if smoke else (2400, 400) if quick else (7200, 1200)
    deltas = [4.0] if quick or smoke else [1.0, 2.0, 4.0, 10.0]
    for stationary in (False, True):
        wl = "multiquery-stationary" if stationary else "multiquery"
        path = os.path.join(tmp, wl + ".csv")
        queries = multiquery_trace(path, seed, dur, stationary)
        for delta in (deltas if not stationary else [4.0]):
            qs = [dict(q, precision=delta if q["id"] in ("Q2", "Q5") else delta / 100) for q in queries]
            for label, extra in (("uniform", {}),) + ADAPTIVE:
                params = dict({"period": 10.0, "shrink": 0.05}, **extra)
                res = _run({"name": wl, "seed": seed, "duration": dur, "warmup": warm, "protocol": label.split()[0],
                            "sources": {"trace": path, "per_device": 31}, "queries": qs, "params": params})
                rows.append(_row("multi_query", wl, seed, label, params, res, delta, "dQ1,Q3,Q4=delta/100"))
    # -- §3.3 random walks: adaptive vs offline optimal static (Fig. 3 and 4), growth messages free ----
    rdur, rwarm = (600, 100) if smoke else (6000, 1000) if quick else (20000, 2000)
    deltas = [5.0] if smoke else [2.0, 5.0, 10.0] if quick else [1.0, 2.0, 5.0, 10.0, 20.0]
    runs = []
    for steps in ("normal", "binary"):
        for multi in ((False, True) if steps == "normal" else (False,)):
            wl = "randomwalk-%s%s" % ("5q" if multi else "1q", "" if steps == "normal" else "-binary")
            for s in (SEEDS[:1] if smoke else SEEDS):
                for delta in deltas:
                    extra = (LOW_RATE,) if delta >= 20 and steps == "normal" else ()
                    for proto, params in (("uniform", {}), ("optimal_static", {})) + ADAPTIVE + extra:
                        if proto.startswith("adaptive"):
                            params = dict({"period": 10.0, "shrink": 0.05}, **params)
                        spec = dict(_rw_spec(s, delta, multi, steps), duration=rdur, warmup=rwarm,
                                    protocol=proto.split()[0], params=params)
                        runs.append((wl, s, proto, params, delta, spec))
    for (wl, s, proto, params, delta, _), res in zip(runs, _run_all([r[-1] for r in runs])):
        rows.append(_row("random_walk", wl, s, proto, params, res, delta,
                         "%s steps U[0.1,2]%s" % ("N(0,s²)" if "binary" not in wl else "±s",
                                                  "; query sets U[2,5], delta_j U[0,delta]" if "5q" in wl else "")))
    # -- effect of T and S (single AVG random walk, delta 5; multi-query delta 4 in full mode) ---
    _say("effect of T and S")
    grid = [(5.0, 0.05), (10.0, 0.01), (10.0, 0.02), (10.0, 0.05), (10.0, 0.1), (20.0, 0.05)]
    for T, S in grid[:1] if smoke else grid:
        params = dict(SHRINK, period=T, shrink=S)
        same = [dict(r, experiment="T_S") for r in rows if (r["experiment"], r["workload"], r["delta"], r["seed"],
                r["protocol"], r["T"], r["S"]) == ("random_walk", "randomwalk-1q", 5.0, seed, ADAPTIVE[1][0], T, S)]
        if same:
            rows.append(same[0])
        else:
            spec = dict(_rw_spec(seed, 5.0, False, "normal"), duration=rdur, warmup=rwarm, protocol="adaptive",
                        params=params)
            rows.append(_row("T_S", "randomwalk-1q", seed, ADAPTIVE[1][0], params, _run(spec), 5.0,
                             "N(0,s²) steps U[0.1,2]"))
        if not (quick or smoke):
            path = os.path.join(tmp, "multiquery.csv")
            qs = [dict(q, precision=4.0 if q["id"] in ("Q2", "Q5") else 0.04) for q in queries]
            res = _run({"name": "multiquery", "seed": seed, "duration": dur, "warmup": warm, "protocol": "adaptive",
                        "sources": {"trace": path, "per_device": 31}, "queries": qs, "params": params})
            rows.append(_row("T_S", "multiquery", seed, ADAPTIVE[1][0], params, res, 4.0, "dQ1,Q3,Q4=delta/100"))
    # -- §4 latency: serialising queue vs §4.1 padding, delays changing while running ----------
    _say("latency: queue vs padding while delays change")
    step_hi = 2.0
    for proto, params, label in (
            ("adaptive", dict(SHRINK, period=10.0, shrink=0.05), "queue lambda=1.5"),
            ("adaptive", dict(SHRINK, period=10.0, shrink=0.05, rate=step_hi), "padding R=2 lambda=1.5"),
            ("uniform", {}, "queue lambda=1.5")):
        spec = {"name": "randomwalk-1q-delay", "seed": seed, "duration": rdur, "warmup": rwarm, "protocol": proto,
                "sources": {"generator": "random_walk", "count": 10, "step": [0.1, step_hi], "start": [0.0, 100.0]},
                "queries": random_walk_queries(seed, 10.0, False), "params": params,
                # λ covers the largest delay (0.4 + 0.1 jitter) plus one sample interval for padding
                "network": {"delay": 0.1, "latency_tolerance": 1.5},
                "events": [{"time": rdur / 3, "delay": {"delay": 0.4, "jitter": 0.1}},
                           {"time": 2 * rdur / 3, "delay": {"delay": 0.0, "jitter": 0.0}}]}
        rows.append(_row("latency", spec["name"], seed, proto, params, _run(spec), 10.0,
                         label + "; delay 0.1 -> 0.4+U[0,0.1] -> 0"))
    return rows


def _pick(rows, key, **match):
    for r in rows:
        if all(r[k] == v for k, v in match.items()):
            return r[key]
    return None


def _vs_static(rows):
    """{(workload, protocol, δ): [uplink ratio to optimal static, one per seed]} over the random walks."""
    walks = [r for r in rows if r["experiment"] == "random_walk"]
    base = {(r["workload"], r["seed"], r["delta"]): r["stream_per_s"] for r in walks
            if r["protocol"] == "optimal_static"}
    out = {}
    for r in walks:
        b = base.get((r["workload"], r["seed"], r["delta"]))
        if r["protocol"].startswith("adaptive") and b:
            out.setdefault((r["workload"], r["protocol"], r["delta"]), []).append(r["stream_per_s"] / b)
    return out


def _write(out_dir, rows, quick, elapsed):
    cols = list(rows[0])
    with open(os.path.join(out_dir, "olston.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    lines = ["# Olston et al. 2003 reproduction (%s mode, %.0f s)" % ("quick" if quick else "full", elapsed), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    lines += ["", "## Headline figures", "", "| figure | measured | paper | target |", "|---|---|---|---|"]
    for r in rows:
        if r["experiment"] == "multi_query" and r["protocol"].startswith("adaptive") and r["delta"] == 4.0:
            uni = _pick(rows, "total_per_s", experiment="multi_query", workload=r["workload"], protocol="uniform",
                        delta=4.0)
            lines.append("| %s δ=4: %s/uniform total msgs/s (%.2f / %.2f) | %.3f | %.2f (1.6/5.4) | ≤ 0.25 |"
                         % (r["workload"], r["protocol"], r["total_per_s"], uni, r["total_per_s"] / uni,
                            PAPER["multi_adaptive"] / PAPER["multi_uniform"]))
    ratios = _vs_static(rows)
    deltas = sorted({d for _, _, d in ratios})
    walks = ("randomwalk-1q", "randomwalk-5q", "randomwalk-1q-binary")
    for wl in walks:
        for label, _ in ADAPTIVE:
            rs = [x for d in deltas for x in ratios.get((wl, label, d), [])]
            if rs:
                lines.append("| %s: %s / optimal static uplink (idealized), worst [mean] over %d seed×δ "
                             "| %.3f [%.3f] | on par | ≤ 1.10 |" % (wl, label, len(rs), max(rs), sum(rs) / len(rs)))
    lines += ["", "## Random walks: adaptive / optimal static uplink by δ, worst [mean] over seeds", "",
              "| workload | protocol | " + " | ".join("δ=%g" % d for d in deltas) + " |",
              "|---|---|" + "---|" * len(deltas)]
    for wl in walks:
        for label, _ in ADAPTIVE + (LOW_RATE,):
            cells = [ratios.get((wl, label, d)) for d in deltas]
            if any(cells):
                lines.append("| %s | %s | %s |" % (wl, label, " | ".join(
                    "%.3f [%.3f]" % (max(rs), sum(rs) / len(rs)) if rs else "" for rs in cells)))
    lines += ["", "| figure | measured | paper | target |", "|---|---|---|---|"]
    bad = sum(r["violations"] for r in rows)
    lines.append("| guarantee violations, all runs | %d | — | 0 |" % bad)
    seeds = sorted({r["seed"] for r in rows if r["workload"] == "randomwalk-1q-binary"})
    deltas = sorted({r["delta"] for r in rows if r["workload"] == "randomwalk-1q-binary"})
    if seeds:
        lines += ["", "## ±s steps: the App. F widths against an exact-lattice static allocation", "",
                  "Expected reports per time unit of a ±s walk with width W are 1/m², m = ⌊W/2s⌋+1, "
                  "not (2s/W)². "
                  "`model` is the App. F optimum's real rate, `lattice` a static allocation chosen on the exact "
                  "rate; their ratio is how much a static allocation can gain from the lattice alone.", "",
                  "| seed | δ | App. F widths | lattice widths | ratio |", "|---|---|---|---|---|"]
        for sd in seeds:
            for d in deltas:
                model, lattice = lattice_gap(sd, d)
                lines.append("| %d | %g | %.3f | %.3f | %.2f |" % (sd, d, model, lattice, model / lattice))
    with open(os.path.join(out_dir, "olston.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    _plots(out_dir, rows)
    print("\n".join(lines))


def _plots(out_dir, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for exp, wl, key, name in (("random_walk", "randomwalk-1q", "stream_per_s", "fig3_randomwalk_1q.png"),
                               ("random_walk", "randomwalk-5q", "stream_per_s", "fig4_randomwalk_5q.png"),
                               ("multi_query", "multiquery", "total_per_s", "fig8_multiquery.png")):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        series = {}
        for r in rows:
            if r["experiment"] == exp and r["workload"] == wl:
                if r["seed"] == 1:
                    series.setdefault(r["protocol"], []).append((r["delta"], r[key]))
        for label, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("precision constraint δ" + (" (δmax)" if wl.endswith("5q") else ""))
        ax.set_ylabel("messages per time unit (%s)" % ("uplink" if key == "stream_per_s" else "total"))
        ax.set_title(wl)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ts = [r for r in rows if r["experiment"] == "T_S" and r["workload"] == "randomwalk-1q"]
    ax.bar(["T=%g S=%g" % (r["T"], r["S"]) for r in ts], [r["total_per_s"] for r in ts])
    ax.set_ylabel("total messages per time unit")
    ax.set_title("effect of T and S (random walk, δ=5)")
    ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "t_s_sweep.png"), dpi=100)
    plt.close(fig)
