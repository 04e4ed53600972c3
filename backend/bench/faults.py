"""``python -m backend.bench.faults``: the bench workloads on a hostile network (issue #20, DESIGN.md §8).

Each synthetic bench workload (``backend.bench.report.workloads``) runs under the default adaptive protocol and
deadband twice with the same seed, delay 0.2 s + jitter 0.1 s and a 5 s heartbeat: on a clean network
and with loss 5 %, duplication 5 %, reordering 20 % and device clocks off by up to 0.3 s. Printed
per run: violations outside degraded or revoked windows (target 0), the share of query time answered
degraded next to the share the faults forced (``backend.sim.forced``), and messages against the
fault-free run. Writes ``faults.csv`` and ``faults.md`` to ``--out``.
"""
import argparse
import copy
import csv
import os

from backend.bench.report import workloads
from backend.sim import engine

FAULTS = {"loss": 0.05, "duplicate": 0.05, "reorder": 0.2, "skew": 0.3}
NETWORK = {"delay": 0.2, "jitter": 0.1}
NAMES = ("single-avg-10", "overlapping-5q", "mixed-aggregates", "hetero-24")


def run(name, spec, protocol, faults):
    w = copy.deepcopy(spec)
    w.update(name=name, protocol=protocol, network=dict(NETWORK, **faults))
    w.setdefault("params", {})["heartbeat"] = 5.0
    return engine.run(w)


def table(scale):
    rows = []
    for name, spec in workloads(scale):
        if name not in NAMES:
            continue
        for protocol in ("adaptive", "deadband"):
            clean, hostile = run(name, spec, protocol, {}), run(name, spec, protocol, FAULTS)
            msgs = lambda r: r["messages"]["up"] + r["messages"]["down"]
            f = hostile["faults"]
            rows.append({"workload": name, "protocol": protocol, "seed": spec["seed"], "duration": spec["duration"],
                         "violations": hostile["violations"], "clean_violations": clean["violations"],
                         "degraded_share": round(f["degraded_share"], 4), "forced_share": round(f["forced_share"], 4),
                         "messages": msgs(hostile), "clean_messages": msgs(clean),
                         "messages_vs_clean": round(msgs(hostile) / max(1, msgs(clean)), 3),
                         "lost": hostile["network"]["lost"], "reordered": hostile["network"]["reordered"],
                         "duplicated": hostile["network"]["duplicated"], "late": hostile["late"],
                         "rebirths_asked": f["integrity"]["asked"]})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1, help="duration scale of the bench workloads")
    p.add_argument("--out", default=os.path.join("results", "bench"))
    args = p.parse_args(argv)
    rows = table(args.scale)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "faults.csv"), "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    cols = ("workload", "protocol", "violations", "degraded_share", "forced_share", "messages_vs_clean", "lost", "late")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    text = "Faults %s, delay 0.2 s + jitter 0.1 s, heartbeat 5 s, scale %s (target: 0 violations)\n\n%s\n" % (
        ", ".join("%s %s" % kv for kv in FAULTS.items()), args.scale, "\n".join(lines))
    with open(os.path.join(args.out, "faults.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 1 if any(r["violations"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
