"""Relay topology on the simulator loop (Zhang et al. 2005 §3.1, §6): sensors -> relays -> backend, counted per hop.

Sensors emit integer items (a Zipf stream, §6.1.2); each item travels as one ``blob`` on the extra
hop ``hop1`` to its relay, a real ``edge.core.relay.RelayNode`` that the loop runs like any agent;
the relay's raw items and bodies travel up to the coordinator (a relay protocol, through the host),
whose querying-metadata goes back down. Every answer is checked against the exact items
(``RelayTruth``): the truth must lie in [lo, hi], and aligned COUNT/SUM answers must be within the
requested relative error η (Theorems 1-2).

Workload keys: ``sources: {"generator": "zipf", "items", "domain", "skew", "sensors", "rate",
"drift"}``, ``relays: {"count", "h", "m", "support", "fdi", "delta", "span", "lag", "seed",
"sum_rule"}``, ``network: {"delay", "jitter", "hop1", "hop1_jitter"}``, ``protocol``, ``queries``.
"""
import numpy as np

from backend import host as host_mod
from backend.coordinator.core.queries import QueryError, parse_query
from backend.coordinator.protocols import PROTOCOLS
from backend.sim.loop import COORD, DOWN, TIMER, UP, Loop
from backend.sim.network import Network
from backend.sim.spec import Base, WorkloadError, integer, keys, number, query_keys, read
from edge.core import codec
from edge.core.relay import RelayNode, TAG_RAW, encode_raw

HOP1 = "hop1"
TOP = ("name", "seed", "protocol", "sources", "relays", "network", "queries")
RELAY_KEYS = ("count", "h", "m", "support", "fdi", "delta", "span", "lag", "seed", "sum_rule")
SOURCE_KEYS = ("generator", "items", "domain", "skew", "sensors", "rate", "drift")


class RelayWorkload(Base):
    kind, KEYS, name = "relay", TOP, "relay"

    def __init__(self, raw):
        Base.__init__(self, raw)
        self.protocol = raw.get("protocol", "relay")
        cls = PROTOCOLS.get(self.protocol)
        if getattr(cls, "topology", None) != "relay":
            raise WorkloadError("protocol must be a relay protocol (%s), got %r" % (
                ", ".join(sorted(n for n, c in PROTOCOLS.items() if getattr(c, "topology", None) == "relay")),
                self.protocol))
        src = raw.get("sources")
        if not isinstance(src, dict) or src.get("generator") != "zipf":
            raise WorkloadError('sources must be {"generator": "zipf", "items": N, "domain": D, ...}')
        keys(src, SOURCE_KEYS, "sources")
        self.items = integer(src, "items", 100000, "sources")
        self.domain = integer(src, "domain", 10000, "sources", hi=2 ** 31 - 2)
        self.skew = number(src, "skew", 1.0, "sources", lo=0.0)
        self.sensors = integer(src, "sensors", 10, "sources")
        self.rate = number(src, "rate", 1.0, "sources", positive=True)
        self.drift = integer(src, "drift", 0, "sources", lo=0)
        rel = keys(raw.get("relays", {}), RELAY_KEYS, "relays")
        self.relays = integer(rel, "count", 1, "relays")
        net = keys(raw.get("network", {}), ("delay", "jitter", "hop1", "hop1_jitter"), "network")
        self.delay = number(net, "delay", 0.0, "network", lo=0.0)
        self.jitter = number(net, "jitter", 0.0, "network", lo=0.0)
        self.hop1 = number(net, "hop1", self.delay, "network", lo=0.0)
        self.hop1_jitter = number(net, "hop1_jitter", self.jitter, "network", lo=0.0)
        self.duration = self.items / self.rate
        self.relay_ids = ["r%d" % i for i in range(self.relays)]
        self.relay_params = {"h": 30, "m": 30, "support": 0.005, "fdi": 300, "delta": 0.1, "span": 0.0,
                             "lag": self.hop1 + self.hop1_jitter, "seed": 1, "sum_rule": "derived"}
        self.relay_params.update({k: v for k, v in rel.items() if k != "count"})
        self.relay_params.update(cls.relay_params)
        self.relay_params["domain"] = (1, self.domain)
        try:
            RelayNode("check", **self.relay_params)
        except ValueError as e:
            raise WorkloadError("relays: %s" % e)
        qs = raw.get("queries", [])
        if not isinstance(qs, list):
            raise WorkloadError("queries must be a list")
        self.queries = []
        for n, spec in enumerate(qs):
            query_keys(spec, "queries[%d]" % n, topology="relay")
            try:
                q = parse_query(spec, set(self.relay_ids), kinds=cls.kinds)
                cls.window(q)
            except QueryError as e:
                raise WorkloadError(str(e))
            if any(q.id == o.id for o in self.queries):
                raise WorkloadError("query id %s repeats" % q.id)
            self.queries.append(q)


def items(w):
    """(times, items, sensors): a Zipf stream over 1..domain, ranks shuffled (again every ``drift`` items)."""
    rng = np.random.default_rng(w.seed)
    p = 1.0 / np.arange(1, w.domain + 1) ** w.skew
    ranks = rng.choice(w.domain, size=w.items, p=p / p.sum())
    block = w.drift or w.items
    ks = np.empty(w.items, dtype=np.int64)
    for s in range(0, w.items, block):
        perm = rng.permutation(w.domain) + 1
        ks[s:s + block] = perm[ranks[s:s + block]]
    ts = np.arange(1, w.items + 1) / w.rate
    return ts, ks, rng.integers(0, w.sensors, size=w.items)


class RelayTruth:
    """Exact answers over the items each relay received, for any window (qb, upto]."""

    def __init__(self, w, ts, ks, sensors):
        rel = sensors % w.relays
        self.by = {}
        for i, rid in enumerate(w.relay_ids):
            m = rel == i
            self.by[rid] = (ts[m], ks[m])

    def value(self, q, qb, upto):
        if q.kind == "join":
            return self._join(q, qb, upto)
        tot = 0.0
        for s in q.sources:
            t, k = self.by[s]
            sel = k[(t > qb) & (t <= upto)]
            if q.range is not None:
                sel = sel[(sel >= q.range[0]) & (sel <= q.range[1])]
            tot += float(sel.sum()) if q.kind == "sum" else float(len(sel))
        return tot

    def _join(self, q, qb, upto):
        T = float(q.extra["span"])
        (ta, ka), (tb, kb) = self.by[q.sources[0]], self.by[q.sources[1]]
        ma, mb = (ta > qb) & (ta <= upto), (tb > qb) & (tb <= upto)
        ta, ka, tb, kb = ta[ma], ka[ma], tb[mb], kb[mb]
        scale = 4.0 * (max(float(ta.max(initial=0)), float(tb.max(initial=0))) + T + 1)
        keyb = np.sort(kb * scale + tb)
        keya = ka * scale + ta
        return float((np.searchsorted(keyb, keya + T, "right") - np.searchsorted(keyb, keya - T, "left")).sum())


class RelaySimulation(Loop):
    ORDER = {HOP1: 0, TIMER: 1, UP: 2, DOWN: 3, COORD: 4}

    def __init__(self, workload):
        self.w = w = workload if isinstance(workload, RelayWorkload) else \
            RelayWorkload(workload if isinstance(workload, dict) else read(workload))
        host = host_mod.Host({"protocol": w.protocol, "period": w.duration + 1.0, "shrink": 0.0,
                              "latency": w.delay + w.jitter, "t0": 0.0}, declared=w.relay_ids)
        Loop.__init__(self, Network({HOP1: {"delay": w.hop1, "jitter": w.hop1_jitter},
                                     UP: {"delay": w.delay, "jitter": w.jitter},
                                     DOWN: {"delay": w.delay, "jitter": w.jitter}},
                                    w.seed), host)
        self.protocol = self.coord.protocol
        self.handlers[HOP1] = self.deliver_hop1
        self.agents = {rid: RelayNode(rid, boot=1, **w.relay_params) for rid in w.relay_ids}
        self.tags = {}

    def from_agent(self, now, rid, out):
        for _, payload in out:
            if payload[1] == codec.SCHEMAS["blob"][0]:
                tag = codec.decode(payload)[1]["tag"]
                self.tags[tag] = self.tags.get(tag, 0) + 1
        Loop.from_agent(self, now, rid, out)

    def deliver_hop1(self, t, data):
        self.from_agent(t, data[0], self.agents[data[0]].handle_sensor(t, data[1]))

    def start(self):
        w = self.w
        self.stream = ts, ks, sensors = items(w)
        for q in w.queries:
            self.from_host(0.0, self.host.spec(0.0, q.id, q.spec()))
        for rid, r in self.agents.items():
            self.from_agent(0.0, rid, r.start(0.0))
        for i in range(w.items):
            rid = w.relay_ids[int(sensors[i]) % w.relays]
            payload = codec.encode("blob", {"src": 0, "seq": i + 1, "t": float(ts[i]), "tag": TAG_RAW,
                                            "data": encode_raw(int(ks[i]))})
            self.send(float(ts[i]), HOP1, rid, payload, link=("s%d" % sensors[i], rid))
        self.end = w.duration + w.relay_params["lag"] + 2 * (w.delay + w.jitter) + 1.0

    def result(self, elapsed):
        w = self.w
        truth = RelayTruth(w, *self.stream)
        queries = {q.id: q for q in w.queries}
        per_q = {}
        viol = misses = 0
        for a in self.answers:
            q = queries[a["query"]]
            qb = self.protocol.window(q)[0]
            exact = truth.value(q, qb, a["through"]) if a["through"] > qb else 0.0
            a["exact"] = exact
            r = per_q.setdefault(q.id, {"answers": 0, "violations": 0, "theorem_misses": 0, "final": None})
            r["answers"] += 1
            tol = 1e-6 * max(1.0, abs(exact))
            if not (a["lo"] - tol <= exact <= a["hi"] + tol):
                r["violations"] += 1
                viol += 1
            eta = q.extra.get("error", 0.01)
            if (q.kind in ("count", "sum") and q.range is None and a["aligned"]
                    and abs(a["estimate"] - exact) > eta * exact + tol):
                r["theorem_misses"] += 1
                misses += 1
            if a["final"]:
                r["final"] = {"estimate": a["estimate"], "lo": a["lo"], "hi": a["hi"], "exact": exact,
                              "error_bound": a["error_bound"],
                              "relative_error": abs(a["estimate"] - exact) / exact if exact else 0.0}
        st = {k: sum(r.stats[k] for r in self.agents.values())
              for k in ("items", "raw", "filtered", "prb", "crb", "late", "lifetimes")}
        nrd = st["items"]
        m, b = self.net.messages, self.net.bytes
        return {
            "kind": "relay", "workload": w.name, "protocol": w.protocol, "seed": w.seed, "items": w.items,
            "relays": w.relays,
            "relay_params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in w.relay_params.items()},
            "messages": {"hop1": m[HOP1], "up": m[UP], "down": m[DOWN], "backend": m[UP] + m[DOWN]},
            "bytes": {"hop1": b[HOP1], "up": b[UP], "down": b[DOWN]},
            "blobs_by_tag": {str(k): v for k, v in sorted(self.tags.items())},
            "relay": st,
            # the paper's figure: (RFI - FB - CB) / NRD
            "reduced_cost": (st["filtered"] - st["prb"] - st["crb"]) / nrd if nrd else 0.0,
            "violations": viol, "theorem_misses": misses, "late": st["late"] + self.coord.stats["late"],
            "bad_messages": self.coord.stats["bad_messages"],
            "queries": per_q, "runtime_s": elapsed,
        }
