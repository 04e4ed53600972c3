"""Fleet simulation (DESIGN.md §5): real ``edge.agent.Agent`` devices, the coordinator through the host, ground truth.

Devices are the real agents and the backend is a ``Coordinator`` built and fed by
``backend.host.Host``; everything between them is encoded by the codec and carried by the loop's
network (FIFO per device and direction). Readings are consumed beside the event heap. The default
(screened) run works per event: ``backend.sim.screen`` finds each source's next reading that leaves
its filter's bound, only those go through the agents, and the silent readings in between are
skipped across instants (handed to the agents lazily, to the ground truth in bulk); the scalar run
(``vectorised=False``) gives every reading to its agent and is the tests' oracle: same messages,
answers and agent state. ``run`` runs a workload of any kind (fleet, relay, summary) and writes
RESULT.json and the answers file.
"""
import bisect
import json
import math
import random


from backend import host as host_mod
from backend.answers import answer_json
from backend.coordinator.core.queries import parse_query
from backend.coordinator.precision.regret import Ledger
from backend.sim import result as result_mod, truth as truth_mod
from backend.sim.forced import Forced
from backend.sim.loop import DOWN, UP, Loop
from backend.sim.network import Network
from backend.sim.screen import Screen, bound, metered, models_bound
from backend.sim.sources import outages, samples
from backend.sim.workload import load
from edge.agent import Agent
from edge.core.meter import OWE

BULK = 1 << 16          # readings the ground truth takes in one bulk step at most (bounds its float drift)
OUTAGE, EVENT_TRUTH, EVENT_COORD, REBOOT = "outage", "event-truth", "event-coord", "reboot"


class Simulation(Loop):
    ORDER = dict(Loop.ORDER, **{OUTAGE: 4, EVENT_TRUTH: 5, EVENT_COORD: 6, REBOOT: 7})

    def __init__(self, workload, progress=None, vectorised=True):
        self.w = w = load(workload) if not hasattr(workload, "source_ids") else workload
        host = host_mod.Host({"protocol": w.protocol, "period": w.period, "shrink": w.shrink, "latency": w.latency,
                              "beat": w.beat, "skew": w.faults.get("skew", 0.0), "t0": 0.0, "ack_delay": w.ack_delay,
                              "params": w.protocol_params, "models": w.params.get("models")}, declared=w.source_ids)
        Loop.__init__(self, Network({UP: {"delay": w.delay_up, "jitter": w.jitter},
                                     DOWN: {"delay": w.delay_down, "jitter": w.jitter}},
                                    w.seed, w.warmup, w.faults), host)
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
        self.screen = None              # backend.sim.screen.Screen of the run (vectorised only)
        self.scalar = 0                 # readings that went through their agent, this run
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
        """The agent of ``device`` with every silent reading before ``self.i`` handed over."""
        a = self.agents[device]
        if self.screen is not None:
            for s, j in self.dev_src[device]:
                got = self.screen.hand(s, self.i)
                if got is not None:
                    a.values[j] = got[0]
                    a.stats["samples"] += got[1]
                    if a.meter is not None:
                        a.meter.seen(j, got[1])
                    if a.alt is not None:
                        self._hand_models(a, j, s, got)
        return a

    def _hand_models(self, a, j, s, got):
        """What silent readings change in a device that chooses its filter model (``Chooser.sample``
        and ``handle_sample`` on a reading inside ``models_bound``): the chooser's latest sampling
        times and value, and the lines placed at the latest reading's time."""
        v, d, c = got
        times = self.screen.times[s]
        ch, t = a.alt[j], times[c - 1]
        ch.prev = times[c - 2] if d > 1 else ch.last
        ch.last, ch.value = t, v
        for g in ch.shadows:
            g.at(t)
        a.filters[j].at(t)

    def _bound(self, s):
        """The bound of source ``s``'s filter (``screen.bound``, or ``screen.models_bound`` when its device
        chooses filter models: edge.core.predict); None for a SWAT tree or a segment (edge.core.segment),
        which see every reading, for model choice on a skewed clock (the screen reads true times), and while a
        guard after a report is on (edge.agent: a reading leaving the guard's hull is reported)."""
        dev, j = self.src_dev[s]
        a = self.agents[dev]
        if (a.summaries and j in a.summaries) or (a.segs and j in a.segs) or j in a.guards:
            return None
        if a.alt is not None:
            b = None if dev in self.offset or a.offset else models_bound(a.filters[j], a.alt[j])
        else:
            b = bound(a.filters[j])
        return b if a.meter is None else metered(b, a.meter.shadows[j])

    def from_agent(self, now, device, out):
        if device in self.offline:
            self.lost += len(out)
            out = ()
        Loop.from_agent(self, now, device, out)
        if self.screen is not None:
            for s, _ in self.dev_src[device]:
                self.screen.set_bound(s, self._bound(s), self.i)

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
        old = self.agent(dev)           # the readings so far count in its stats; their values are lost
        new = self.agents[dev] = Agent(dev, old.names, boot=old.boot + 1)
        new.stats = old.stats
        self.reboots += 1
        self.from_agent(t, dev, () if dev in self.offline else new.start(t + self.offset.get(dev, 0.0)))

    # -- readings ---------------------------------------------------------------------------
    def start(self):
        w = self.w
        self.ts_np, self.ss_np, self.vs_np = samples(w)
        self.protocol.workload_samples(w.source_ids, self.ts_np, self.ss_np, self.vs_np)
        self.ts, self.ss, self.vs = self.ts_np.tolist(), self.ss_np.tolist(), self.vs_np.tolist()
        self.i = self.truth_i = 0       # readings consumed by the agents, by the truth (screened runs)
        self.scalar = 0
        if self.vectorised:
            self.screen = Screen(self.ss_np, self.vs_np, len(w.source_ids), self.ts_np)
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
        if w.faults:    # ... and what went missing is found out by then (answers after the end are not checked),
            # also what the last final answers of lag queries stand on (sent up to their lag after the end)
            self.end += self.coord.integrity.horizon() + max([q.extra.get("lag") or 0.0 for q in self.queries.values()]
                                                             + [0.0])
        n = len(self.ts)
        self.next_report = n // 10 if self.progress else n + 1

    def next_sample(self):
        return self.ts[self.i] if self.i < len(self.ts) else math.inf

    def samples(self, st):
        """All readings at instant ``st`` (and, screened, the silent instants after it)."""
        if self.screen is not None:
            self._screened(st)
        else:
            ts, ss, vs = self.ts, self.ss, self.vs
            i = self.i
            j = bisect.bisect_right(ts, st, i)
            while i < j:
                self._scalar(st, i, ss[i], vs[i])
                self.truth.update(ss[i], vs[i])
                i += 1
            self.truth.flush(st)
        if self.i >= self.next_report:
            self.progress(self.i, len(self.ts))
            self.next_report += len(self.ts) // 10

    def _scalar(self, st, k, s, v):
        """Reading ``k`` (source ``s``, value ``v``) through its agent."""
        dev, j = self.src_dev[s]
        self.i = k
        out = self.agent(dev).handle_sample(st + self.offset.get(dev, 0.0), j, v)
        self.i = k + 1
        self.scalar += 1
        sc = self.screen
        if sc is not None:
            sc.handed[s] += 1
            sc.bound[s] = False         # look for its next reading from here (from_agent does, if called)
        if out or self.agents[dev].segs:       # a segment agent's deadline moves with its readings
            self.from_agent(st, dev, out)
        if sc is not None and sc.bound[s] is False:
            sc.set_bound(s, self._bound(s), k + 1)

    def _screened(self, st):
        """Instant ``st``: the readings some source needs looked at go through their agents; then skip
        every following instant up to the next such reading or heap event. The truth follows later."""
        ts, ss, vs, sc = self.ts, self.ss, self.vs, self.screen
        j = bisect.bisect_right(ts, st, self.i)
        while True:
            k = sc.next()
            if k >= j:
                break
            s = ss[k]
            if not sc.silent(s, k, vs[k]):
                self._scalar(st, k, s, vs[k])
        k = sc.next()
        e = bisect.bisect_left(ts, ts[k], j, k) if k < len(ts) else len(ts)
        if self.heap:
            e = bisect.bisect_left(ts, self.heap[0][0], j, e)
        self.i = e

    def _truth_to(self, i):
        """Screened runs: the ground truth takes the readings before ``i`` (an instant boundary) in bulk."""
        ts = self.ts
        while self.truth_i < i:
            a = self.truth_i
            e = min(i, a + BULK)
            if e < i:           # whole instants only
                e = bisect.bisect_left(ts, ts[e], a, e)
                if e == a:
                    e = bisect.bisect_right(ts, ts[a], a, i)
            self.truth.update_range(self.ss_np[a:e], self.vs_np[a:e], self.ts_np[a:e])
            self.truth_i = e

    # -- workload events ---------------------------------------------------------------------
    def event_truth(self, t, ev):
        """A workload event at its time ``t``: the network changes, the truth follows the queries."""
        if self.screen is not None:
            self._truth_to(self.i)
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

    def regret(self):
        """The exact no-regret ledger at the end (precision.regret): (real − the deadband the devices metered, in
        filter messages as the backend counted them; the promise: the loan plus edge.core.meter.OWE per source
        whose device departed from deadband's model), or None under a rule without one."""
        led = getattr(self.protocol, "ledger", None)
        if not isinstance(led, Ledger):
            return None
        owe = OWE * sum(len(a.filters) for a in self.agents.values() if a.meter and a.alt)
        return led.gap() + led.pending(), self.protocol._hard() + owe

    def result(self, elapsed):
        if self.screen is not None:
            self._truth_to(len(self.ts))
        self.i = len(self.ts)
        for dev in self.agents:
            self.agent(dev)
        self.screened = len(self.ts) - self.scalar
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
                fh.write(answer_json(a) + "\n")
    return res
