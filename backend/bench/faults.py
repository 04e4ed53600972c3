"""``python -m backend.bench.faults``: the bench workloads on a hostile network (issue #20, [final]; DESIGN.md §4, §8).

Each synthetic bench workload (``backend.bench.report.workloads``), and the issue's own (``final-20``: 20
random walks at 1 Hz, a SUM at precision 60 and a MAX over 4 at 6), runs under the default adaptive protocol
and deadband twice with the same seed and the default (per-device) heartbeat, delay 0.2 s + jitter 0.1 s
(``final-20``: 0.1 + 0.1): on a clean network and with loss 5 %, duplication 5 %, reordering 20 % and device
clocks off by up to 0.3 s. Printed per run: violations outside degraded or revoked windows (target 0),
non-degraded answers wider than their precision (0), the share of checked instants degraded or withdrawn
(≤ 0.35), wrong provisional answers and how soon they were withdrawn (≤ 5 s), the share of query time
answered degraded next to the share the faults forced (``backend.sim.forced``), the share of final answers
(by record and by the time they stand) wider than the precision (and how many of those do not say their width:
0), messages against the fault-free run, and ack mode's traffic (acks, nacks, the devices' resends). Writes
``faults.csv`` and ``faults.md`` to ``--out``. ``--seeds 7,1001`` runs the issue's workload alone at its full
1,200 s per seed, with the faults and with the skew alone, and prints adaptive against deadband per seed: all
messages, and without ack mode's delivery traffic (acks, nacks, resends: which messages a lossy network drops is
a different draw in each run), with the final answers' quality beside them and adaptive's ``ledger`` at the end
(``Simulation.regret``: its filter messages less the deadband its own devices metered, against its loan: what the
exact no-regret promises, while a deadband run learns its own reserve R, ``reserve.py``). ``--shapes`` picks the networks of
``--seeds`` from ``SHAPES``: besides the faults and the skew alone, heavier loss, device reboots, partitions and
offline devices (Zhu §1.2 outages), each with the faults and the skew under it (schedules drawn from the seed).
"""
import argparse
import copy
import csv
import os
import random

from backend.bench.report import workloads
from backend.sim import engine, final_truth
from edge.core import codec

FAULTS = {"loss": 0.05, "duplicate": 0.05, "reorder": 0.2, "skew": 0.3}
NETWORK = {"delay": 0.2, "jitter": 0.1}
NAMES = ("single-avg-10", "overlapping-5q", "mixed-aggregates", "hetero-24", "final-20")
FINAL = {"seed": 7, "duration": 1200, "network": {"delay": 0.1, "jitter": 0.1},
         "sources": {"generator": "random_walk", "count": 20, "per_device": 1, "start": [40, 60],
                     "step": [0.5, 2.0], "interval": 1},
         "queries": [{"id": "total", "kind": "sum", "sources": "all", "precision": 60},
                     {"id": "top", "kind": "max", "sources": ["s0", "s1", "s2", "s3"], "precision": 6}]}


def _partitions(seed, devices):
    """Four partitions of 5 devices for 30-180 s and one of every device for 20 s, drawn from ``seed``."""
    rnd = random.Random("partitions/%d" % seed)
    cut = []
    for _ in range(4):
        a = rnd.uniform(50, 1000)
        cut.append([a, a + rnd.uniform(30, 180), rnd.sample(devices, 5)])
    a = rnd.uniform(200, 900)
    return cut + [[a, a + 20, "all"]]


DEVICES = ["d%d" % i for i in range(FINAL["sources"]["count"])]
# name -> seed -> (network faults, sources' extra keys) for ``seeds``
SHAPES = {"faults": lambda seed: (FAULTS, {}),
          "skew": lambda seed: ({"skew": FAULTS["skew"]}, {}),
          "heavy": lambda seed: (dict(FAULTS, loss=0.15, duplicate=0.1, reorder=0.3), {}),
          "reboots": lambda seed: (dict(FAULTS, reboots=6.0), {}),
          "partitions": lambda seed: (dict(FAULTS, partitions=_partitions(seed, DEVICES)), {}),
          "outages": lambda seed: (FAULTS, {"outages": {"rate": 1 / 600.0, "mean_length": 60.0}})}


def run(name, spec, protocol, faults):
    """The result of a run, with ``final_wide``: (records, time) shares of its final answers wider than their
    precision (degraded, saying so; a final answer stands until its query's next one, the last to its horizon;
    one with a source unknown, of infinite width, is not counted), and ``final_wide_unsaid``: how many of those
    do not state their width (target 0)."""
    w = copy.deepcopy(spec)
    w.update(name=name, protocol=protocol, network=dict(w.get("network", NETWORK), **faults))
    sim = engine.simulation(w)
    put = _resends(sim)
    res = sim.run()
    by = {}
    for a in sim.answers:
        if a.get("final"):
            by.setdefault(a["query"], []).append(a)
    n = wide = unsaid = 0
    span = wide_span = 0.0
    for qid, fin in sorted(by.items()):
        got, s, ws = final_truth.wider(fin, sim.coord.finals.horizon(qid), sim.precisions[qid])
        n, wide, span, wide_span = n + len(fin), wide + len(got), span + s, wide_span + ws
        unsaid += len(final_truth.unsaid(got))
    res["final_wide"] = (wide / n if n else 0.0, wide_span / span if span else 0.0)
    res["final_wide_unsaid"] = unsaid
    res["resent"] = sum(a.delivery.stats["resent"] for a in sim.agents.values())
    res["resent_sent"] = put[0]
    res["delivery"] = res["by_kind"].get("ack", 0) + res["by_kind"].get("nack", 0) + put[0]     # ack mode's traffic
    res["ledger"] = sim.regret()
    return res


def _resends(sim):
    """A count of the devices' resends that reached the network (chained on ``sim.watch``): one a partition or
    the loss dropped is counted by its device (``resent``) but is no message; a partitioned device resends its
    report every few seconds."""
    seen, put, inner = set(), [0], sim.watch

    def watch(now, end, payload, arrivals):
        if inner is not None:
            inner(now, end, payload, arrivals)
        if arrivals and now >= sim.net.warmup and (end, payload) in seen and \
                codec.decode(payload)[0] not in ("birth", "mark"):
            put[0] += 1
        seen.add((end, payload))
    sim.watch = watch
    return put


def table(scale):
    rows = []
    for name, spec in workloads(scale) + [("final-20", dict(FINAL, duration=max(300, int(FINAL["duration"] * scale))))]:
        if name not in NAMES:
            continue
        for protocol in ("adaptive", "deadband"):
            clean, hostile = run(name, spec, protocol, {}), run(name, spec, protocol, FAULTS)
            msgs = lambda r: r["messages"]["up"] + r["messages"]["down"]
            f = hostile["faults"]
            rows.append({"workload": name, "protocol": protocol, "seed": spec["seed"], "duration": spec["duration"],
                         "violations": hostile["violations"], "clean_violations": clean["violations"],
                         "precision_misses": hostile["precision_misses"],
                         "degraded_or_withdrawn": round(f["degraded_or_withdrawn"] or 0.0, 4),
                         "wrong_provisional": f["wrong_provisional"],
                         "withdraw_delay_max": round(f["withdraw_delay_max"], 3) if f["withdraw_delay_max"] else 0.0,
                         "withdrawn_late": f["withdrawn_late"],
                         "degraded_share": round(f["degraded_share"], 4), "forced_share": round(f["forced_share"], 4),
                         "final_wide_records": round(hostile["final_wide"][0], 4),
                         "final_wide_time": round(hostile["final_wide"][1], 4),
                         "final_wide_unsaid": hostile["final_wide_unsaid"],
                         "messages": msgs(hostile), "clean_messages": msgs(clean),
                         "messages_vs_clean": round(msgs(hostile) / max(1, msgs(clean)), 3),
                         "acks": hostile["by_kind"].get("ack", 0), "nacks": hostile["by_kind"].get("nack", 0),
                         "resent": hostile["resent"], "marks": hostile["by_kind"].get("mark", 0),
                         "clean_marks": clean["by_kind"].get("mark", 0),
                         "lost": hostile["network"]["lost"], "reordered": hostile["network"]["reordered"],
                         "duplicated": hostile["network"]["duplicated"], "late": hostile["late"],
                         "lost_found": f["integrity"]["lost"], "rebirths_asked": f["integrity"]["asked"]})
    return rows


def seeds(which, shapes=("faults", "skew")):
    """The issue's workload per seed in ``which`` at full length on each network of ``shapes`` (``SHAPES``)."""
    cols = ("seed", "network", "protocol", "messages", "delivery", "others", "violations", "final_violations",
            "precision_misses", "final_wide", "final_wide_unsaid", "degraded_or_withdrawn", "withdraw_delay_max",
            "withdrawn_late", "ledger")
    lines = ["| " + " | ".join(cols) + " | adaptive − deadband (all / others) |", "|" + "---|" * (len(cols) + 1)]
    for seed in which:
        for label in shapes:
            faults, extra = SHAPES[label](seed)
            spec = dict(FINAL, seed=seed, sources=dict(FINAL["sources"], **extra))
            got = {}
            for protocol in ("adaptive", "deadband"):
                r = run("final-%d" % seed, spec, protocol, faults)
                msgs = r["messages"]["up"] + r["messages"]["down"]
                delivery = r["delivery"]
                f = r["faults"]
                got[protocol] = row = {
                    "seed": seed, "network": label, "protocol": protocol, "messages": msgs, "delivery": delivery,
                    "others": msgs - delivery, "violations": r["violations"], "precision_misses": r["precision_misses"],
                    "final_wide": round(r["final_wide"][0], 5), "final_wide_unsaid": r["final_wide_unsaid"],
                    "final_violations": sum(q.get("final_violations") or 0 for q in r["queries"].values()),
                    "degraded_or_withdrawn": round(f["degraded_or_withdrawn"] or 0.0, 4),
                    "withdraw_delay_max": round(f["withdraw_delay_max"] or 0.0, 3), "withdrawn_late": f["withdrawn_late"],
                    "ledger": "%+d (loan %d)" % r["ledger"] if r["ledger"] else ""}
                lines.append("| " + " | ".join(str(row[c]) for c in cols) + " | |")
            a, d = got["adaptive"], got["deadband"]
            lines[-1] = lines[-1][:-2] + " %+d / %+d |" % (a["messages"] - d["messages"], a["others"] - d["others"])
            print(lines[-2] + "\n" + lines[-1], flush=True)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1, help="duration scale of the bench workloads")
    p.add_argument("--out", default=os.path.join("results", "bench"))
    p.add_argument("--seeds", help="comma-separated seeds: the issue's workload alone at full length per seed")
    p.add_argument("--shapes", default="faults,skew",
                   help="with --seeds: comma-separated networks, of %s" % ", ".join(SHAPES))
    args = p.parse_args(argv)
    if args.seeds:
        shapes = args.shapes.split(",")
        unknown = [x for x in shapes if x not in SHAPES]
        if unknown:
            p.error("unknown network %r in --shapes: choose from %s" % (unknown[0], ", ".join(SHAPES)))
        try:
            which = [int(x) for x in args.seeds.split(",")]
        except ValueError:
            p.error("--seeds must be comma-separated integers, got %r" % args.seeds)
        print(seeds(which, shapes))
        return 0
    rows = table(args.scale)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "faults.csv"), "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    cols = ("workload", "protocol", "violations", "precision_misses", "degraded_or_withdrawn", "wrong_provisional",
            "withdraw_delay_max", "withdrawn_late", "degraded_share", "forced_share", "final_wide_records", "final_wide_time",
            "final_wide_unsaid", "messages", "messages_vs_clean", "acks", "nacks", "resent", "lost", "lost_found")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    text = ("Faults %s, delay 0.2 s + jitter 0.1 s (final-20: 0.1 + 0.1), default heartbeat, scale %s (targets: 0 "
            "violations, 0 precision misses, degraded or withdrawn <= 0.35 of instants, withdrawn within 5 s and "
            "within what each answer stated)\n\n%s\n"
            % (", ".join("%s %s" % kv for kv in FAULTS.items()), args.scale, "\n".join(lines)))
    with open(os.path.join(args.out, "faults.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 1 if any(r["violations"] or r["precision_misses"] or r["final_wide_unsaid"] or r["withdrawn_late"]
                    for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
