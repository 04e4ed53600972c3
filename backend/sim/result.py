"""RESULT.json of a fleet simulation (DESIGN.md §4, §5): messages and bytes, and every answer checked against truth.

Aggregate answers are merged with the exact step function of their query (``truth.check``),
entity answers with the exact membership (``entity_truth.check``) and summary answers with the
exact window (``summary_truth.check``); probabilistic answers report their measured fidelity
instead of violations; interval answers also say how their provisional answers fared (``withdrawal``:
degraded and withdrawn shares, wrong provisional answers and how soon they were withdrawn).
``headline`` is the one-line summary ``quietfleet sim`` prints for any kind.
"""
import math

from backend.sim import entity_truth, final_truth, summary_truth, truth as truth_mod, withdrawal


def _split(sim):
    """The answers within the run (and before their query's removal), by the checker they go to."""
    w = sim.w
    by_q, prob, finals = {}, {}, {}
    ents = {qid: [] for qid in sim.truth.entity.tracks}
    sums = {qid: [] for qid in sim.truth.summary.tracks}
    revoked, published, stated = {}, {}, {}
    for a, at in zip(sim.answers, sim.emitted):
        if "revoked" in a and a["revoked"][0] <= w.duration:    # open-ended past the checked span
            lo, hi = a["revoked"]
            revoked.setdefault(a["query"], []).append([lo, hi if hi < w.duration else math.inf])
            published.setdefault(a["query"], []).append((lo, hi if hi < w.duration else math.inf, a["time"]))
        if a["time"] > w.duration or a["time"] >= sim.ended.get(a["query"], (math.inf,))[0]:
            continue
        if a.get("final"):
            finals.setdefault(a["query"], []).append(((a["time"], a["lo"], a["hi"], a["dlo"], a["dhi"], a["degraded"],
                                                       a["watermark"]), at))
        elif a["query"] in sums:
            sums[a["query"]].append(a)
        elif a["query"] in ents:
            ents[a["query"]].append((a["time"], a["members"], a["degraded"]))
        else:
            by_q.setdefault(a["query"], []).append((a["time"], a["lo"], a["hi"], a["degraded"]))
            stated.setdefault(a["query"], []).append(a.get("withdraw_within", math.inf))
            if a.get("guarantee") == "probabilistic":
                prob[a["query"]] = a["confidence"]
    raw = dict(by_q)
    for qid, windows in revoked.items():     # answers found wrong later count as degraded (issue #20)
        if qid in by_q:
            by_q[qid] = truth_mod.revoke(by_q[qid], windows)
        elif qid in ents:
            ents[qid] = truth_mod.revoke(ents[qid], windows)
    return by_q, prob, ents, sums, finals, (raw, published, stated)


def fleet(sim, elapsed):
    w = sim.w
    by_q, prob, ents, sums, finals, (raw, published, stated) = _split(sim)
    per_q = {}
    tot_v = tot_m = 0
    tot_vt = 0.0
    for qid in sim.queries:
        if qid in sums:
            per_q[qid] = summary_truth.check(sim.truth.summary, qid, sums[qid], w.duration)
            tot_v += per_q[qid]["violations"]
            tot_m += per_q[qid]["precision_misses"]
            continue
        if qid in ents:
            per_q[qid] = entity_truth.check(sim.truth.entity.tracks[qid], ents[qid], w.duration)
            tot_v += per_q[qid]["violations"]
            tot_vt += per_q[qid]["violation_time"]
            continue
        end, tl = sim.ended.get(qid, (w.duration, None))
        tl = sim.truth.tracks[qid].timeline if tl is None else tl
        answers = by_q.get(qid, [])
        v, vt, m, dt = truth_mod.check(tl, answers, sim.precisions[qid], min(w.duration, end))
        widths = [hi - lo for _, lo, hi, _ in answers if hi - lo < float("inf")]
        per_q[qid] = {"answers": len(answers), "violations": v, "violation_time": vt,
                      "precision_misses": m, "degraded_time": dt,
                      "mean_width": sum(widths) / len(widths) if widths else None}
        per_q[qid].update(truth_mod.fidelity(tl, answers, w.duration))
        per_q[qid].update(withdrawal.provisional(tl, raw.get(qid, []), published.get(qid, ()), min(w.duration, end),
                                                 stated.get(qid, [])))
        if qid in sim.coord.finals.qs or qid in finals:      # its final answers too, without exemption
            mine = finals.get(qid, [])
            through = sim.coord.finals.horizon(qid) or (mine[-1][0][0] if mine else end)
            fin = final_truth.check_final(tl, [f for f, _ in mine], min(end, through), sim.precisions[qid],
                                          [at for _, at in mine])
            per_q[qid].update(fin)
            tot_v += fin["final_violations"] + fin["final_revoked"]
            tot_m += fin["final_precision_misses"]
        if qid in prob:     # a probabilistic guarantee is measured, not counted as violations
            per_q[qid].update({"guarantee": "probabilistic", "confidence": prob[qid]})
            continue
        tot_v += v
        tot_vt += vt
        tot_m += m
    faults = None
    if sim.forced is not None:     # degraded time next to the time the faults forced (issue #20)
        for qid, r in per_q.items():
            if "degraded_time" in r and qid in sim.queries:
                r["forced_time"] = sim.forced.time(sim.queries[qid].sources)
        shares = [(r["degraded_time"], r["forced_time"]) for r in per_q.values() if "forced_time" in r]
        n_q = max(1, len(shares))
        pq = [r for r in per_q.values() if r.get("instants")]
        n_i = sum(r["instants"] for r in pq)
        delays = [r["withdraw_delay_max"] for r in pq if r["withdraw_delay_max"] is not None]
        faults = {"degraded_share": sum(d for d, _ in shares) / n_q / w.duration,
                  "forced_share": sum(f for _, f in shares) / n_q / w.duration,
                  # of the checked instants: degraded when published, or withdrawn later (withdrawal.py)
                  "degraded_or_withdrawn": sum(r["instants"] * (r["degraded_share"] + r["withdrawn_share"])
                                               for r in pq) / n_i if n_i else None,
                  "wrong_provisional": sum(r["wrong_provisional"] for r in pq),
                  "withdrawn_late": sum(r["withdrawn_late"] for r in pq),
                  "withdraw_delay_max": max(delays) if delays else None,
                  "integrity": dict(sim.coord.integrity.stats, **sim.coord.integrity.links.stats,
                                    **sim.coord.integrity.offsets.stats)}
    net = sim.net
    agents = sim.agents.values()
    n = len(sim.ts)
    return {
        "kind": "fleet", "workload": w.name, "protocol": w.protocol, "seed": w.seed, "duration": w.duration,
        "sources": len(w.source_ids), "devices": len(sim.agents), "samples": n,
        "messages": {"up": net.messages["up"], "down": net.messages["down"]},
        "bytes": {"up": net.bytes["up"], "down": net.bytes["down"]},
        "by_kind": net.by_kind,
        "reports": sum(a.stats["reports"] for a in agents),
        "screened": sim.screened,           # readings the vectorised path kept from the scalar agents
        "probes": sum(a.stats["probes"] for a in agents),
        "violations": tot_v, "violation_time": tot_vt, "precision_misses": tot_m,
        "late": sim.coord.stats["late"], "lost": sim.lost, "warmup": w.warmup,
        "network": dict(net.counts, reboots=sim.reboots), "faults": faults,
        "protocol_stats": getattr(sim.protocol, "stats", None),
        "queries": per_q,
        "params": {"period": w.period, "shrink": w.shrink, "delay_up": w.delay_up,
                   "delay_down": w.delay_down, "jitter": w.jitter, "latency_tolerance": w.latency},
        "runtime_s": elapsed, "samples_per_s": n / elapsed if elapsed > 0 else None,
    }


def headline(res):
    """One line about a result of any kind."""
    if res["kind"] == "relay":
        return "%s: %d items, %d hop-1 / %d backend messages, reduced cost %.3f, %d violations, %d theorem misses" % (
            res["protocol"], res["items"], res["messages"]["hop1"], res["messages"]["backend"],
            res["reduced_cost"], res["violations"], res["theorem_misses"])
    if res["kind"] == "summary":
        return "%s: %d queries at %d client(s), %d messages (%d on the device link), %.0f%% answered locally, " \
               "%d violations" % (res["protocol"], res["queries"], res["clients"], res["messages"],
                                  res["uplink_messages"], 100 * res["answered_locally"], res["violations"])
    return "%s: %d samples, %d up / %d down messages, %d violations (%.0f samples/s)" % (
        res["protocol"], res["samples"], res["messages"]["up"], res["messages"]["down"],
        res["violations"], res["samples_per_s"] or 0)
