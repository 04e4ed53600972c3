"""Relay topology simulator (Zhang et al. 2005 §3.1, §6): sensors -> relays -> backend, messages counted per hop.

Sensors emit integer items (a Zipf stream, §6.1.2); each item travels as one ``blob`` (hop 1) to its
relay, a real ``edge.core.relay.RelayNode``; the relay's raw items and bodies travel as ``blob``
messages (hop 2) to a real ``Coordinator`` running a relay protocol, whose querying-metadata goes back
down. Every answer is checked against the exact items: the truth must lie in [lo, hi], and aligned
COUNT/SUM answers must be within the requested relative error η (Theorems 1-2).

Workload keys: ``sources: {"generator": "zipf", "items", "domain", "skew", "sensors", "rate",
"drift"}``, ``relays: {"count", "h", "m", "support", "fdi", "delta", "span", "lag", "seed",
"sum_rule"}``, ``network: {"delay", "jitter", "hop1", "hop1_jitter"}``, ``protocol``, ``queries``.
"""
import heapq
import json
import math
import time as _time

import numpy as np

from backend.coordinator.core.coordinator import Coordinator
from backend.coordinator.protocols import PROTOCOLS, make
from backend.coordinator.core.queries import QueryError, parse_query
from backend.sim.workload import WorkloadError, _num, _read
from edge.core import codec
from edge.core.relay import RelayNode, TAG_RAW, encode_raw

_HOP1, _RELAY_TIMER, _UP, _DOWN, _COORD_TIMER = 0, 1, 2, 3, 4
_RELAY_KEYS = {"count", "h", "m", "support", "fdi", "delta", "span", "lag", "seed", "sum_rule"}
_SOURCE_KEYS = {"generator", "items", "domain", "skew", "sensors", "rate", "drift"}


def _int(d, key, default, where, lo=1):
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise WorkloadError("%s.%s must be an integer >= %d, got %r" % (where, key, lo, v))
    return v


def is_relay_workload(raw):
    """True when a workload dict is for the relay topology (a ``relays`` key or a relay protocol)."""
    cls = PROTOCOLS.get(raw.get("protocol")) if isinstance(raw, dict) else None
    return isinstance(raw, dict) and ("relays" in raw or getattr(cls, "topology", None) == "relay")


class RelayWorkload:
    def __init__(self, raw):
        if not isinstance(raw, dict):
            raise WorkloadError("a workload must be a JSON/YAML object")
        self.raw = raw
        self.name = str(raw.get("name", "relay"))
        self.seed = _int(raw, "seed", 0, "workload", lo=0)
        self.protocol = raw.get("protocol", "relay")
        cls = PROTOCOLS.get(self.protocol)
        if getattr(cls, "topology", None) != "relay":
            raise WorkloadError("protocol must be a relay protocol (%s), got %r" % (
                ", ".join(sorted(n for n, c in PROTOCOLS.items() if getattr(c, "topology", None) == "relay")),
                self.protocol))
        src = raw.get("sources")
        if not isinstance(src, dict) or src.get("generator") != "zipf":
            raise WorkloadError('sources must be {"generator": "zipf", "items": N, "domain": D, ...}')
        unknown = set(src) - _SOURCE_KEYS
        if unknown:
            raise WorkloadError("sources: unknown keys %s" % ", ".join(sorted(unknown)))
        self.items = _int(src, "items", 100000, "sources")
        self.domain = _int(src, "domain", 10000, "sources")
        if self.domain > 2 ** 31 - 2:
            raise WorkloadError("sources.domain must be below 2^31 - 1")
        self.skew = _num(src, "skew", 1.0, "sources", lo=0.0)
        self.sensors = _int(src, "sensors", 10, "sources")
        self.rate = _num(src, "rate", 1.0, "sources", positive=True)
        self.drift = _int(src, "drift", 0, "sources", lo=0)
        rel = raw.get("relays", {})
        if not isinstance(rel, dict):
            raise WorkloadError("relays must be an object")
        unknown = set(rel) - _RELAY_KEYS
        if unknown:
            raise WorkloadError("relays: unknown keys %s" % ", ".join(sorted(unknown)))
        self.relays = _int(rel, "count", 1, "relays")
        net = raw.get("network", {})
        if not isinstance(net, dict):
            raise WorkloadError("network must be an object")
        self.delay = _num(net, "delay", 0.0, "network", lo=0.0)
        self.jitter = _num(net, "jitter", 0.0, "network", lo=0.0)
        self.hop1 = _num(net, "hop1", self.delay, "network", lo=0.0)
        self.hop1_jitter = _num(net, "hop1_jitter", self.jitter, "network", lo=0.0)
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
        for spec in qs:
            try:
                q = parse_query(spec, set(self.relay_ids), kinds=cls.kinds)
                cls.window(q)
            except QueryError as e:
                raise WorkloadError(str(e))
            if any(q.id == o.id for o in self.queries):
                raise WorkloadError("query id %s repeats" % q.id)
            self.queries.append(q)


def load(source):
    if isinstance(source, dict):
        return RelayWorkload(source)
    return RelayWorkload(_read(source))


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


class Truth:
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


class RelaySimulation:
    def __init__(self, workload):
        self.w = w = workload if isinstance(workload, RelayWorkload) else load(workload)
        self.protocol = make(w.protocol)
        self.coord = Coordinator(self.protocol, period=w.duration + 1.0, latency=w.delay + w.jitter)
        self.coord.declare_sources(w.relay_ids)
        self.relays = {rid: RelayNode(rid, boot=1, **w.relay_params) for rid in w.relay_ids}
        self.heap = []
        self.n = 0
        self.fifo = {}
        self.timer_at = {}
        self.answers = []
        self.jit = np.random.default_rng(w.seed + 1)
        self.hops = {"hop1": [0, 0], "up": [0, 0], "down": [0, 0]}
        self.tags = {}

    def _push(self, t, kind, data):
        self.n += 1
        heapq.heappush(self.heap, (t, kind, self.n, data))

    def _send(self, now, hop, link, payload, delay, jitter, kind):
        if jitter:
            delay += float(self.jit.uniform(0.0, jitter))
        at = max(now + delay, self.fifo.get(link, now))
        self.fifo[link] = at
        self.hops[hop][0] += 1
        self.hops[hop][1] += len(payload)
        self._push(at, kind, (link[1], payload))

    def _from_relay(self, now, rid, out):
        w = self.w
        for _, payload in out:
            if payload[1] == codec.SCHEMAS["blob"][0]:
                tag = codec.decode(payload)[1]["tag"]
                self.tags[tag] = self.tags.get(tag, 0) + 1
            self._send(now, "up", ("up", rid), payload, w.delay, w.jitter, _UP)
        t = self.relays[rid].next_deadline()
        if t is not None and self.timer_at.get(rid) != t:
            self.timer_at[rid] = t
            self._push(t, _RELAY_TIMER, rid)

    def _from_coord(self, now, actions):
        w = self.w
        for a in actions:
            if a[0] == "down":
                self._send(now, "down", ("down", a[1]), a[2], w.delay, w.jitter, _DOWN)
            else:
                self.answers.append(a[1])
        t = self.coord.next_deadline()
        if self.timer_at.get(None) != t:
            self.timer_at[None] = t
            self._push(t, _COORD_TIMER, None)

    def run(self):
        w = self.w
        wall = _time.perf_counter()
        ts, ks, sensors = items(w)
        for q in w.queries:
            self._from_coord(0.0, self.coord.add_query(q.spec(), 0.0))
        for rid, r in self.relays.items():
            self._from_relay(0.0, rid, r.start(0.0))
        for i in range(w.items):
            rid = w.relay_ids[int(sensors[i]) % w.relays]
            payload = codec.encode("blob", {"src": 0, "seq": i + 1, "t": float(ts[i]), "tag": TAG_RAW,
                                            "data": encode_raw(int(ks[i]))})
            self._send(float(ts[i]), "hop1", ("s%d" % sensors[i], rid), payload, w.hop1, w.hop1_jitter, _HOP1)
        end = w.duration + w.relay_params["lag"] + 2 * (w.delay + w.jitter) + 1.0
        heap = self.heap
        while heap:
            t, kind, _, data = heapq.heappop(heap)
            if t > end:
                break
            if kind == _HOP1:
                self._from_relay(t, data[0], self.relays[data[0]].handle_sensor(t, data[1]))
            elif kind == _RELAY_TIMER:
                if self.timer_at.get(data) == t:
                    del self.timer_at[data]
                    self._from_relay(t, data, self.relays[data].handle_timer(t))
            elif kind == _UP:
                self._from_coord(t, self.coord.handle_uplink(t, data[0], data[1]))
            elif kind == _DOWN:
                self._from_relay(t, data[0], self.relays[data[0]].handle_message(t, data[1]))
            elif self.timer_at.get(None) == t:
                del self.timer_at[None]
                self._from_coord(t, self.coord.handle_timer(t))
        self._from_coord(end, self.coord.handle_timer(end))
        return self._result(Truth(w, ts, ks, sensors), _time.perf_counter() - wall)

    def _result(self, truth, elapsed):
        w = self.w
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
        st = {k: sum(r.stats[k] for r in self.relays.values()) for k in ("items", "raw", "filtered", "prb", "crb", "late", "lifetimes")}
        nrd = st["items"]
        h = self.hops
        return {
            "workload": w.name, "protocol": w.protocol, "seed": w.seed, "items": w.items, "relays": w.relays,
            "relay_params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in w.relay_params.items()},
            "messages": {"hop1": h["hop1"][0], "up": h["up"][0], "down": h["down"][0],
                         "backend": h["up"][0] + h["down"][0]},
            "bytes": {"hop1": h["hop1"][1], "up": h["up"][1], "down": h["down"][1]},
            "blobs_by_tag": {str(k): v for k, v in sorted(self.tags.items())},
            "relay": st,
            # the paper's figure: (RFI - FB - CB) / NRD
            "reduced_cost": (st["filtered"] - st["prb"] - st["crb"]) / nrd if nrd else 0.0,
            "violations": viol, "theorem_misses": misses, "late": st["late"] + self.coord.stats["late"],
            "bad_messages": self.coord.stats["bad_messages"],
            "queries": per_q, "runtime_s": elapsed,
        }


def run(workload, out=None, answers=None):
    """Run a relay workload; optionally write RESULT.json and ANSWERS.jsonl. Returns the result dict."""
    sim = RelaySimulation(workload)
    result = sim.run()
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
    if answers:
        with open(answers, "w") as fh:
            for a in sim.answers:
                line = dict(a)
                line["guarantee"] = "interval" if math.isfinite(a["hi"]) else "lower-bound"
                fh.write(json.dumps(line) + "\n")
    return result


def raw(path):
    """The workload dict in file ``path`` (WorkloadError if missing or unreadable)."""
    import os
    if not os.path.exists(path):
        raise WorkloadError("workload file %s does not exist" % path)
    return _read(path)


def cmd_sim(args):
    """``quietfleet sim`` for relay workloads."""
    import sys
    try:
        spec = dict(raw(args.workload))
        if args.protocol:
            spec["protocol"] = args.protocol
        if args.seed is not None:
            spec["seed"] = args.seed
        w = load(spec)
    except WorkloadError as e:
        print("quietfleet sim: %s" % e, file=sys.stderr)
        return 2
    res = run(w, out=args.out, answers=args.answers)
    print("%s: %d items, %d hop-1 / %d backend messages, reduced cost %.3f, %d violations, %d theorem misses" % (
        res["protocol"], res["items"], res["messages"]["hop1"], res["messages"]["backend"], res["reduced_cost"],
        res["violations"], res["theorem_misses"]))
    return 0 if res["violations"] == 0 and res["theorem_misses"] == 0 else 1
