"""Workload files for the simulator (DESIGN.md §5): sources, queries, protocol, network, seed, events.

``load(path_or_dict)`` validates everything up front and raises ``WorkloadError`` with a message
that names the offending key. ``samples(workload)`` materialises the source streams as arrays
``(time, source_index, value)`` sorted by time; generators follow the papers' synthetic setups.
"""
import csv
import json
import math
import os

import numpy as np

from backend.coordinator.core.queries import QueryError, parse_query


class WorkloadError(ValueError):
    """A workload that cannot be run; the message names the key at fault."""


GENERATORS = ("random_walk", "uniform", "brownian")


def _num(d, key, default, where, lo=None, positive=False):
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise WorkloadError("%s.%s must be a finite number, got %r" % (where, key, v))
    if positive and v <= 0:
        raise WorkloadError("%s.%s must be > 0, got %r" % (where, key, v))
    if lo is not None and v < lo:
        raise WorkloadError("%s.%s must be >= %s, got %r" % (where, key, lo, v))
    return float(v)


def _pair(d, key, default, where):
    v = d.get(key, default)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v, v]
    if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v) or v[1] < v[0]:
        raise WorkloadError("%s.%s must be a number or [lo, hi] with lo <= hi, got %r" % (where, key, v))
    return float(v[0]), float(v[1])


def _read(path):
    with open(path) as fh:
        text = fh.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise WorkloadError("%s is not valid YAML: %s" % (path, e))
    try:
        return json.loads(text)
    except ValueError as e:
        raise WorkloadError("%s is not valid JSON: %s" % (path, e))


class Workload:
    """A validated workload. ``raw`` keeps the dict for extensions that read further keys."""

    def __init__(self, raw, base_dir="."):
        if not isinstance(raw, dict):
            raise WorkloadError("a workload must be a JSON/YAML object")
        self.raw = raw
        self.base_dir = base_dir
        self.name = str(raw.get("name", "workload"))
        seed = raw.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise WorkloadError("seed must be a non-negative integer, got %r" % (seed,))
        self.seed = seed
        if "duration" not in raw:
            raise WorkloadError("workload.duration (simulated seconds) is required")
        self.duration = _num(raw, "duration", None, "workload", positive=True)
        self.protocol = raw.get("protocol", "deadband")
        if not isinstance(self.protocol, str):
            raise WorkloadError("protocol must be a name, got %r" % (self.protocol,))
        params = raw.get("params", {})
        if not isinstance(params, dict):
            raise WorkloadError("params must be an object")
        self.params = params
        self.period = _num(params, "period", 10.0, "params", positive=True)
        self.shrink = _num(params, "shrink", 0.05, "params", lo=0.0)
        if self.shrink >= 1:
            raise WorkloadError("params.shrink must be < 1")
        self.beat = _num(params, "heartbeat", 0.0, "params", lo=0.0)
        net = raw.get("network", {})
        if isinstance(net, (int, float)) and not isinstance(net, bool):
            net = {"delay": net}
        if not isinstance(net, dict):
            raise WorkloadError("network must be an object or a delay in seconds")
        self.delay_up = _num(net, "uplink", _num(net, "delay", 0.0, "network", lo=0.0), "network", lo=0.0)
        self.delay_down = _num(net, "downlink", _num(net, "delay", 0.0, "network", lo=0.0), "network", lo=0.0)
        self.jitter = _num(net, "jitter", 0.0, "network", lo=0.0)
        self.latency = _num(net, "latency_tolerance", max(self.delay_up, self.delay_down) + self.jitter,
                            "network", lo=0.0)
        self._sources(raw.get("sources"))
        qs = raw.get("queries", [])
        if not isinstance(qs, list):
            raise WorkloadError("queries must be a list")
        self.queries = qs
        kinds = self.query_kinds()
        ids = set()
        for q in qs:
            try:
                parsed = parse_query(q, self.source_ids, kinds=kinds)
            except QueryError as e:
                raise WorkloadError(str(e))
            if parsed.id in ids:
                raise WorkloadError("query id %s repeats" % parsed.id)
            ids.add(parsed.id)
        self.warmup = _num(raw, "warmup", 0.0, "workload", lo=0.0)
        if self.warmup >= self.duration:
            raise WorkloadError("workload.warmup must be shorter than the duration")
        self.events = _events(raw.get("events", []), ids, set(self.source_ids), kinds)

    def query_kinds(self):
        from backend.coordinator.protocols import PROTOCOLS
        cls = PROTOCOLS.get(self.protocol)
        if cls is None:
            raise WorkloadError("unknown protocol %r; choose one of %s" % (self.protocol, ", ".join(sorted(PROTOCOLS))))
        return cls.kinds

    def _sources(self, src):
        if not isinstance(src, dict):
            raise WorkloadError('sources must be {"trace": "file.csv"}, {"dataset": "temps"} or '
                                '{"generator": ..., "count": N}')
        self.sources = src
        per = src.get("per_device", 1)
        if not isinstance(per, int) or isinstance(per, bool) or not 1 <= per <= 255:
            raise WorkloadError("sources.per_device must be an integer in 1..255")
        self.per_device = per
        out = src.get("outages")
        if out is not None:
            if not isinstance(out, dict):
                raise WorkloadError('sources.outages must be {"rate": per-device outages/s, "mean_length": s}')
            _num(out, "rate", None, "sources.outages", lo=0.0)
            _num(out, "mean_length", None, "sources.outages", positive=True)
        if "dataset" in src:
            from backend.sim.datasets import DATASETS, load_dataset
            if src["dataset"] not in DATASETS:
                raise WorkloadError("sources.dataset must be one of %s, got %r" % (", ".join(DATASETS), src["dataset"]))
            self.trace = load_dataset(src["dataset"])
            self.source_ids = sorted(set(self.trace[1]))
        elif "trace" in src:
            path = src["trace"]
            if not isinstance(path, str):
                raise WorkloadError("sources.trace must be a file path")
            if not os.path.isabs(path):
                path = os.path.join(self.base_dir, path)
            self.trace = _read_trace(path)
            self.source_ids = sorted(set(self.trace[1]))
        else:
            gen = src.get("generator")
            if gen not in GENERATORS:
                raise WorkloadError("sources.generator must be one of %s, got %r" % (", ".join(GENERATORS), gen))
            count = src.get("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise WorkloadError("sources.count must be a positive integer")
            self.trace = None
            self.source_ids = ["s%d" % i for i in range(count)]
            _pair(src, "start", 0.0, "sources")
            _pair(src, "step", 1.0, "sources")
            _pair(src, "range", [0.0, 1000.0], "sources")
            _num(src, "interval", 1.0, "sources", positive=True)
            if src.get("arrival", "periodic") not in ("periodic", "exponential"):
                raise WorkloadError("sources.arrival must be periodic or exponential")
            if src.get("steps", "binary") not in ("binary", "normal"):
                raise WorkloadError("sources.steps must be binary or normal")
            _pair(src, "drift", 0.0, "sources")
            if _pair(src, "volatility", 1.0, "sources")[0] < 0:
                raise WorkloadError("sources.volatility must be >= 0")

    def devices(self):
        """[(device id, [source ids])] grouping ``per_device`` sources per device."""
        ids = self.source_ids
        return [("d%d" % (i // self.per_device), ids[i:i + self.per_device]) for i in range(0, len(ids), self.per_device)]


def _events(evs, active, sources, kinds):
    """Validate ``events`` (queries added/removed, precisions and network delays changed while running)."""
    if not isinstance(evs, list):
        raise WorkloadError("events must be a list")
    used = set(active)
    active = set(active)
    out = []
    for n, ev in enumerate(sorted(evs, key=lambda e: e.get("time", 0) if isinstance(e, dict) else 0)):
        where = "events[%d]" % n
        if not isinstance(ev, dict):
            raise WorkloadError("%s must be an object" % where)
        t = _num(ev, "time", None, where, lo=0.0)
        what = [k for k in ("add_query", "remove_query", "set_precision", "delay") if k in ev]
        if len(what) != 1 or len(ev) != 2:
            raise WorkloadError("%s needs a time and exactly one of add_query, remove_query, set_precision, delay" % where)
        k = what[0]
        v = ev[k]
        if k == "add_query":
            try:
                q = parse_query(v, sources, kinds=kinds)
            except QueryError as e:
                raise WorkloadError("%s.add_query: %s" % (where, e))
            if q.id in used:
                raise WorkloadError("%s.add_query: query id %s was already used" % (where, q.id))
            used.add(q.id)
            active.add(q.id)
        elif k == "remove_query":
            if v not in active:
                raise WorkloadError("%s.remove_query: no running query %r" % (where, v))
            active.discard(v)
        elif k == "set_precision":
            if not isinstance(v, dict) or v.get("id") not in active:
                raise WorkloadError("%s.set_precision needs the id of a running query" % where)
            v = {"id": v["id"], "precision": _num(v, "precision", None, where + ".set_precision", lo=0.0)}
        else:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = {"delay": v}
            if not isinstance(v, dict) or not v or set(v) - {"delay", "uplink", "downlink", "jitter"}:
                raise WorkloadError("%s.delay must be seconds or {uplink, downlink, jitter}" % where)
            d = {}
            if "delay" in v:
                d["up"] = d["down"] = _num(v, "delay", None, where + ".delay", lo=0.0)
            if "uplink" in v:
                d["up"] = _num(v, "uplink", None, where + ".delay", lo=0.0)
            if "downlink" in v:
                d["down"] = _num(v, "downlink", None, where + ".delay", lo=0.0)
            if "jitter" in v:
                d["jitter"] = _num(v, "jitter", None, where + ".delay", lo=0.0)
            v = d
        out.append({"time": t, k: v})
    return out


def _read_trace(path):
    if not os.path.exists(path):
        raise WorkloadError("trace file %s does not exist" % path)
    times, names, values = [], [], []
    with open(path, newline="") as fh:
        rd = csv.reader(fh)
        header = next(rd, None)
        if header is None or [h.strip() for h in header[:3]] != ["time", "source", "value"]:
            raise WorkloadError("trace %s must start with the header time,source,value" % path)
        last = -math.inf
        for n, row in enumerate(rd, start=2):
            if not row:
                continue
            try:
                t, name, v = float(row[0]), row[1].strip(), float(row[2])
            except (ValueError, IndexError):
                raise WorkloadError("trace %s line %d: expected time,source,value, got %r" % (path, n, row))
            if not (math.isfinite(t) and math.isfinite(v)) or not name:
                raise WorkloadError("trace %s line %d: non-finite number or empty source" % (path, n))
            if t < last:
                raise WorkloadError("trace %s line %d: rows must be in time order" % (path, n))
            last = t
            times.append(t)
            names.append(name)
            values.append(v)
    if not times:
        raise WorkloadError("trace %s has no rows" % path)
    return times, names, values


def load(source):
    """Load and validate a workload from a path (JSON or YAML) or a dict."""
    if isinstance(source, dict):
        return Workload(source)
    if not os.path.exists(source):
        raise WorkloadError("workload file %s does not exist" % source)
    return Workload(_read(source), os.path.dirname(os.path.abspath(source)))


def outages(w):
    """{device: [(start, end), ...]} from ``sources.outages`` (Poisson starts, exponential lengths)."""
    spec = w.sources.get("outages")
    if not spec or spec["rate"] <= 0:
        return {}
    rng = np.random.default_rng(w.seed + 2)
    out = {}
    for dev, _ in w.devices():
        spans = []
        t = rng.exponential(1.0 / spec["rate"])
        while t < w.duration:
            length = rng.exponential(spec["mean_length"])
            spans.append((float(t), float(t + length)))
            t += length + rng.exponential(1.0 / spec["rate"])
        out[dev] = spans
    return out


def samples(w):
    """All source readings of workload ``w`` as (times, source indices, values), sorted by time."""
    if w.trace is not None:
        times, names, values = w.trace
        idx = {s: i for i, s in enumerate(w.source_ids)}
        t = np.asarray(times, dtype=float)
        keep = t <= w.duration
        return t[keep], np.asarray([idx[n] for n in names], dtype=np.int64)[keep], np.asarray(values, dtype=float)[keep]
    src = w.sources
    rng = np.random.default_rng(w.seed)
    n = len(w.source_ids)
    interval = _num(src, "interval", 1.0, "sources", positive=True)
    gen = src["generator"]
    if src.get("arrival", "periodic") == "periodic":
        steps = int(math.floor(w.duration / interval)) + 1
        t = np.repeat(np.arange(steps) * interval, n)
        s = np.tile(np.arange(n), steps)
        shape = (steps, n)
    else:
        per = int(math.ceil(w.duration / interval * 1.5)) + 10
        gaps = rng.exponential(interval, size=(per, n))
        gaps[0] = 0.0
        tt = np.cumsum(gaps, axis=0)
        shape = (per, n)
        t, s = tt.ravel(), np.tile(np.arange(n), per)
    if gen == "uniform":
        lo, hi = _pair(src, "range", [0.0, 1000.0], "sources")
        v = rng.uniform(lo, hi, size=shape)
    elif gen == "brownian":
        # drifted Brownian motion (Zhu §4.2 Eq. 4): per-source μ and σ, increments over the real gaps
        a, b = _pair(src, "start", 0.0, "sources")
        start = rng.uniform(a, b, size=n)
        mu = rng.uniform(*_pair(src, "drift", 0.0, "sources"), size=n)
        sigma = rng.uniform(*_pair(src, "volatility", 1.0, "sources"), size=n)
        gap = np.diff(t.reshape(shape), axis=0, prepend=0.0)
        d = mu * gap + sigma * np.sqrt(gap) * rng.normal(0.0, 1.0, size=shape)
        v = start + np.cumsum(d, axis=0)
    else:
        a, b = _pair(src, "start", 0.0, "sources")
        start = rng.uniform(a, b, size=n)
        sa, sb = _pair(src, "step", 1.0, "sources")
        step = rng.uniform(sa, sb, size=n)
        if src.get("steps", "binary") == "normal":
            d = rng.normal(0.0, 1.0, size=shape) * step
        else:
            d = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0) * step
        d[0] = 0.0
        v = start + np.cumsum(d, axis=0)
    v = v.ravel()
    order = np.argsort(t, kind="stable")
    t, s, v = t[order], s[order], v[order]
    keep = t <= w.duration
    return t[keep], s[keep], v[keep]
