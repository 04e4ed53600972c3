"""Fleet simulation (DESIGN.md §5): real ``edge.agent.Agent`` devices, the coordinator through the host, ground truth.

Devices are the real agents and the backend is a ``Coordinator`` built and fed by
``backend.host.Host``; everything between them is encoded by the codec and carried by the loop's
network (FIFO per device and direction). Readings are consumed per instant beside the event heap;
a vectorised path screens one instant's in-bound readings of many sources in bulk (numpy mirrors
of every agent filter), cross-checked against the scalar agents by the tests. ``run`` runs a
workload of any kind (fleet, relay, summary) and writes RESULT.json and the answers file.
"""
import bisect
import json
import math
import random

import numpy as np

from backend import host as host_mod
from backend.coordinator.core.queries import parse_query
from backend.sim import result as result_mod, truth as truth_mod
from backend.sim.forced import Forced
from backend.sim.loop import DOWN, UP, Loop
from backend.sim.network import Network
from backend.sim.sources import outages, samples
from backend.sim.workload import load
from edge.agent import Agent

OUTAGE, EVENT_TRUTH, EVENT_COORD, REBOOT = "outage", "event-truth", "event-coord", "reboot"


class Simulation(Loop):
    ORDER = dict(Loop.ORDER, **{OUTAGE: 4, EVENT_TRUTH: 5, EVENT_COORD: 6, REBOOT: 7})

    def __init__(self, workload, progress=None, vectorised=True):
        self.w = w = load(workload) if not hasattr(workload, "source_ids") else workload
        host = host_mod.Host({"protocol": w.protocol, "period": w.period, "shrink": w.shrink, "latency": w.latency,
                              "beat": w.beat, "skew": w.faults.get("skew", 0.0), "t0": 0.0,
                              "params": w.protocol_params}, declared=w.source_ids)
        Loop.__init__(self, Network({UP: {"delay": w.delay_up, "jitter": w.jitter},
                                     DOWN: {"delay": w.delay_down, "jitter": w.jitter}},
                                    random.Random(w.seed + 1).uniform, w.warmup,
                                    w.faults, random.Random(w.seed + 2)), host)
        self.protocol = self.coord.protocol
        self.handlers.update({OUTAGE: self.outage, EVENT_TRUTH: self.event_truth, EVENT_COORD: self.event_coord,
                              REBOOT: self.reboot})
        self.src_dev = []
        for dev, ids in w.devices():
            self.agents[dev] = Agent(dev, ids, boot=1)
            for j, _ in enumerate(ids):
                self.src_dev.append((dev, j))
        skew = w.faults.get("skew", 0.0)
        if skew:        # each device's clock runs at a fixed offset in [-skew, skew]
            rng = random.Random(w.seed + 3)
            self.offset = {dev: rng.uniform(-skew, skew) for dev in self.agents}
        self.reboots = 0
        self.forced = None          # what the faults force to be unknowable (issue #20)
        if w.faults:
            self.forced = Forced(w.latency, w.duration, {dev: list(ids) for dev, ids in w.devices()})
            self.watch = self.forced.uplink
        self.truth = truth_mod.Truth(w.source_ids)
        # Vectorised screening (DESIGN.md §5): numpy mirrors of every agent filter let a whole
        # instant's in-bound readings skip the scalar agent; anything else takes the scalar path.
        n = len(w.source_ids)
        self.lo = np.full(n, np.inf)
        self.hi = np.full(n, -np.inf)
        self.vals = np.zeros(n)
        self.owed = np.zeros(n, dtype=bool)      # vals[s] not yet copied into its agent
        self.screened = 0                        # readings that took the vectorised path, this run
        self.pending = np.zeros(n, dtype=np.int64)   # ... not yet added to their agent's sample count
        self.dev_src = {}
        for s, (dev, j) in enumerate(self.src_dev):
            self.dev_src.setdefault(dev, []).append((s, j))
        self.progress = progress
        self.vectorised = vectorised
        self.lost = 0
        self.offline = set()            # devices in an outage (Zhu §1.2): nothing in or out
        self.queries = {}
        self.precisions = {}    # query id -> [(t, δ)]
        self.ended = {}         # query id -> (time it was removed, its truth timeline)

    # -- agents and the network -----------------------------------------------------------
    def agent(self, device):
        """The agent of ``device`` with every screened reading handed over."""
        a = self.agents[device]
        for s, j in self.dev_src[device]:
            if self.owed[s]:
                a.values[j] = float(self.vals[s])
                self.owed[s] = False
        return a

    def from_agent(self, now, device, out):
        if device in self.offline:
            self.lost += len(out)
            out = ()
        Loop.from_agent(self, now, device, out)
        a = self.agents[device]
        for s, j in self.dev_src[device]:
            f = a.filters[j]
            if f.center is None or f.cons or (a.summaries and j in a.summaries):   # SWAT trees see every reading
                self.lo[s], self.hi[s] = np.inf, -np.inf     # always take the scalar path
            else:
                self.lo[s], self.hi[s] = f.lo, f.hi

    def deliver_down(self, t, data):
        if data[0] in self.offline:
            self.lost += 1
        else:
            Loop.deliver_down(self, t, data)

    def outage(self, t, data):
        dev, starts = data
        if starts:      # the broker publishes the Last Will; on return the device is born again
            self.offline.add(dev)
            self.send(t, UP, dev, self.agents[dev].will())
        else:
            self.offline.discard(dev)
            self.from_agent(t, dev, self.agent(dev).start(t + self.offset.get(dev, 0.0)))

    def reboot(self, t, dev):
        """A device reboots: a fresh agent (next boot number) that has lost its filters and readings."""
        old = self.agents[dev]
        new = self.agents[dev] = Agent(dev, old.names, boot=old.boot + 1)
        new.stats = old.stats
        for s, _ in self.dev_src[dev]:
            self.owed[s] = False
        self.reboots += 1
        self.from_agent(t, dev, () if dev in self.offline else new.start(t + self.offset.get(dev, 0.0)))

    # -- readings ---------------------------------------------------------------------------
    def start(self):
        w = self.w
        self.ts_np, self.ss_np, self.vs_np = samples(w)
        self.protocol.workload_samples(w.source_ids, self.ts_np, self.ss_np, self.vs_np)
        self.ts, self.ss, self.vs = self.ts_np.tolist(), self.ss_np.tolist(), self.vs_np.tolist()
        self.i = 0
        self.screened = 0
        for spec in w.queries:
            q = parse_query(spec, w.source_ids, kinds=self.protocol.kinds)
            self.queries[q.id] = q
            self.precisions[q.id] = [(0.0, q.precision)]
            self.truth.add_query(q, 0.0)
            self.from_host(0.0, self.host.spec(0.0, q.id, spec))
        for ev in w.events:
            self.push(ev["time"], EVENT_TRUTH, ev)
            self.push(ev["time"] + self.coord.latency, EVENT_COORD, ev)
        for dev, a in self.agents.items():
            self.from_agent(0.0, dev, a.start(self.offset.get(dev, 0.0)))
        rate = w.faults.get("reboots", 0.0) / 3600.0
        if rate:        # Poisson reboots per device
            rng = random.Random(w.seed + 4)
            for dev in self.agents:
                t = rng.expovariate(rate)
                while t < w.duration:
                    self.push(t, REBOOT, dev)
                    t += rng.expovariate(rate)
        for dev, spans in outages(w).items():
            for start, stop in spans:
                self.push(start, OUTAGE, (dev, True))
                self.push(stop, OUTAGE, (dev, False))
        self.end = w.duration + max(w.latency, self.coord.latency)   # deliveries of readings up to the end arrive by then
        if w.faults:    # ... and what went missing is found out by then (answers after the end are not checked)
            self.end += self.coord.integrity.horizon()
        n = len(self.ts)
        self.next_report = n // 10 if self.progress else n + 1

    def next_sample(self):
        return self.ts[self.i] if self.i < len(self.ts) else math.inf

    def samples(self, st):
        """All readings at instant ``st``, then the truth at this instant."""
        ts, ss, vs = self.ts, self.ss, self.vs
        i = self.i
        j = bisect.bisect_right(ts, st, i)
        if self.vectorised and j - i >= 64 and len(np.unique(self.ss_np[i:j])) == j - i:
            self._screen(st, self.ss_np[i:j], self.vs_np[i:j])
            i = j
        while i < j:
            s = ss[i]
            dev, k = self.src_dev[s]
            out = self.agent(dev).handle_sample(st + self.offset.get(dev, 0.0), k, vs[i])
            if out:
                self.from_agent(st, dev, out)
            self.truth.update(s, vs[i])
            i += 1
        self.i = i
        self.truth.flush(st)
        if i >= self.next_report:
            self.progress(i, len(ts))
            self.next_report += len(ts) // 10

    def _screen(self, st, idx, vals):
        """One instant's readings of distinct sources: in-bound ones in bulk, the rest one by one."""
        inside = (vals >= self.lo[idx]) & (vals <= self.hi[idx])
        quiet = idx[inside]
        self.vals[quiet] = vals[inside]
        self.owed[quiet] = True
        self.pending[quiet] += 1
        self.screened += len(quiet)
        for s, v in zip(idx[~inside].tolist(), vals[~inside].tolist()):
            dev, k = self.src_dev[s]
            out = self.agent(dev).handle_sample(st + self.offset.get(dev, 0.0), k, v)
            if out:
                self.from_agent(st, dev, out)
        self.truth.update_many(idx, vals)

    # -- workload events ---------------------------------------------------------------------
    def event_truth(self, t, ev):
        """A workload event at its time ``t``: the network changes, the truth follows the queries."""
        if "delay" in ev:
            d = ev["delay"]
            self.net.set(UP, d.get("up"), d.get("jitter"))
            self.net.set(DOWN, d.get("down"), d.get("jitter"))
        elif "add_query" in ev:
            q = parse_query(ev["add_query"], self.w.source_ids, kinds=self.protocol.kinds)
            self.queries[q.id] = q
            self.precisions[q.id] = [(t, q.precision)]
            self.truth.add_query(q, t)
        elif "remove_query" in ev:
            qid = ev["remove_query"]
            self.ended[qid] = (t, self.truth.tracks[qid].timeline if qid in self.truth.tracks else None)
            self.truth.remove_query(qid)
        else:
            sp = ev["set_precision"]
            self.precisions[sp["id"]].append((t, float(sp["precision"])))

    def event_coord(self, now, ev):
        """The same event at the coordinator, through the host's spec inbox, once everything
        stamped before it has been released (the host stamps it at ``now - λ``)."""
        self.from_host(now, self.host.timer(now))
        if "add_query" in ev:
            self.from_host(now, self.host.spec(now, ev["add_query"]["id"], ev["add_query"]))
        elif "remove_query" in ev:
            self.from_host(now, self.host.spec(now, ev["remove_query"], None))
        elif "set_precision" in ev:
            sp = ev["set_precision"]
            self.from_host(now, self.host.set_precision(now, sp["id"], float(sp["precision"])))

    def result(self, elapsed):
        for s, (dev, _) in enumerate(self.src_dev):
            self.agent(dev).stats["samples"] += int(self.pending[s])
        self.pending[:] = 0
        return result_mod.fleet(self, elapsed)


def simulation(workload, progress=None):
    """The simulation of a workload (path, dict or loaded) of any kind."""
    w = workload if hasattr(workload, "kind") else load(workload)
    if w.kind == "relay":
        from backend.sim.relay import RelaySimulation
        return RelaySimulation(w)
    if w.kind == "summary":
        from backend.sim.summary import SummarySimulation
        return SummarySimulation(w)
    return Simulation(w, progress=progress)


def run(workload, out=None, answers=None, progress=None):
    """Run a workload; optionally write RESULT.json and ANSWERS.jsonl. Returns the result dict."""
    sim = simulation(workload, progress=progress)
    res = sim.run()
    if out:
        with open(out, "w") as fh:
            json.dump(res, fh, indent=2)
    if answers:
        with open(answers, "w") as fh:
            for a in sim.answers:
                fh.write(host_mod.answer_json(a) + "\n")
    return res
