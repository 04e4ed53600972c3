"""Discrete-event fleet simulator (DESIGN.md §5): the real agents and coordinator, a network, ground truth.

Devices are ``edge.agent.Agent`` objects and the backend is a ``Coordinator``; everything between
them is encoded by the codec and delayed by the network model (FIFO per device and direction).
The simulator counts messages and bytes per direction and checks every answer against the truth.
"""
import bisect
import heapq
import json
import math
import time as _time

import numpy as np

from backend.coordinator.protocols import make
from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.core.queries import parse_query
from backend.sim import entity_truth, summary_truth, truth as truth_mod
from backend.sim.workload import load, outages, samples
from edge.agent import Agent
from edge.core import codec

_DELIVER_UP, _DELIVER_DOWN, _AGENT_TIMER, _COORD_TIMER, _OUTAGE = 0, 1, 2, 3, 4
_EVENT_TRUTH, _EVENT_COORD = 5, 6      # a workload event reaches the truth at t, the coordinator at t + λ


class Simulation:
    def __init__(self, workload, progress=None, vectorised=True):
        self.w = load(workload) if not hasattr(workload, "source_ids") else workload
        w = self.w
        params = {k: v for k, v in w.params.items() if k not in ("period", "shrink", "heartbeat")}
        self.protocol = make(w.protocol, **params)
        self.coord = Coordinator(self.protocol, period=w.period,
                                 shrink=w.shrink if self.protocol.shrinks else 0.0,
                                 latency=w.latency, beat=w.beat)
        self.coord.declare_sources(w.source_ids)
        self.agents = {}
        self.src_dev = []
        for dev, ids in w.devices():
            self.agents[dev] = Agent(dev, ids, boot=1)
            for j, _ in enumerate(ids):
                self.src_dev.append((dev, j))
        self.truth = truth_mod.Truth(w.source_ids)
        # Vectorised screening (DESIGN.md §5): numpy mirrors of every agent filter let a whole
        # instant's in-bound readings skip the scalar agent; anything else takes the scalar path.
        n = len(w.source_ids)
        self.lo = np.full(n, np.inf)
        self.hi = np.full(n, -np.inf)
        self.vals = np.zeros(n)
        self.owed = np.zeros(n, dtype=bool)      # vals[s] not yet copied into its agent
        self.screened = np.zeros(n, dtype=np.int64)
        self.dev_src = {}
        for s, (dev, j) in enumerate(self.src_dev):
            self.dev_src.setdefault(dev, []).append((s, j))
        self.heap = []
        self.n = 0
        self.fifo = {}
        self.timer_at = {}
        self.answers = []
        self.progress = progress
        self.vectorised = vectorised
        import random
        self.jit = random.Random(w.seed + 1)
        self.counts = {"up": 0, "down": 0, "bytes_up": 0, "bytes_down": 0, "by_kind": {}, "lost": 0}
        self.down = set()               # devices in an outage (Zhu §1.2): nothing in or out
        self.net = {"up": w.delay_up, "down": w.delay_down, "jitter": w.jitter}
        self.precisions = {}    # query id -> [(t, δ)]
        self.ended = {}         # query id -> (time it was removed, its truth timeline)

    # -- network ---------------------------------------------------------------------
    def _push(self, t, kind, data):
        self.n += 1
        heapq.heappush(self.heap, (t, kind, self.n, data))

    def _send(self, now, direction, device, payload):
        net = self.net
        delay = net[direction]
        if net["jitter"]:
            delay += self.jit.uniform(0.0, net["jitter"])
        key = (direction, device)
        at = max(now + delay, self.fifo.get(key, now))
        self.fifo[key] = at
        self._push(at, _DELIVER_UP if direction == "up" else _DELIVER_DOWN, (device, payload))
        if now < self.w.warmup:
            return
        c = self.counts
        c[direction] += 1
        c["bytes_" + direction] += len(payload)
        kind = codec.NAMES.get(payload[1], "?")
        c["by_kind"][kind] = c["by_kind"].get(kind, 0) + 1

    def _agent(self, device):
        """The agent of ``device`` with every screened reading handed over."""
        a = self.agents[device]
        for s, j in self.dev_src[device]:
            if self.owed[s]:
                a.values[j] = float(self.vals[s])
                self.owed[s] = False
        return a

    def _from_agent(self, now, device, out):
        if device in self.down:
            self.counts["lost"] += len(out)
            out = ()
        for _, payload in out:
            self._send(now, "up", device, payload)
        a = self.agents[device]
        for s, j in self.dev_src[device]:
            f = a.filters[j]
            if f.center is None or f.cons or (a.summaries and j in a.summaries):   # SWAT trees see every reading
                self.lo[s], self.hi[s] = np.inf, -np.inf     # always take the scalar path
            else:
                self.lo[s], self.hi[s] = f.lo, f.hi
        self._arm_agent(device)

    def _arm_agent(self, device):
        t = self.agents[device].next_deadline()
        if t is not None and self.timer_at.get(device) != t:
            self.timer_at[device] = t
            self._push(t, _AGENT_TIMER, device)

    def _from_coord(self, now, actions):
        for a in actions:
            if a[0] == "down":
                self._send(now, "down", a[1], a[2])
            else:
                ch = a[1]
                self.answers.append(ch)
        t = self.coord.next_deadline()
        if self.timer_at.get(None) != t:
            self.timer_at[None] = t
            self._push(t, _COORD_TIMER, None)

    # -- run -------------------------------------------------------------------------
    def run(self):
        w = self.w
        wall = _time.perf_counter()
        ts_np, ss_np, vs_np = samples(w)
        self.protocol.workload_samples(w.source_ids, ts_np, ss_np, vs_np)
        ts, ss, vs = ts_np.tolist(), ss_np.tolist(), vs_np.tolist()
        queries = {}
        for spec in w.queries:
            q = parse_query(spec, w.source_ids, kinds=self.protocol.kinds)
            queries[q.id] = q
            self.precisions[q.id] = [(0.0, q.precision)]
            self.truth.add_query(q, 0.0)
            self._from_coord(0.0, self.coord.add_query(spec, 0.0))
        for ev in w.events:
            self._push(ev["time"], _EVENT_TRUTH, ev)
            self._push(ev["time"] + self.coord.latency, _EVENT_COORD, ev)
        for dev, a in self.agents.items():
            self._from_agent(0.0, dev, a.start(0.0))
        for dev, spans in outages(w).items():
            for start, stop in spans:
                self._push(start, _OUTAGE, (dev, True))
                self._push(stop, _OUTAGE, (dev, False))
        n = len(ts)
        i = 0
        end = w.duration
        drain = end + w.latency          # deliveries of readings up to `end` arrive by then
        heap = self.heap
        next_report = n // 10 if self.progress else n + 1
        while True:
            st = ts[i] if i < n else math.inf
            if heap and heap[0][0] <= st:
                t, kind, _, data = heapq.heappop(heap)
                if t > drain:
                    break
                if kind == _DELIVER_UP:
                    self._from_coord(t, self.coord.handle_uplink(t, data[0], data[1]))
                elif kind == _DELIVER_DOWN:
                    if data[0] in self.down:
                        self.counts["lost"] += 1
                    else:
                        self._from_agent(t, data[0], self._agent(data[0]).handle_message(t, data[1]))
                elif kind == _OUTAGE:
                    dev, starts = data
                    if starts:      # the broker publishes the Last Will; on return the device is born again
                        self.down.add(dev)
                        self._send(t, "up", dev, self.agents[dev].will())
                    else:
                        self.down.discard(dev)
                        self._from_agent(t, dev, self._agent(dev).start(t))
                elif kind == _EVENT_TRUTH:
                    self._event_truth(data, queries)
                elif kind == _EVENT_COORD:
                    self._from_coord(t, self.coord.handle_timer(t))
                    self._event_coord(t, data)
                elif kind == _AGENT_TIMER:
                    if self.timer_at.get(data) == t:
                        del self.timer_at[data]
                        self._from_agent(t, data, self._agent(data).handle_timer(t))
                elif self.timer_at.get(None) == t:
                    del self.timer_at[None]
                    self._from_coord(t, self.coord.handle_timer(t))
                continue
            if i >= n:
                break
            # all readings at this instant, then the truth at this instant
            j = bisect.bisect_right(ts, st, i)
            if self.vectorised and j - i >= 64 and len(np.unique(ss_np[i:j])) == j - i:
                self._screen(st, ss_np[i:j], vs_np[i:j])
                i = j
            while i < j:
                s = ss[i]
                dev, k = self.src_dev[s]
                out = self._agent(dev).handle_sample(st, k, vs[i])
                if out:
                    self._from_agent(st, dev, out)
                self.truth.update(s, vs[i])
                i += 1
            self.truth.flush(st)
            if i >= next_report:
                self.progress(i, n)
                next_report += n // 10
        # let the coordinator release everything up to the end of the run
        self._from_coord(drain, self.coord.handle_timer(drain))
        return self._result(queries, n, _time.perf_counter() - wall)

    def _screen(self, st, idx, vals):
        """One instant's readings of distinct sources: in-bound ones in bulk, the rest one by one."""
        inside = (vals >= self.lo[idx]) & (vals <= self.hi[idx])
        quiet = idx[inside]
        self.vals[quiet] = vals[inside]
        self.owed[quiet] = True
        self.screened[quiet] += 1
        for s, v in zip(idx[~inside].tolist(), vals[~inside].tolist()):
            dev, k = self.src_dev[s]
            out = self._agent(dev).handle_sample(st, k, v)
            if out:
                self._from_agent(st, dev, out)
        self.truth.update_many(idx, vals)

    def _event_truth(self, ev, queries):
        """A workload event at its time ``t``: the network changes, the truth follows the queries."""
        t = ev["time"]
        if "delay" in ev:
            self.net.update(ev["delay"])
        elif "add_query" in ev:
            q = parse_query(ev["add_query"], self.w.source_ids, kinds=self.protocol.kinds)
            queries[q.id] = q
            self.precisions[q.id] = [(t, q.precision)]
            self.truth.add_query(q, t)
        elif "remove_query" in ev:
            qid = ev["remove_query"]
            self.ended[qid] = (t, self.truth.tracks[qid].timeline if qid in self.truth.tracks else None)
            self.truth.remove_query(qid)
        else:
            sp = ev["set_precision"]
            self.precisions[sp["id"]].append((t, float(sp["precision"])))

    def _event_coord(self, now, ev):
        """The same event at the coordinator, once everything stamped before it has been released."""
        t = ev["time"]
        if "add_query" in ev:
            self._from_coord(now, self.coord.add_query(ev["add_query"], t))
        elif "remove_query" in ev:
            self._from_coord(now, self.coord.remove_query(ev["remove_query"], t))
        elif "set_precision" in ev:
            sp = ev["set_precision"]
            self._from_coord(now, self.coord.set_precision(sp["id"], float(sp["precision"]), t))

    def _result(self, queries, n, elapsed):
        w = self.w
        per_q = {}
        tot_v = tot_m = 0
        tot_vt = 0.0
        by_q = {}
        prob = {}
        ents = {qid: [] for qid in self.truth.entity.tracks}
        sums = {qid: [] for qid in self.truth.summary.tracks}
        for a in self.answers:
            if a["time"] > w.duration or a["time"] >= self.ended.get(a["query"], (math.inf,))[0]:
                continue
            if a["query"] in sums:
                sums[a["query"]].append(a)
            elif a["query"] in ents:
                ents[a["query"]].append((a["time"], a["members"], a["degraded"]))
            else:
                by_q.setdefault(a["query"], []).append((a["time"], a["lo"], a["hi"], a["degraded"]))
                if a.get("guarantee") == "probabilistic":
                    prob[a["query"]] = a["confidence"]
        for qid, q in queries.items():
            if qid in sums:
                per_q[qid] = summary_truth.check(self.truth.summary, qid, sums[qid], w.duration)
                tot_v += per_q[qid]["violations"]
                tot_m += per_q[qid]["precision_misses"]
                continue
            if qid in ents:
                per_q[qid] = entity_truth.check(self.truth.entity.tracks[qid], ents[qid], w.duration)
                tot_v += per_q[qid]["violations"]
                tot_vt += per_q[qid]["violation_time"]
                continue
            end, tl = self.ended.get(qid, (w.duration, None))
            tl = self.truth.tracks[qid].timeline if tl is None else tl
            v, vt, m, dt = truth_mod.check(tl, by_q.get(qid, []), self.precisions[qid], min(w.duration, end))
            widths = [hi - lo for _, lo, hi, _ in by_q.get(qid, []) if hi - lo < float("inf")]
            per_q[qid] = {"answers": len(by_q.get(qid, [])), "violations": v, "violation_time": vt,
                          "precision_misses": m, "degraded_time": dt,
                          "mean_width": sum(widths) / len(widths) if widths else None}
            per_q[qid].update(truth_mod.fidelity(tl, by_q.get(qid, []), w.duration))
            if qid in prob:     # a probabilistic guarantee is measured, not counted as violations
                per_q[qid].update({"guarantee": "probabilistic", "confidence": prob[qid]})
                continue
            tot_v += v
            tot_vt += vt
            tot_m += m
        c = self.counts
        for s, (dev, j) in enumerate(self.src_dev):
            self._agent(dev).stats["samples"] += int(self.screened[s])
        self.screened[:] = 0
        agents = self.agents.values()
        return {
            "workload": w.name, "protocol": w.protocol, "seed": w.seed, "duration": w.duration,
            "sources": len(w.source_ids), "devices": len(self.agents), "samples": n,
            "messages": {"up": c["up"], "down": c["down"]},
            "bytes": {"up": c["bytes_up"], "down": c["bytes_down"]},
            "by_kind": c["by_kind"],
            "reports": sum(a.stats["reports"] for a in agents),
            "probes": sum(a.stats["probes"] for a in agents),
            "violations": tot_v, "violation_time": tot_vt, "precision_misses": tot_m,
            "late": self.coord.stats["late"], "lost": c["lost"], "warmup": w.warmup,
            "protocol_stats": getattr(self.protocol, "stats", None),
            "queries": per_q,
            "params": {"period": w.period, "shrink": w.shrink, "delay_up": w.delay_up,
                       "delay_down": w.delay_down, "jitter": w.jitter, "latency_tolerance": w.latency},
            "runtime_s": elapsed, "samples_per_s": n / elapsed if elapsed > 0 else None,
        }


def run(workload, out=None, answers=None, progress=None):
    """Run a workload; optionally write RESULT.json and ANSWERS.jsonl. Returns the result dict."""
    sim = Simulation(workload, progress=progress)
    result = sim.run()
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
    if answers:
        with open(answers, "w") as fh:
            for a in sim.answers:
                line = dict(a)
                line["guarantee"] = "degraded" if a["degraded"] else a.get(
                    "guarantee", "tolerance" if "members" in a else "interval")
                fh.write(json.dumps(line) + "\n")
    return result
